"""Saved runs & sweeps: open an out/<name>/ folder and browse its tables and charts (read back,
never recomputed). The intervals are the ones `molcap run` and `molcap sweep` stored beside each
value; the raw tables are CSV and parquet downloads."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import layout, state
from planner.outputs.plan_figures import (
    COMPARISON_FIGURES,
    pareto_figure,
    plan_figure,
    plan_latency_figure,
    sim_latency_figure,
)
from planner.outputs.plan_table import people_plan_table, people_summary_table
from planner.outputs.saved import list_output_folders, load_output_folder, sweep_parameters
from planner.outputs.sim_figures import latency_cdf_figure, throughput_figure
from planner.outputs.sweep_figures import sweep_figure
from planner.outputs.variant_tables import SWEEP_NOTE, people_sweep_table

OLD_TABLES = ("Written before intervals were stored beside the values: values alone; run the "
              "same command again to get them (finished points are reused).")


def _plans(tables: dict) -> None:
    plans = tables.get("plans")
    if plans is None or plans.empty:
        return
    st.subheader("Capacity plan")
    if "interval_source" not in plans:
        st.warning(OLD_TABLES)
    if plans["is_feasible"].astype(bool).any():
        left, right = st.columns(2)
        left.plotly_chart(plan_figure(plans), width="stretch", key="saved_plan")
        right.plotly_chart(plan_latency_figure(plans), width="stretch", key="saved_plan_p99")
    st.dataframe(people_plan_table(plans), hide_index=True, key="saved_plan_table")
    trials = tables.get("plan_trials")
    if trials is None or trials.empty or "e2e_p99_s" not in trials:
        return
    kind = trials.get("kind")
    at_target = trials[kind == "trial"] if kind is not None else trials
    if not at_target.empty:
        st.plotly_chart(pareto_figure(at_target), width="stretch", key="saved_pareto")
    runner_ups = trials[kind == "runner_up"] if kind is not None else trials.iloc[:0]
    if not runner_ups.empty:
        with st.expander(f"runner-ups ({len(runner_ups)})"):
            st.dataframe(people_plan_table(runner_ups.assign(is_feasible=True)),
                         hide_index=True, key="saved_runner_ups")


def _run(tables: dict) -> None:
    _plans(tables)
    summary = tables.get("sim_summary")
    if summary is not None and not summary.empty:
        st.subheader("Simulation")
        left, right = st.columns(2)
        left.plotly_chart(throughput_figure(summary), width="stretch", key="saved_tput")
        right.plotly_chart(sim_latency_figure(summary), width="stretch", key="saved_latency")
        turns = tables.get("sim_turns")
        if turns is not None and not turns.empty:
            st.plotly_chart(latency_cdf_figure(turns, "ttft_s"), width="stretch",
                            key="saved_cdf")
        st.dataframe(people_summary_table(summary), hide_index=True, key="saved_summary")
    for name, builder in COMPARISON_FIGURES.items():
        if name in tables and not tables[name].empty:
            st.plotly_chart(builder(tables[name]), width="stretch", key=f"saved_{name}")
    st.subheader("Raw tables")
    name = st.selectbox("table", sorted(tables), key="saved_table")
    layout.raw_downloads(name, tables[name], "saved_raw")


def _sweep(table) -> None:
    params = sweep_parameters(table) or [c for c in table.columns if c not in ("strategy",)][:1]
    metrics = [c for c in table.columns if c not in (*params, "point", "strategy")
               and table[c].dtype.kind in "if" and not c.endswith(("_low", "_high", "_min",
                                                                   "_max", "_confidence"))]
    left, right = st.columns(2)
    param = left.selectbox("x: varied field", params, key="sweep_param")
    metric = right.selectbox("y: metric", metrics, key="sweep_metric",
                             index=metrics.index("ttft_p99_s") if "ttft_p99_s" in metrics
                             else 0)
    others = [p for p in params if p != param]
    st.plotly_chart(sweep_figure(table, param, metric, others[0] if others else None),
                    width="stretch", key="sweep_fig")
    if "interval_source" not in table:
        st.warning(OLD_TABLES)
    st.caption(SWEEP_NOTE)
    st.dataframe(people_sweep_table(table, params), hide_index=True, key="sweep_table")
    layout.raw_downloads("sweep", table, "sweep_raw")


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
