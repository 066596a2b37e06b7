"""Capacity plan: the cheapest deployment per strategy within the SLOs, runner-ups, the Pareto
front, and why a strategy has no plan. The search runs in a child process that can be
cancelled; finished strategies are kept in the same store as `molcap run`."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import layout, state
from planner.jobs.dashboard import PlanJob, PlanTables, plan_headline, stored_plan
from planner.outputs.interval_columns import plan_intervals
from planner.outputs.plan_figures import pareto_figure, plan_figure, plan_latency_figure
from planner.outputs.plan_table import people_plan_table
from planner.predict.intervals import DEFAULT_CONFIDENCE, pricing_errors

JOB = "plan_job"


@st.fragment(run_every=1.0)
def _progress(job: PlanJob) -> None:
    done, total = job.progress()
    st.progress(done / max(total, 1), text=f"capacity search: {done} of {total} strategies done "
                "(finished ones are kept if you cancel)")
    if st.button("Cancel the search", icon=":material/cancel:", key="plan_cancel"):
        job.cancel()
        st.rerun()
    if not job.is_running:
        st.rerun()


def _controls(scenario) -> PlanJob | None:
    job = st.session_state.get(JOB)
    running = job is not None and job.is_running and job.scenario == scenario
    if not running and st.button("Run the capacity search", type="primary",
                                 icon=":material/play_arrow:", key="plan_run"):
        if job is not None:
            job.cancel()
        job = st.session_state[JOB] = PlanJob(scenario, state.out_root())
        running = True
    if running:
        _progress(job)
    return job


def _show(scenario, plan: PlanTables) -> None:
    plans = plan.plans
    feasible = plans[plans["is_feasible"].astype(bool)]
    headline = plan_headline(scenario, plan)
    if headline:
        st.success(headline)
    confidence = scenario.search.confidence or DEFAULT_CONFIDENCE
    gpus = {*feasible.get("gpu", pd.Series()).dropna(),
            *plan.runner_ups.get("gpu", pd.Series()).dropna()}
    errors = {gpu: pricing_errors(scenario, gpu) for gpu in gpus}
    if not feasible.empty:
        left, right = st.columns(2)
        left.plotly_chart(plan_figure(plans), width="stretch")
        right.plotly_chart(plan_latency_figure(plan_intervals(plans, scenario)), width="stretch")
        st.caption(f"Each value with its {confidence:.0%} interval: the seeds' spread widened "
                   "by the measured error of the profile that priced it ('seeds': the spread "
                   "alone; a value alone or 'no measured error': the profile's validation does "
                   "not measure it).")
        st.dataframe(people_plan_table(feasible, errors, confidence), hide_index=True,
                     key="plan_table")
        layout.raw_downloads("plans", plan_intervals(plans, scenario), "plan_raw")
    for row in plans[~plans["is_feasible"].astype(bool)].to_dict(orient="records"):
        reasons = "\n".join(f"- {r}" for r in row["candidate_reasons"] if r)
        st.warning(f"**{row['strategy']}: no plan.** Why, per candidate:\n\n{reasons}")
    if not plan.trials.empty:
        st.plotly_chart(pareto_figure(plan_intervals(plan.trials, scenario)),
                        width="stretch", key="plan_pareto")
    if not plan.runner_ups.empty:
        with st.expander(f"runner-ups ({len(plan.runner_ups)})"):
            st.dataframe(people_plan_table(plan.runner_ups.assign(is_feasible=True), errors,
                                           confidence), hide_index=True)
    for key, error in plan.errors.items():
        st.error(f"{key}: {error}")


def main() -> None:
    """The Capacity plan page."""
    scenario, problems, whatif = layout.page("Capacity plan")
    scenario = layout.require(scenario, problems)
    st.title("Capacity plan")
    if whatif is not None and len(whatif.strategies) < len(scenario.strategies):
        scenario = scenario.model_copy(update=dict(strategies=whatif.strategies))
    s = scenario.search
    st.caption(f"Per strategy: the cheapest deployment over GPUs {list(s.gpus or [])} x TP "
               f"{list(s.tensor_parallel_sizes or [])} (up to {s.max_num_replicas} replicas) "
               f"that serves the workload's rate within the SLOs, by simulation "
               f"({s.max_turns_per_evaluation} turns and {s.num_seeds} seeds a point). "
               "`molcap run` computes the same plan and both reuse each other's results.")
    _controls(scenario)
    plan = stored_plan(scenario, state.out_root())
    if plan.plans.empty:
        st.info("No strategy has a finished plan for this scenario yet.")
        return
    if plan.num_missing:
        st.caption(f"{plan.num_missing} strategies still without a finished plan.")
    _show(scenario, plan)


main()
