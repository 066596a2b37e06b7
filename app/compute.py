"""Planner calls behind `st.cache_data`, keyed by the scenario's content, with progress shown.

A cache hit answers at once; a miss runs the planner (which also reuses the points `molcap run`
or an earlier session finished under out/<name>/points). A new scenario's strategies are
simulated outside any cached function (a cached function must not draw,
and the progress bar moves as each finishes), then read back from the store.
"""

from __future__ import annotations

import streamlit as st

from app import state
from planner.jobs.dashboard import SimTables, is_simulated, simulate_scenario
from planner.predict.analysis import run_comparisons
from planner.scenario.schema import Scenario

WORKERS = 1
"""Processes a what-if simulation runs on. The strategies are independent points, but on a
2-core machine with other load two processes were slower than one (`bench/bench_app.py`
measures both): raise it where cores are free."""


@st.cache_data(show_spinner=False, max_entries=32)
def _tables(scenario_json: str, out_root: str) -> SimTables:
    return simulate_scenario(Scenario.model_validate_json(scenario_json), out_root)


def simulate(scenario: Scenario) -> SimTables:
    """Every strategy of `scenario` simulated, with a progress bar while it runs: a scenario
    not in the store yet is simulated on WORKERS processes first, then read back (cached)."""
    text, out = scenario.model_dump_json(), state.out_root()
    if not is_simulated(scenario, out):
        bar = st.progress(0.0, text=f"simulating {len(scenario.strategies)} strategies "
                          f"({scenario.workload.kind} workload; results are kept)...")

        def on_progress(done: int, total: int) -> None:
            bar.progress(done / total, text=f"simulating: {done} of {total} strategies done")

        simulate_scenario(scenario, out, on_progress, num_workers=WORKERS)
        bar.empty()
    return _tables(text, out)


@st.cache_data(show_spinner="computing the analytical comparisons...", max_entries=32)
def _comparisons(scenario_json: str) -> dict:
    return run_comparisons(Scenario.model_validate_json(scenario_json))


def comparisons(scenario: Scenario) -> dict:
    """The analytical comparisons (switch cost, routing share, KV, memory) of `scenario`."""
    return _comparisons(scenario.model_dump_json())
