"""Run a sweep spec: every point through `run_points`, then one tidy table, charts and report."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.io as pio

from planner.jobs.sweep_spec import SweepSpec, load_sweep
from planner.outputs.report import ReportSection, render_html, timestamp, write_table
from planner.predict.analysis import strategy_summary
from planner.predict.simulation import simulate_strategy
from planner.scenario.schema import Scenario
from sim.io.files import file_name, write_atomic
from sim.io.points import PointStore, PointTask, progress_counter, run_points

MAX_DASH_VALUES = 4
"""Values of the second swept parameter drawn as separate lines in one chart."""


def evaluate_point(payload: dict) -> list[dict]:
    """One sweep point: validate its scenario and summarise every strategy (JSON-able rows)."""
    scenario = Scenario.model_validate(payload["scenario"])
    if payload["evaluate"] == "simulate":
        return [{"strategy": st.label, **simulate_strategy(scenario, i).summary}
                for i, st in enumerate(scenario.strategies)]
    return strategy_summary(scenario).to_dict(orient="records")


@dataclass(frozen=True)
class SweepResult:
    """What a sweep produced."""

    spec: SweepSpec
    table: pd.DataFrame
    errors: dict[str, str]
    report_path: Path
    table_paths: list[Path]
    num_points: int


def collect_table(records: dict[str, dict]) -> tuple[pd.DataFrame, dict[str, str]]:
    """Tidy table of every finished point (parameters as columns) and the failed points."""
    rows, errors = [], {}
    for key, record in records.items():
        if record["status"] != "ok":
            errors[key] = record["error"]
            continue
        params = record["payload"]["params"]
        rows += [{"point": key, **params, **row} for row in record["result"]]
    return pd.DataFrame(rows), errors


def sweep_figures(table: pd.DataFrame, spec: SweepSpec) -> list:
    """One chart per (varied field, metric): metric vs field value, a line per strategy."""
    if table.empty:
        return []
    metrics = [c for c in ("decision_s", "switch_s", "decode_step_s", "kv_gib_per_conversation",
                           "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "output_tokens_per_s")
               if c in table.columns]
    figures = []
    for param in spec.parameters:
        others = [p.field for p in spec.parameters if p.field != param.field]
        dash = others[0] if others else None
        data, note = table.sort_values(param.field), ""
        if dash is not None and data[dash].nunique() > MAX_DASH_VALUES:
            # A line per value of a long second parameter is unreadable and slow to build.
            values = np.sort(data[dash].unique())
            kept = values[np.linspace(0, values.size - 1, MAX_DASH_VALUES).round().astype(int)]
            data = data[data[dash].isin(kept)]
            note = f" ({MAX_DASH_VALUES} of {values.size} values of {dash})"
        for metric in metrics:
            figures.append(_line_figure(data, param.field, metric, dash,
                                        f"{metric} vs {param.field}{note}"))
    return figures


def _line_figure(data: pd.DataFrame, x: str, y: str, dash: str | None, title: str) -> dict:
    """`y` vs `x`, a colour per strategy and a line style per value of `dash`, as a plain
    figure dict: building graph objects validates every trace (about half the parent's serial
    time in a 200-point sweep), and these traces are valid by construction."""
    colours, styles = px.colors.qualitative.Plotly, ("solid", "dash", "dot", "dashdot")
    strategies = list(dict.fromkeys(data["strategy"]))
    values = list(dict.fromkeys(data[dash])) if dash else [None]
    names, xs, ys = data["strategy"].to_numpy(), data[x].to_numpy(), data[y].to_numpy()
    dashes = data[dash].to_numpy() if dash else None
    traces = []
    for s_i, strategy in enumerate(strategies):
        rows = names == strategy
        for v_i, value in enumerate(values):
            line = rows if dash is None else rows & (dashes == value)
            traces.append(dict(
                type="scatter", x=xs[line], y=ys[line], mode="lines+markers",
                name=strategy if dash is None else f"{strategy}, {dash}={value}",
                legendgroup=strategy,
                line=dict(color=colours[s_i % len(colours)], dash=styles[v_i % len(styles)])))
    layout = dict(title=dict(text=title), xaxis=dict(title=dict(text=x)),
                  yaxis=dict(title=dict(text=y)), template=_white_template(), height=380)
    return dict(data=traces, layout=layout)


@functools.cache
def _white_template() -> dict:
    return pio.templates["plotly_white"].to_plotly_json()


def run_sweep(
    spec_path: str | Path, out_root: str | Path = "out", *, backend: str = "local",
    num_workers: int | None = None, ray_address: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run (or resume) a sweep; write points, the tidy table and the report under out/<name>/."""
    spec, points = load_sweep(spec_path)
    out_dir = Path(out_root) / file_name(spec.name)
    tasks = [PointTask(key, {"params": params, "scenario": scenario, "evaluate": spec.evaluate})
             for key, params, scenario in points]
    records = run_points(tasks, evaluate_point, PointStore(out_dir / "points"), backend=backend,
                         num_workers=num_workers, ray_address=ray_address,
                         on_done=progress_counter(len(tasks), on_progress))
    table, errors = collect_table(records)
    paths = write_table(table, out_dir / "sweep") if not table.empty else []
    failed = pd.DataFrame([{"point": k, "error": v} for k, v in errors.items()])
    sections = [ReportSection("Sweep", f"{len(points)} points over "
                              f"{[p.field for p in spec.parameters]}; {len(errors)} failed.",
                              sweep_figures(table, spec), [failed] if errors else [])]
    page = render_html(f"molcap sweep: {spec.name}", f"Generated {timestamp()}.", sections,
                       Path(spec_path).read_text(encoding="utf-8"))
    report = out_dir / "report.html"
    write_atomic(report, page.encode("utf-8"))
    return SweepResult(spec, table, errors, report, paths, len(tasks))
