"""Latency & throughput: per strategy throughput and goodput, percentiles, CDFs, time split."""

from __future__ import annotations

import streamlit as st

from app import compute, layout
from planner.outputs.interval_columns import summary_intervals
from planner.outputs.plan_figures import sim_latency_figure
from planner.outputs.plan_table import people_summary_table
from planner.outputs.sim_figures import (
    hop_breakdown_figure,
    latency_cdf_figure,
    switch_cost_figure,
    throughput_figure,
)

METRICS = {"time to first token": "ttft_s", "time per output token": "tpot_s",
           "end-to-end per turn": "e2e_s"}


def main() -> None:
    """The Latency & throughput page."""
    scenario, problems, whatif = layout.page("Latency & throughput")
    scenario = layout.require(scenario, problems)
    st.title("Latency & throughput")
    if whatif is None:
        st.info("Pick at least one strategy in the sidebar.")
        return
    sim = compute.simulate(whatif)
    for label, error in sim.errors.items():
        st.error(f"{label}: simulation failed: {error}")
    if sim.summary.empty:
        return
    st.caption(f"{int(sim.summary['num_turns'].iloc[0])} turns simulated per strategy on the "
               "scenario's own hardware; hover any bar or line for its numbers.")
    charted = summary_intervals(sim.summary, scenario)
    left, right = st.columns(2)
    left.plotly_chart(throughput_figure(charted), width="stretch")
    right.plotly_chart(sim_latency_figure(charted), width="stretch")
    metric = st.radio("distribution of", list(METRICS), horizontal=True, key="cdf_metric")
    left, right = st.columns(2)
    left.plotly_chart(latency_cdf_figure(sim.turns, METRICS[metric]), width="stretch")
    right.plotly_chart(hop_breakdown_figure(sim.turns), width="stretch")
    st.plotly_chart(switch_cost_figure(sim.turns), width="stretch")
    st.caption("Each value with its interval where the profile that priced it has a measured "
               "error; a value alone: no measured error.")
    st.dataframe(people_summary_table(charted), hide_index=True, key="latency_summary")
    layout.raw_downloads("sim_summary", sim.summary, "latency_raw")


main()
