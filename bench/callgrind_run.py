"""Instructions the points of one `molcap run` execute (a scenario's per-strategy simulations
or capacity plans, as `run_points` runs them), counted by callgrind: the load-independent
counterpart of timing `molcap run SCENARIO` on a shared machine.

    valgrind --tool=callgrind --toggle-collect='*qsort*' --callgrind-out-file=cg.out \\
        python -m bench.callgrind_run scenarios/default.yaml simulate --strategies 0 1

Resolves the scenario (not counted), then runs the chosen points inside libc's `qsort`
comparator like `bench/callgrind_sim.py`, so `--toggle-collect='*qsort*'` counts them and
nothing else. Prints a digest of each point's turns table and summary, so two trees' runs
also say whether their results are equal bit for bit. Without valgrind it just runs them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.callgrind_sim import run_in_qsort  # noqa: E402


def record_digest(record: dict) -> str:
    """sha256 over the point's turns (every column's values) and its summary's numbers."""
    from planner.jobs.strategy_points import all_turns

    digest = hashlib.sha256()
    if "turns_parquet" in record or "turns" in record:
        turns = all_turns(record)
        for name in sorted(turns.columns):
            values = turns[name].to_numpy()
            digest.update(name.encode())
            digest.update("\0".join(map(repr, values.tolist())).encode())
    summary = {k: v for k, v in record.get("summary", {}).items() if "wall" not in k}
    digest.update(json.dumps(summary, sort_keys=True, default=repr).encode())
    return digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("what", choices=["simulate", "plan"])
    parser.add_argument("--strategies", type=int, nargs="+",
                        help="indices of the scenario's strategies (default: every one)")
    args = parser.parse_args()

    from planner.jobs.strategy_points import point_function, scenario_tasks
    from planner.scenario.loading import load_resolved

    resolved = load_resolved(args.scenario)
    tasks = scenario_tasks(resolved, args.what)
    chosen = [tasks[i] for i in args.strategies] if args.strategies else tasks
    point = point_function(resolved)
    records = []
    run_in_qsort(lambda: records.extend(point(task.payload) for task in chosen))
    for task, record in zip(chosen, records, strict=True):
        print(f"{task.key.rsplit('-', 1)[0]}: status {record.get('status', '?')}, digest "
              f"{record_digest(record)}")


if __name__ == "__main__":
    main()
