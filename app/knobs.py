"""The sidebar: pick or upload a scenario, and the main what-if knobs as form widgets.

Each knob writes its field into the open scenario's YAML text (`planner.scenario.editing`), so the
editor, the download and every page see the same scenario; a knob whose value the scenario
rejects shows the located message under it.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import state
from planner.jobs.dashboard import WHATIF_MAX_TURNS, select_strategies, whatif_cut
from planner.scenario.editing import (
    field_spec,
    field_value,
    num_adapters,
    set_field,
    set_num_adapters,
)
from planner.scenario.loading import ScenarioError
from planner.scenario.schema import Scenario
from planner.search.strategy_plan import gpu_specs

WORKLOAD_KNOBS = {
    "conversations": (
        ("workload.arrival_rate_per_s", "arrival rate (conversations/s)"),
        ("workload.switch_probability", "domain switch probability per turn"),
        ("workload.num_initial_context_tokens", "initial context (tokens)"),
        ("workload.num_reply_tokens", "reply length (tokens)"),
        ("workload.num_turns", "turns per conversation"),
    ),
    "punica": (
        ("workload.arrival_rate_per_s", "arrival rate (requests/s)"),
        ("workload.num_adapters", "adapters in the request mix"),
        ("workload.max_prompt_tokens", "longest prompt (tokens)"),
        ("workload.num_output_tokens", "reply length (tokens)"),
    ),
    "trace": (
        ("workload.rate_scale", "arrival-rate scale (x trace)"),
        ("workload.length_scale", "length scale (x trace)"),
    ),
}
"""The main what-if fields per workload kind: (dotted path, label with unit)."""

HARDWARE_KNOBS = (("hardware.num_replicas", "replicas"),)
TP_SIZES = (1, 2, 4, 8, 16)
KEY = "knob:"


def _paths(scenario: Scenario) -> list[str]:
    return [p for p, _ in WORKLOAD_KNOBS[scenario.workload.kind] + HARDWARE_KNOBS]


def keep_state() -> None:
    """Keep the knobs' values when the user moves to another page (Streamlit drops the state of
    widgets a page run did not draw; reassigning a key marks it as the app's own)."""
    for key in list(st.session_state):
        if str(key).startswith(KEY):
            st.session_state[key] = st.session_state[key]


def _sync(scenario: Scenario) -> None:
    """Set every knob to the scenario's value when the text changed by other means."""
    if st.session_state.get("_knobs_text") == state.text():
        return
    for path in _paths(scenario) + ["hardware.gpu", "hardware.tensor_parallel_size"]:
        value = field_value(scenario, path)
        st.session_state[KEY + path] = value if not isinstance(value, dict) else value["name"]
    st.session_state[KEY + "adapters"] = num_adapters(scenario)
    labels = [s.label for s in scenario.strategies]
    if set(st.session_state.get(KEY + "strategies") or []) - set(labels) or \
            st.session_state.get("_knobs_labels") != labels:
        st.session_state[KEY + "strategies"] = labels
        st.session_state["_knobs_labels"] = labels
    st.session_state["_knobs_text"] = state.text()


def _write(path: str) -> None:
    value = st.session_state[KEY + path]
    try:
        text = state.text()
        if path == "hardware.tensor_parallel_size":
            text = set_field(text, "hardware.num_gpus_per_replica", value)
        state.open_text(set_field(text, path, value), state.source())
    except ScenarioError:
        pass  # the text is not YAML: its located error is already shown; nothing to edit


def _write_adapters() -> None:
    try:
        text = set_num_adapters(state.text(), int(st.session_state[KEY + "adapters"]))
    except ScenarioError:
        return
    state.open_text(text, state.source())


def _field_errors(path: str, problems: list[str]) -> None:
    for message in problems:
        if f": {path}:" in message or f": {path}." in message:
            st.error(message, icon=None)


def _number(scenario: Scenario, path: str, label: str) -> None:
    spec = field_spec(scenario, path)
    value = st.session_state.get(KEY + path)
    is_int = isinstance(value, int) and not isinstance(value, bool)
    low = spec.get("ge", spec.get("gt"))
    kwargs = dict(min_value=(int(low) if is_int else float(low)) if low is not None else None,
                  max_value=spec.get("le"), help=spec["description"], key=KEY + path,
                  on_change=_write, args=(path,))
    if path.endswith("probability"):
        st.slider(label, 0.0, 1.0, step=0.05, key=KEY + path, on_change=_write, args=(path,),
                  help=spec["description"])
    elif is_int:
        st.number_input(label, step=1, **kwargs)
    else:
        step = max(float(value or 1) / 10, 1e-3)
        st.number_input(label, step=step, format="%g", **kwargs)


def scenario_picker_ui() -> None:
    """Pick a scenario file from scenarios/ or upload one."""
    files = state.scenario_files()
    current = state.source()
    st.selectbox("scenario file", files, index=files.index(current) if current in files else None,
                 key="picker", placeholder=current,
                 on_change=lambda: state.open_file(st.session_state["picker"]))
    upload = st.file_uploader("or upload a scenario (YAML)", type=["yaml", "yml"], key="upload")
    if upload is not None and st.session_state.get("_uploaded") != upload.file_id:
        st.session_state["_uploaded"] = upload.file_id
        state.open_text(upload.getvalue().decode("utf-8", "replace"), Path(upload.name).name)
        st.rerun()


def knobs_ui(scenario: Scenario | None, problems: list[str]) -> tuple[list[str], int]:
    """The what-if knobs; returns the strategies to compare and the turns simulated each. While
    the text does not validate, the knobs keep the last valid scenario's shape and show the
    located errors under the fields they concern."""
    if scenario is not None:
        st.session_state["_last_valid"] = scenario
        _sync(scenario)
    else:
        st.error("The scenario does not validate (details on the Scenario page).")
        scenario = st.session_state.get("_last_valid")
        if scenario is None:
            return [], WHATIF_MAX_TURNS
    st.subheader("Workload")
    for path, label in WORKLOAD_KNOBS[scenario.workload.kind]:
        _number(scenario, path, label)
        _field_errors(path, problems)
    if num_adapters(scenario):
        st.number_input("domain adapters per strategy", 1, 64, step=1, key=KEY + "adapters",
                        on_change=_write_adapters,
                        help="Adapters each adapter strategy serves; extra ones copy the first.")
    st.subheader("Hardware")
    gpus = sorted(gpu_specs(scenario))
    st.selectbox("GPU kind", gpus, key=KEY + "hardware.gpu", on_change=_write,
                 args=("hardware.gpu",), help=field_spec(scenario, "hardware.gpu")["description"])
    tp_sizes = sorted({*TP_SIZES, scenario.hardware.tensor_parallel_size})
    st.selectbox("GPUs per replica (tensor parallel)", tp_sizes,
                 key=KEY + "hardware.tensor_parallel_size", on_change=_write,
                 args=("hardware.tensor_parallel_size",))
    for path, label in HARDWARE_KNOBS:
        _number(scenario, path, label)
    _field_errors("hardware", problems)
    st.subheader("Strategies")
    labels = st.multiselect("compare", [s.label for s in scenario.strategies],
                            key=KEY + "strategies")
    st.session_state.setdefault(KEY + "max_turns", WHATIF_MAX_TURNS)
    turns = st.select_slider("turns simulated per strategy", (100, 200, 300, 600, 1200, 2400),
                             key=KEY + "max_turns",
                             help="The what-if simulates this cut of the workload, at its rate.")
    return labels, int(turns)


def whatif_scenario(scenario: Scenario, labels: list[str], max_turns: int) -> Scenario | None:
    """The scenario the what-if pages simulate: the chosen strategies on a cut of the workload."""
    if not labels:
        return None
    return select_strategies(whatif_cut(scenario, max_turns), labels)
