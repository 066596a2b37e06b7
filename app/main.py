"""molcap what-if dashboard, the Overview page: `molcap app` (or `streamlit run app/main.py`).

The sidebar (app/layout.py) holds the open scenario and its knobs; each script under
app/pages/ is one more view of the planner's answers for it. This page says what the plan
recommends, then shows the headline charts of the what-if simulation.
"""

from __future__ import annotations

import streamlit as st

from app import compute, layout, state
from planner.jobs.dashboard import pricing, recommendation, stored_plan
from planner.outputs.interval_columns import summary_intervals
from planner.outputs.plan_figures import sim_latency_figure
from planner.outputs.plan_table import people_summary_table
from planner.outputs.sim_figures import throughput_figure


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
    charted = summary_intervals(sim.summary, scenario)
    left, right = st.columns(2)
    left.plotly_chart(throughput_figure(charted), width="stretch")
    right.plotly_chart(sim_latency_figure(charted), width="stretch")
    st.dataframe(people_summary_table(charted), hide_index=True, key="overview_summary")


main()
