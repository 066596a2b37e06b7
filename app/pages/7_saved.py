"""Saved runs & sweeps: open an out/<name>/ folder and browse its tables and charts (read back,
never recomputed)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import layout, state
from planner.outputs.plan_figures import (
    COMPARISON_FIGURES,
    pareto_figure,
    plan_figure,
    sweep_figure,
)
from planner.outputs.saved import list_output_folders, load_output_folder, sweep_parameters
from planner.outputs.sim_figures import latency_cdf_figure, throughput_figure


def _run(tables: dict) -> None:
    plans = tables.get("plans")
    if plans is not None and not plans.empty:
        st.subheader("Capacity plan")
        if plans["is_feasible"].astype(bool).any():
            st.plotly_chart(plan_figure(plans), width="stretch", key="saved_plan")
        st.dataframe(plans, hide_index=True)
    trials = tables.get("plan_trials")
    if trials is not None and not trials.empty and "e2e_p99_s" in trials:
        st.plotly_chart(pareto_figure(trials), width="stretch", key="saved_pareto")
    summary = tables.get("sim_summary")
    if summary is not None and not summary.empty:
        st.subheader("Simulation")
        st.plotly_chart(throughput_figure(summary), width="stretch", key="saved_tput")
        turns = tables.get("sim_turns")
        if turns is not None and not turns.empty:
            st.plotly_chart(latency_cdf_figure(turns, "ttft_s"), width="stretch",
                            key="saved_cdf")
    for name, builder in COMPARISON_FIGURES.items():
        if name in tables and not tables[name].empty:
            st.plotly_chart(builder(tables[name]), width="stretch", key=f"saved_{name}")
    name = st.selectbox("table", sorted(tables), key="saved_table")
    st.dataframe(tables[name], hide_index=True)


def _sweep(table) -> None:
    params = sweep_parameters(table) or [c for c in table.columns if c not in ("strategy",)][:1]
    metrics = [c for c in table.columns if c not in (*params, "point", "strategy")
               and table[c].dtype.kind in "if"]
    left, right = st.columns(2)
    param = left.selectbox("x: varied field", params, key="sweep_param")
    metric = right.selectbox("y: metric", metrics, key="sweep_metric",
                             index=metrics.index("ttft_p99_s") if "ttft_p99_s" in metrics
                             else 0)
    others = [p for p in params if p != param]
    st.plotly_chart(sweep_figure(table, param, metric, others[0] if others else None),
                    width="stretch", key="sweep_fig")
    st.dataframe(table, hide_index=True)


def main() -> None:
    """The Saved runs & sweeps page."""
    layout.page("Saved runs & sweeps")
    st.title("Saved runs & sweeps")
    root = state.out_root()
    folders = list_output_folders(root)
    typed = st.text_input("folder", placeholder=f"{root}/<name>", key="saved_path")
    options = [str(p) for p in folders]
    chosen = typed or st.selectbox(f"or pick one under {root}/", options, key="saved_pick",
                                   index=0 if options else None)
    if not chosen:
        st.info(f"Nothing under {root}/ yet: `molcap run scenarios/default.yaml` or `molcap "
                "sweep scenarios/sweeps/switch_vs_context.yaml` writes there.")
        return
    try:
        folder = load_output_folder(Path(chosen))
    except FileNotFoundError as err:
        st.error(str(err))
        return
    st.caption(f"{folder.kind} at `{folder.path}`: {len(folder.tables)} tables, "
               f"{folder.num_points} stored points.")
    if folder.report_path is not None:
        st.download_button("Download its HTML report", folder.report_path.read_bytes(),
                           file_name=f"{folder.path.name}-report.html", mime="text/html",
                           icon=":material/download:")
    if folder.kind == "sweep":
        _sweep(folder.tables["sweep"])
    elif folder.tables:
        _run(folder.tables)


main()
