"""Planner calls behind `st.cache_data`, keyed by the scenario's content, with progress shown.

A cache hit answers at once; a miss runs the planner (which also reuses the points `molcap run`
or an earlier session finished under out/<name>/points). Strategies are simulated one point at
a time so the progress bar moves between them (a cached function must not draw).
"""

from __future__ import annotations

import streamlit as st

from app import state
from planner.analysis import run_comparisons
from planner.dashboard import SimTables, sim_tables, simulate_one
from planner.scenario import Scenario


@st.cache_data(show_spinner=False, max_entries=256)
def _point(scenario_json: str, index: int, out_root: str) -> dict:
    return simulate_one(Scenario.model_validate_json(scenario_json), index, out_root)


@st.cache_data(show_spinner=False, max_entries=32)
def _tables(scenario_json: str, out_root: str) -> SimTables:
    records = {}
    for i in range(len(Scenario.model_validate_json(scenario_json).strategies)):
        records.update(_point(scenario_json, i, out_root))
    return sim_tables(records)


def simulate(scenario: Scenario) -> SimTables:
    """Every strategy of `scenario` simulated, with a progress bar while it runs."""
    text, out = scenario.model_dump_json(), state.out_root()
    bar = st.empty()
    total = len(scenario.strategies)
    for i, strategy in enumerate(scenario.strategies):
        bar.progress(i / total, text=f"simulating {strategy.label} ({i + 1} of {total}; "
                     f"{scenario.workload.kind} workload, results are cached)")
        _point(text, i, out)
    bar.empty()
    return _tables(text, out)


@st.cache_data(show_spinner="computing the analytical comparisons...", max_entries=32)
def _comparisons(scenario_json: str) -> dict:
    return run_comparisons(Scenario.model_validate_json(scenario_json))


def comparisons(scenario: Scenario) -> dict:
    """The analytical comparisons (switch cost, routing share, KV, memory) of `scenario`."""
    return _comparisons(scenario.model_dump_json())
