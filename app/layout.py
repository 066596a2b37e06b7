"""What every page draws first: the page setup and the sidebar (navigation, scenario, knobs).

Pages are Streamlit's `pages/` folder next to `main.py`; each starts with `page(title)`, which
returns the open scenario and the what-if variant the knobs describe.
"""

from __future__ import annotations

import streamlit as st

from app import knobs, state
from planner.scenario.schema import Scenario

PAGES = (
    ("main.py", "Overview", ":material/dashboard:"),
    ("pages/1_scenario.py", "Scenario", ":material/edit_document:"),
    ("pages/2_latency.py", "Latency & throughput", ":material/speed:"),
    ("pages/3_memory.py", "KV & adapters", ":material/memory:"),
    ("pages/4_switching.py", "Switching & routing", ":material/alt_route:"),
    ("pages/5_plan.py", "Capacity plan", ":material/payments:"),
    ("pages/6_compare.py", "Compare variants", ":material/compare:"),
    ("pages/7_saved.py", "Saved runs & sweeps", ":material/folder_open:"),
    ("pages/8_calibration.py", "Calibration", ":material/tune:"),
)
"""(script relative to app/, title, icon) of every page, in the sidebar's order."""


def page(title: str) -> tuple[Scenario | None, list[str], Scenario | None]:
    """Set up a page; returns (open scenario or None, its located errors, what-if variant)."""
    st.set_page_config(page_title=f"molcap: {title}", page_icon=":material/dns:",
                       layout="wide")
    state.ensure_open()
    knobs.keep_state()
    with st.sidebar:
        for script, label, icon in PAGES:
            st.page_link(script, label=label, icon=icon)
        st.divider()
        knobs.scenario_picker_ui()
        scenario, problems = state.current()
        labels, max_turns = knobs.knobs_ui(scenario, problems)
    whatif = knobs.whatif_scenario(scenario, labels, max_turns) if scenario else None
    return scenario, problems, whatif


def require(scenario: Scenario | None, problems: list[str]) -> Scenario:
    """The valid open scenario; otherwise show its located errors and stop this page."""
    if scenario is None:
        st.error("The scenario does not validate; fix it on the Scenario page:\n\n"
                 + "\n".join(f"- `{m}`" for m in problems))
        st.stop()
    return scenario


def raw_downloads(name: str, table, key: str) -> None:
    """The raw table (every column, unrounded) as CSV and parquet downloads: the tables shown
    are for people, the files for further work."""
    left, right = st.columns(2)
    left.download_button(f"{name}.csv", table.to_csv(index=False), file_name=f"{name}.csv",
                         mime="text/csv", icon=":material/download:", key=f"{key}_csv")
    right.download_button(f"{name}.parquet", table.to_parquet(index=False),
                          file_name=f"{name}.parquet", mime="application/octet-stream",
                          icon=":material/download:", key=f"{key}_parquet")
