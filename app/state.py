"""The dashboard's session: which scenario text is open, and the validated scenario it gives.

The YAML text is the one source of truth. The form knobs and the editor both write into it, and
every page reads the scenario back through `current()`, validated by `planner.scenario.loading`
exactly as `molcap validate` validates a file (same located messages).
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from planner.scenario.loading import ScenarioError, scenario_from_file_text
from planner.scenario.schema import Scenario

DEFAULT_SCENARIO = "scenarios/default.yaml"
TEXT, SOURCE = "scenario_text", "scenario_source"


def scenarios_dir() -> Path:
    """The scenarios/ folder of the working directory, else the one shipped with the code."""
    here = Path("scenarios")
    return here if here.is_dir() else Path(__file__).resolve().parents[1] / "scenarios"


def scenario_files() -> list[str]:
    """Scenario files to pick from, as `molcap validate` would be given them."""
    root = scenarios_dir()
    shown = Path("scenarios") if root == Path("scenarios") else root
    return [str(shown / p.name) for p in sorted(root.glob("*.yaml"))]


def out_root() -> str:
    """Where runs keep their points and tables (`molcap app --out`, default out/)."""
    return os.environ.get("MOLCAP_OUT", "out")


def open_text(text: str, source: str) -> None:
    """Make `text` (read from `source`) the open scenario."""
    st.session_state[TEXT] = text
    st.session_state[SOURCE] = source


def open_file(path: str) -> None:
    """Open a scenario file."""
    open_text(Path(path).read_text(encoding="utf-8"), path)


def ensure_open() -> None:
    """Open the default scenario on a fresh session."""
    if TEXT not in st.session_state:
        files = scenario_files()
        default = next((f for f in files if f.endswith("default.yaml")), files[0])
        open_file(default)


def text() -> str:
    """The open scenario's YAML text."""
    ensure_open()
    return st.session_state[TEXT]


def source() -> str:
    """Where the open scenario came from (a file path or an upload's name)."""
    ensure_open()
    return st.session_state[SOURCE]


def validate(text: str, source: str) -> Scenario:
    """`text` as `molcap validate` and `molcap run` read it from `source`: the same located
    errors, relative paths (trace, profile) resolved against the file's folder (scenarios/ for
    an upload), the named files checked."""
    folder = Path(source).parent if Path(source).is_file() else scenarios_dir()
    return scenario_from_file_text(text, source, folder)


@st.cache_data(show_spinner=False, max_entries=64)
def _validate(text: str, source: str) -> tuple[Scenario | None, list[str]]:
    try:
        return validate(text, source), []
    except ScenarioError as err:
        return None, err.messages


def current() -> tuple[Scenario | None, list[str]]:
    """The open scenario validated, or None and its located error messages."""
    return _validate(text(), source())
