"""Run a sweep spec: every point through `run_points`, then one tidy table, charts and report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from planner.jobs.sweep_spec import SweepPoint, SweepSpec, load_sweep
from planner.outputs.interval_columns import sweep_intervals
from planner.outputs.report import ReportSection, render_html, timestamp, write_table
from planner.outputs.sweep_figures import sweep_figures
from planner.outputs.variant_tables import SWEEP_NOTE, people_sweep_table
from planner.predict.analysis import strategy_summary
from planner.predict.simulation import simulate_strategy
from planner.scenario.resolved import ResolvedScenario, resolve_scenario
from planner.scenario.schema import Scenario
from sim.io.files import file_name, write_atomic
from sim.io.points import PointStore, PointTask, progress_counter, run_points


def evaluate_point(payload: dict, resolved: ResolvedScenario | None = None) -> list[dict]:
    """One sweep point: summarise every strategy of its scenario (JSON-able rows). `resolved`:
    the point's scenario as the parent resolved it (`resolve_points`); None where that failed,
    then resolving it here records the same error as the point's."""
    if resolved is None:
        resolved = resolve_scenario(Scenario.model_validate(payload["scenario"]))
    if payload["evaluate"] == "simulate":
        return [{"strategy": st.label, **simulate_strategy(resolved, i).summary}
                for i, st in enumerate(resolved.scenario.strategies)]
    return strategy_summary(resolved).to_dict(orient="records")


def _resolved_or_none(scenario: Scenario | ResolvedScenario) -> ResolvedScenario | None:
    return scenario if isinstance(scenario, ResolvedScenario) else None


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


def resolve_points(points: list[SweepPoint]) -> dict[str, Scenario | ResolvedScenario]:
    """Point key -> its scenario (as `load_sweep` validated it) resolved once, here in the
    parent (each point is a scenario of its own), so its worker re-validates nothing; a point
    that fails to resolve keeps its validated scenario, and its worker records the error."""
    out: dict[str, Scenario | ResolvedScenario] = {}
    for point in points:
        try:
            out[point.key] = resolve_scenario(point.model)
        except Exception:  # noqa: BLE001 - the point's own error, recorded by its worker
            out[point.key] = point.model
    return out


def run_sweep(
    spec_path: str | Path, out_root: str | Path = "out", *, backend: str = "local",
    num_workers: int | None = None, ray_address: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run (or resume) a sweep; write points, the tidy table and the report under out/<name>/."""
    spec, points = load_sweep(spec_path)
    out_dir = Path(out_root) / file_name(spec.name)
    resolved = resolve_points(points)
    tasks = [PointTask(p.key, {"params": p.params, "scenario": p.scenario,
                               "evaluate": spec.evaluate}, given=_resolved_or_none(resolved[p.key]))
             for p in points]
    records = run_points(tasks, evaluate_point, PointStore(out_dir / "points"), backend=backend,
                         num_workers=num_workers, ray_address=ray_address,
                         on_done=progress_counter(len(tasks), on_progress))
    table, errors = collect_table(records)
    if not table.empty:  # each point's interval, priced by its own scenario
        table = sweep_intervals(table, resolved)
    paths = write_table(table, out_dir / "sweep") if not table.empty else []
    failed = pd.DataFrame([{"point": k, "error": v} for k, v in errors.items()])
    fields = [p.field for p in spec.parameters]
    people = [people_sweep_table(table, fields)] if not table.empty else []
    sections = [ReportSection("Sweep", f"{len(points)} points over {fields}; {len(errors)} "
                              f"failed. {SWEEP_NOTE}", sweep_figures(table, fields),
                              people + ([failed] if errors else []))]
    page = render_html(f"molcap sweep: {spec.name}", f"Generated {timestamp()}.", sections,
                       Path(spec_path).read_text(encoding="utf-8"))
    report = out_dir / "report.html"
    write_atomic(report, page.encode("utf-8"))
    return SweepResult(spec, table, errors, report, paths, len(tasks))
