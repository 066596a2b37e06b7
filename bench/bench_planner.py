"""Planner speed: a full capacity search (six strategies, one scenario) and a 200-point sweep,
on local processes and on Ray, side by side. Prints a table and writes out/bench/planner.json.

    .venv/bin/python bench/bench_planner.py [--points 200] [--skip-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from planner.loading import load_scenario
from planner.plan_points import plan_point, scenario_tasks
from planner.points import PointStore, run_points
from planner.sweep_run import run_sweep

ROOT = Path(__file__).resolve().parents[1]
SIX = ("base", "multi_lora", "preft_lora_p", "mol", "contextual_mol", "mol2_in_engine")


def _capacity_search(backend: str, workers: int) -> float:
    scenario = load_scenario(ROOT / "scenarios" / "default.yaml")
    tasks = [t for t in scenario_tasks(scenario, "plan")
             if scenario.strategies[t.payload["index"]].label in SIX]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        records = run_points(tasks, plan_point, PointStore(Path(tmp)), backend=backend,
                             num_workers=workers)
        elapsed = time.perf_counter() - start
    failed = [k for k, r in records.items() if r["status"] != "ok"]
    assert not failed, failed
    return elapsed


def _sweep_spec(folder: Path, num_points: int) -> Path:
    contexts = [512 * (i + 1) for i in range(num_points // 2)]
    spec = folder / "bench_sweep.yaml"
    spec.write_text(
        f"name: bench_sweep\nscenario: {ROOT / 'scenarios' / 'default.yaml'}\n"
        "evaluate: analysis\nparameters:\n"
        f"  - {{field: analysis.num_turn_context_tokens, values: {contexts}}}\n"
        "  - {field: analysis.decode_batch_size, values: [16, 64]}\n")
    return spec


def _sweep(backend: str, workers: int | None, num_points: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        spec = _sweep_spec(Path(tmp), num_points)
        start = time.perf_counter()
        result = run_sweep(spec, Path(tmp) / "out", backend=backend, num_workers=workers)
        elapsed = time.perf_counter() - start
    assert not result.errors, result.errors
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    rows = []
    for backend, workers in (("inline", 1), ("local", 2)):
        rows.append(("capacity search, 6 strategies", backend, workers,
                     _capacity_search(backend, workers)))
    for backend, workers in (("inline", 1), ("local", 1), ("local", 2)):
        rows.append((f"sweep, {args.points} points", backend, workers,
                     _sweep(backend, workers, args.points)))
    if not args.skip_ray:
        rows.append((f"sweep, {args.points} points", "ray", os.cpu_count(),
                     _sweep("ray", None, args.points)))
    print(f"{'job':<32} {'backend':<8} {'workers':>7} {'seconds':>9}")
    for job, backend, workers, seconds in rows:
        print(f"{job:<32} {backend:<8} {workers:>7} {seconds:>9.1f}")
    out = ROOT / "out" / "bench" / "planner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "goal": "capacity search under 30 s; sweep near-linear in workers",
        "rows": [dict(job=j, backend=b, workers=w, seconds=s) for j, b, w, s in rows],
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
