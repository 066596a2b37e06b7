"""Switching & routing: the analytical comparisons (switch cost vs context, routing share vs
reply length and decision frequency, KV per conversation, decode step vs adapter mix)."""

from __future__ import annotations

import streamlit as st

from app import compute, layout
from planner.outputs.people_columns import people_table
from planner.outputs.plan_figures import COMPARISON_FIGURES

TITLES = {
    "switch_cost": "Cost of one domain switch vs context",
    "routing_vs_reply_length": "Routing share vs reply length",
    "routing_vs_decision_frequency": "Routing and switching share vs decision frequency",
    "kv_per_conversation": "KV memory per conversation",
    "decode_step_vs_adapters": "Decode step vs adapter mix",
}


def main() -> None:
    """The Switching & routing page."""
    scenario, problems, _ = layout.page("Switching & routing")
    scenario = layout.require(scenario, problems)
    st.title("Switching & routing")
    st.caption("Priced analytically by the cost model on the scenario's hardware (no "
               "simulation); the grids come from the scenario's `analysis` section. No "
               "validation measures these numbers: no measured error, no interval.")
    tables = compute.comparisons(scenario)
    for name, title in TITLES.items():
        if name not in tables or tables[name].empty:
            continue
        st.plotly_chart(COMPARISON_FIGURES[name](tables[name]), width="stretch", key=name)
        with st.expander(f"{title}: table"):
            st.dataframe(people_table(tables[name]), hide_index=True, key=f"{name}_table")
            layout.raw_downloads(name, tables[name], f"{name}_raw")


main()
