"""molcap what-if dashboard, the Overview page: `molcap app` (or `streamlit run app/main.py`).

The sidebar (app/layout.py) holds the open scenario and its knobs; each script under
app/pages/ is one more view of the planner's answers for it. This page says what the plan
recommends, then shows the headline charts of the what-if simulation.
"""

from __future__ import annotations

import streamlit as st

from app import compute, layout, state
from planner.jobs.dashboard import pricing, recommendation, stored_plan
from planner.outputs.plan_figures import sim_latency_figure
from planner.outputs.sim_figures import throughput_figure

SUMMARY_COLUMNS = (
    "strategy", "turns_per_s", "output_tokens_per_s", "goodput_turns_per_s", "slo_attainment",
    "ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "misroute_rate", "num_preemptions",
    "num_replay_tokens", "num_recomputed_tokens")


def main() -> None:
    """The Overview page."""
    scenario, problems, whatif = layout.page("Overview")
    scenario = layout.require(scenario, problems)
    st.title(f"molcap what-if: {scenario.name}")
    st.caption(scenario.description.strip() or state.source())
    if whatif is None:
        st.info("Pick at least one strategy in the sidebar.")
        return
    sim = compute.simulate(whatif)
    plan = stored_plan(scenario, state.out_root())
    lines = recommendation(whatif, sim, plan if not plan.plans.empty else None)
    for i, line in enumerate(lines):
        (st.success if i == 0 else st.info)(line)
    if plan.plans.empty:
        st.caption("No capacity plan for this exact scenario yet: run it on the Capacity plan "
                   "page (or `molcap run`). The lines above come from the what-if simulation "
                   "on the scenario's own hardware.")
    priced = pricing(scenario, state.scenarios_dir())
    st.caption(f"Priced by {priced['description']}"
               + ("" if priced["profile"] else " — assumed defaults, not measured")
               + ". See the Calibration page.")
    for label, error in sim.errors.items():
        st.error(f"{label}: simulation failed: {error}")
    if sim.summary.empty:
        return
    left, right = st.columns(2)
    left.plotly_chart(throughput_figure(sim.summary), width="stretch")
    right.plotly_chart(sim_latency_figure(sim.summary), width="stretch")
    st.dataframe(sim.summary[[c for c in SUMMARY_COLUMNS if c in sim.summary]],
                 hide_index=True, key="overview_summary")


main()
