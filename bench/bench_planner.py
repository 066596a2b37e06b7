"""Planner speed: the capacity plan of scenarios/default.yaml (every strategy, three GPU kinds)
on one process, and a 200-point sweep on one process, two local processes and Ray, side by side.
Prints a table, writes out/bench/planner.json and appends rows to bench/results/.

    .venv/bin/python bench/bench_planner.py [--points 200] [--repeats 2] [--skip-ray]

The machine is shared, so each configuration runs `--repeats` times interleaved with the others
and the table gives wall seconds and CPU seconds (this process, plus its worker processes). The
sweep's speed-up is given two ways: the wall-clock ratio of one run to the next (meaningful only
when the two cores are otherwise idle: the load average is printed), and the CPU-time model
(one-process CPU seconds over the parent's CPU seconds plus half the workers'), which is what
two otherwise idle cores would give when the points balance over the two workers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from planner.jobs.strategy_points import point_function, scenario_tasks
from planner.jobs.sweep import run_sweep
from planner.scenario.loading import load_resolved
from sim.io.points import PointStore, run_points

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import append_rows  # noqa: E402


def _measured(fn) -> dict:
    """Wall seconds, this process's CPU seconds and its reaped children's CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return dict(wall_s=wall, cpu_s=cpu, children_cpu_s=children)


def _capacity_plan(backend: str, workers: int) -> None:
    resolved = load_resolved(ROOT / "scenarios" / "default.yaml")
    tasks = scenario_tasks(resolved, "plan")
    with tempfile.TemporaryDirectory() as tmp:
        records = run_points(tasks, point_function(resolved), PointStore(Path(tmp)),
                             backend=backend, num_workers=workers)
    failed = [k for k, r in records.items() if r["status"] != "ok"]
    assert not failed, [records[k]["error"] for k in failed]


def _sweep_spec(folder: Path, num_points: int) -> Path:
    contexts = [512 * (i + 1) for i in range(num_points // 2)]
    spec = folder / "bench_sweep.yaml"
    spec.write_text(
        f"name: bench_sweep\nscenario: {ROOT / 'scenarios' / 'default.yaml'}\n"
        "evaluate: analysis\nparameters:\n"
        f"  - {{field: analysis.num_turn_context_tokens, values: {contexts}}}\n"
        "  - {field: analysis.decode_batch_size, values: [16, 64]}\n")
    return spec


def _sweep(backend: str, workers: int | None, num_points: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = _sweep_spec(Path(tmp), num_points)
        result = run_sweep(spec, Path(tmp) / "out", backend=backend, num_workers=workers)
    assert not result.errors, result.errors


def _spread(values: list[float]) -> dict:
    return dict(min=min(values), median=statistics.median(values), max=max(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    jobs = {
        ("capacity plan, default.yaml", "inline", 1): lambda: _capacity_plan("inline", 1),
        (f"sweep, {args.points} points", "inline", 1): lambda: _sweep("inline", 1, args.points),
        (f"sweep, {args.points} points", "local", 2): lambda: _sweep("local", 2, args.points),
    }
    if not args.skip_ray:
        jobs[(f"sweep, {args.points} points", "ray", 2)] = lambda: _sweep("ray", None,
                                                                          args.points)
    runs: dict[tuple, list[dict]] = {key: [] for key in jobs}
    loads = []
    for _ in range(args.repeats):  # interleaved: every job once per round
        for key, fn in jobs.items():
            runs[key].append(_measured(fn))
            loads.append(os.getloadavg()[0])
    one = runs[(f"sweep, {args.points} points", "inline", 1)]
    two = runs[(f"sweep, {args.points} points", "local", 2)]
    wall_ratio = [a["wall_s"] / b["wall_s"] for a, b in zip(one, two, strict=True)]
    cpu_ratio = [a["cpu_s"] / (b["cpu_s"] + b["children_cpu_s"] / 2)
                 for a, b in zip(one, two, strict=True)]
    print(f"load average during the runs {min(loads):.1f}-{max(loads):.1f} on "
          f"{os.cpu_count()} CPUs; {args.repeats} interleaved repeats")
    print(f"{'job':<30} {'backend':<7} {'workers':>7} {'wall s (min/med/max)':>24} "
          f"{'cpu s':>7} {'workers cpu s':>13}")
    for (job, backend, workers), rows in runs.items():
        w = _spread([r["wall_s"] for r in rows])
        print(f"{job:<30} {backend:<7} {workers:>7} "
              f"{w['min']:>8.1f}{w['median']:>8.1f}{w['max']:>8.1f} "
              f"{statistics.median(r['cpu_s'] for r in rows):>7.1f} "
              f"{statistics.median(r['children_cpu_s'] for r in rows):>13.1f}")
    print(f"sweep speed-up, 2 local processes over 1: wall {min(wall_ratio):.2f}-"
          f"{max(wall_ratio):.2f}, CPU-time model {min(cpu_ratio):.2f}-{max(cpu_ratio):.2f} "
          "(goal >= 1.8)")
    out = ROOT / "out" / "bench" / "planner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": dict(min=min(loads), max=max(loads)),
        "goal": "capacity plan of default.yaml <= 10 s on one process; a 200-point sweep on "
                "two local processes >= 1.8x one process",
        "sweep_speedup": dict(wall=_spread(wall_ratio), cpu_model=_spread(cpu_ratio)),
        "rows": [dict(job=j, backend=b, workers=w, runs=rows)
                 for (j, b, w), rows in runs.items()],
    }, indent=2))
    speedup = (f"2 local / 1: {min(wall_ratio):.2f}-{max(wall_ratio):.2f}x wall, "
               f"{min(cpu_ratio):.2f}-{max(cpu_ratio):.2f}x CPU-time model")
    results = [dict(job=job, processes=f"{workers} {backend}",
                    cpu_s=statistics.median(r["cpu_s"] for r in rows),
                    wall_s=" / ".join(f"{v:.1f}" for v in _spread(
                        [r["wall_s"] for r in rows]).values()),
                    note=f"{args.repeats} interleaved repeats; workers' CPU s "
                         f"{statistics.median(r['children_cpu_s'] for r in rows):.1f}"
                         + (f"; {speedup}" if backend == "local" else ""))
               for (job, backend, workers), rows in runs.items()]
    append_rows("bench_planner", results, source="bench/bench_planner.py " + " ".join(
        sys.argv[1:]), load_average=f"{min(loads):.1f}-{max(loads):.1f}")
    print(f"wrote {out}; appended to bench/results/bench_planner.json")


if __name__ == "__main__":
    main()
