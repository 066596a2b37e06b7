"""How long one whole `molcap run` takes: the command as a user types it, in a fresh process
each time (imports, scenario resolution, comparisons, simulations, capacity plans, tables,
report), inline backend (one process), a fresh temporary output folder per repeat so no
finished point is resumed. Issue 25's goal: `molcap run scenarios/default.yaml` in 5 s.

    python bench/bench_run.py [scenarios/default.yaml] [--repeats 3] [--record]

Reports wall and CPU seconds (the child's user + system time) per repeat, min / median / max;
`--record` appends the row to bench/results/bench_run.json (rendered by bench/tables.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(scenario: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one `python -m app.cli run SCENARIO --backend inline`; exits with
    the command's code, and its output, when it fails."""
    with tempfile.TemporaryDirectory(prefix="molcap-bench-run-") as out:
        command = [sys.executable, "-m", "app.cli", "run", str(scenario), "--backend", "inline",
                   "--out", out]
        cpu_start, start = child_cpu_s(), time.perf_counter()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, child_cpu_s() - cpu_start
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
        sys.stderr.write(f"error: {' '.join(command[1:])} exited with {done.returncode}\n")
        raise SystemExit(done.returncode)
    return wall, cpu


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", type=Path, default=Path("scenarios/default.yaml"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--record", action="store_true",
                        help="append the row to bench/results/bench_run.json")
    args = parser.parse_args(argv)
    loads, walls, cpus = [os.getloadavg()[0]], [], []
    for i in range(args.repeats):
        wall, cpu = run_once(args.scenario)
        walls.append(wall)
        cpus.append(cpu)
        loads.append(os.getloadavg()[0])
        print(f"repeat {i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    row = dict(scenario=str(args.scenario), backend="inline", repeats=args.repeats,
               wall_s=spread(walls), cpu_s=spread(cpus),
               median_wall_s=statistics.median(walls),
               within_goal="yes" if statistics.median(walls) <= 5.0 else "no")
    print(row)
    if args.record:
        from bench.record import append_rows

        append_rows("bench_run", [row], source="python bench/bench_run.py "
                    + " ".join(argv if argv is not None else sys.argv[1:]),
                    load_average=f"{min(loads):.1f}-{max(loads):.1f}")
        print("appended to bench/results/bench_run.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
