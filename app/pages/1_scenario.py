"""Scenario: edit the open scenario's YAML, see its located errors inline, download it."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import layout, state

EDITOR = "editor"


def _on_edit() -> None:
    state.open_text(st.session_state[EDITOR], state.source())


def _excerpt(text: str, message: str) -> str | None:
    """The lines around the one a located message points at, numbered, the line marked."""
    parts = message.split(":", 2)
    if len(parts) < 3 or not parts[1].strip().isdigit():
        return None
    line, lines = int(parts[1]), text.split("\n")
    rows = [f"{'>' if n == line else ' '}{n:4d} | {lines[n - 1]}"
            for n in range(max(1, line - 2), min(len(lines), line + 2) + 1)]
    return "\n".join(rows)


def main() -> None:
    """The Scenario page."""
    scenario, problems, _ = layout.page("Scenario")
    st.title("Scenario")
    st.caption(f"Open: `{state.source()}`. Pick another file or upload one in the sidebar; the "
               "knobs there edit this text too. Checked exactly as `molcap validate` checks a "
               "file.")
    if st.session_state.get(EDITOR) != state.text():
        st.session_state[EDITOR] = state.text()
    left, right = st.columns([3, 2])
    with left:
        st.text_area("scenario YAML", key=EDITOR, height=640, on_change=_on_edit,
                     help="Edit and press Ctrl+Enter (or click outside) to apply.")
    with right:
        if problems:
            st.error(f"{len(problems)} problem(s); nothing is simulated until they are fixed.")
            for message in problems:
                st.markdown(f"`{message}`")
                excerpt = _excerpt(state.text(), message)
                if excerpt:
                    st.code(excerpt, language=None)
        else:
            hw = scenario.hardware
            st.success(f"valid: {len(scenario.strategies)} strategies, "
                       f"{scenario.workload.kind} workload, {hw.num_replicas} x "
                       f"{hw.num_gpus_per_replica} {hw.gpu_spec.name}")
        name = Path(state.source()).stem or "scenario"
        st.download_button("Download this scenario (YAML)", state.text(),
                           file_name=f"{name}.yaml", mime="application/x-yaml",
                           icon=":material/download:")


main()
