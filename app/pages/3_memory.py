"""KV & adapters: KV blocks over time (per adapter copy vs shared), adapter slots, churn,
preemptions, and each strategy's per-GPU memory split."""

from __future__ import annotations

import streamlit as st

from app import compute, layout
from planner.outputs.people_columns import people_table
from planner.outputs.sim_figures import (
    adapter_activity_figure,
    adapter_residency_figure,
    kv_namespace_figure,
    timeseries_figure,
)
from sim.strategies.registry import get_strategy


def main() -> None:
    """The KV & adapters page."""
    scenario, problems, whatif = layout.page("KV & adapters")
    layout.require(scenario, problems)
    st.title("KV memory & adapters")
    if whatif is None:
        st.info("Pick at least one strategy in the sidebar.")
        return
    sim = compute.simulate(whatif)
    if sim.timeseries.empty:
        st.warning("No simulation samples to show.")
        return
    left, right = st.columns(2)
    left.plotly_chart(timeseries_figure(sim.timeseries, "kv_blocks_used"), width="stretch")
    right.plotly_chart(timeseries_figure(sim.timeseries, "num_preemptions"), width="stretch")
    labels = list(sim.summary["strategy"])
    reference = {s.label for s in whatif.strategies if get_strategy(s.kind).is_reference}
    first = next((i for i, s in enumerate(labels) if s not in reference), 0)
    label = st.selectbox("KV copies and adapters of", labels, index=first, key="memory_strategy")
    kv = sim.kv_by_namespace[sim.kv_by_namespace["strategy"] == label]
    left, right = st.columns(2)
    if kv.empty:
        left.info(f"{label} held no KV blocks at the sampled instants.")
    else:
        left.plotly_chart(kv_namespace_figure(kv), width="stretch")
        right.plotly_chart(adapter_activity_figure(kv), width="stretch")
    series = sim.timeseries[sim.timeseries["strategy"] == label]
    if "resident_adapter_mask" in series and series["resident_adapter_mask"].any():
        replica = int(series["replica"].min())
        st.plotly_chart(adapter_residency_figure(series[series["replica"] == replica]),
                        width="stretch", key="residency")
    left, right = st.columns(2)
    left.plotly_chart(timeseries_figure(sim.timeseries, "num_resident_adapters"),
                      width="stretch")
    right.plotly_chart(timeseries_figure(sim.timeseries, "num_adapter_loads"), width="stretch")
    st.subheader("Memory of one replica, per GPU")
    memory = compute.comparisons(scenario)["memory_summary"]
    st.dataframe(people_table(memory), hide_index=True, key="memory_table")
    layout.raw_downloads("memory_summary", memory, "memory_raw")


main()
