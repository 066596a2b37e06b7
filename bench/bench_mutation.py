"""Mutation testing as a benchmark: how many deliberate bugs in the core rules the tests catch.

For each module below, cosmic-ray (the `mutation` extra) makes mutants (an operator swapped, a
constant changed, a condition negated, ...) and runs only that module's own tests against each;
a mutant the tests fail on (or that runs past the timeout) is killed. A deterministic sample of
each module's mutants keeps a full run near an hour on two cores. The kill rate leaves out the
mutants judged equivalent (no input can tell them apart from the original) in
bench/mutation_equivalent.json, each with its reason.

Each module runs in a copy of the repository under a temporary folder (cosmic-ray edits the files
it mutates), so the checkout is never touched. Rows go to bench/results/bench_mutation.json
(machine, load and date with each); docs/mutation.md is written from that file and from the
survivors of the run.

    nice -n 19 python bench/bench_mutation.py                  # every module, 100 mutants each
    nice -n 19 python bench/bench_mutation.py --modules planner/search/slo.py --sample 0  # all
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import RESULTS_DIR, append_rows, load_results, results_dir  # noqa: E402

MODULES = {
    "sim/cost/cost_model.py": ["tests/sim/test_cost_model.py", "tests/sim/test_lora_kernels.py",
                               "tests/sim/test_fast_pricing.py"],
    "sim/memory/kv_blocks.py": ["tests/sim/test_kv_blocks.py"],
    "sim/engine/step_pricer.py": ["tests/sim/test_mixed_step_prices.py",
                                  "tests/sim/test_guarded_rules.py",
                                  "tests/sim/test_step_pricer.py"],
    "planner/search/slo_search.py": ["tests/planner/test_search.py",
                                     "tests/planner/test_search_rules.py",
                                     "tests/planner/test_fast_search.py",
                                     "tests/planner/test_slo_rules.py",
                                     "tests/planner/test_slo_search_rules.py"],
    "planner/search/slo.py": ["tests/planner/test_slo_rules.py"],
}
"""Module -> its own tests (only these run against its mutants)."""
COPIED = ("sim", "planner", "tests", "scenarios", "pyproject.toml")
"""What a module's scratch copy of the repository holds (data/ is linked, never mutated)."""
EQUIVALENT = ROOT / "bench" / "mutation_equivalent.json"
SURVIVORS = "bench_mutation.survivors"
"""Next to the results file (not .json: bench/tables.py renders those): each module's survivors
in its latest run (key and change), so that docs/mutation.md lists every module's, and
`--rejudge` applies a new verdict on a survivor to the module's latest row without running the
mutants again."""
DOC = ROOT / "docs" / "mutation.md"
BENCHMARK = "bench_mutation"


def _key(mutation: dict) -> str:
    """A mutant's name that survives re-runs: module:line:column operator #occurrence."""
    row, col = mutation["start_pos"]
    return f"{mutation['module_path']}:{row}:{col} {mutation['operator_name']} " \
           f"#{mutation['occurrence']}"


def _scratch_copy(folder: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", ".hypothesis"))
        else:
            shutil.copy2(source, folder / name)
    (folder / "data").symlink_to(ROOT / "data")


def _sample(session: Path, size: int, seed: int) -> int:
    """Keep `size` work items of the session (all when 0); the module's mutant count. Job ids
    are random per `init`: the sample is drawn from the mutants ordered by operator and
    occurrence, so a re-run with the same seed on the same code runs the same mutants."""
    with sqlite3.connect(session) as db:
        jobs = [row[0] for row in db.execute(
            "SELECT job_id FROM mutation_specs ORDER BY operator_name, occurrence, "
            "start_pos_row, start_pos_col")]
        if 0 < size < len(jobs):
            drop = sorted(set(jobs) - set(random.Random(seed).sample(jobs, size)))
            db.executemany("DELETE FROM mutation_specs WHERE job_id = ?", [(j,) for j in drop])
            db.executemany("DELETE FROM work_items WHERE job_id = ?", [(j,) for j in drop])
    return len(jobs)


def run_module(module: str, tests: list[str], *, sample: int, seed: int,
               timeout_s: float) -> dict:
    """Mutate `module` in a scratch copy, run its tests on each sampled mutant; the outcomes."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="molcap-mutation-") as scratch:
        repo = Path(scratch) / "repo"
        repo.mkdir()
        _scratch_copy(repo)
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        baseline = subprocess.run(command, cwd=repo, capture_output=True, text=True)
        if baseline.returncode != 0:
            raise SystemExit(f"{module}: its tests fail before any mutation:\n"
                             f"{baseline.stdout[-2000:]}")
        config = Path(scratch) / "config.toml"
        config.write_text(
            "[cosmic-ray]\n"
            f"module-path = {json.dumps(module)}\n"
            f"timeout = {timeout_s}\n"
            "excluded-modules = []\n"
            f"test-command = {json.dumps(' '.join(command))}\n\n"
            "[cosmic-ray.distributor]\nname = \"local\"\n", encoding="utf-8")
        session = Path(scratch) / "session.sqlite"
        cosmic_ray = [str(Path(sys.executable).with_name("cosmic-ray"))]  # the mutation extra
        subprocess.run([*cosmic_ray, "init", str(config), str(session)], cwd=repo, check=True,
                       capture_output=True)
        num_mutants = _sample(session, sample, seed)
        subprocess.run([*cosmic_ray, "exec", str(config), str(session)], cwd=repo, check=True,
                       capture_output=True)
        dump = subprocess.run([*cosmic_ray, "dump", str(session)], cwd=repo, check=True,
                              capture_output=True, text=True).stdout
    outcomes = []
    for line in dump.splitlines():
        item, result = json.loads(line)
        mutation = item["mutations"][0]
        if result is None:
            status = "not run"
        elif result["worker_outcome"] == "timeout" or result["test_outcome"] == "killed":
            status = "killed"
        elif result["test_outcome"] == "incompetent" or result["worker_outcome"] != "normal":
            status = "incompetent"
        else:
            status = "survived"
        outcomes.append(dict(key=_key(mutation), status=status,
                             diff=(result or {}).get("diff", "")))
    return dict(module=module, num_mutants=num_mutants, outcomes=outcomes,
                minutes=(time.monotonic() - started) / 60)


def summarize(run: dict, equivalent: dict[str, str]) -> dict:
    """One table row: counts, and the kill rate over mutants that are neither equivalent nor
    unrunnable."""
    statuses = [o["status"] for o in run["outcomes"]]
    survivors = [o for o in run["outcomes"] if o["status"] == "survived"]
    killed = statuses.count("killed")
    row = dict(module=run["module"], num_mutants=run["num_mutants"],
               num_sampled=len(statuses), num_killed=killed, num_survived=len(survivors),
               num_equivalent=0, num_incompetent=statuses.count("incompetent"), kill_rate=None,
               minutes=round(run["minutes"], 1))
    return judged(row, [o["key"] for o in survivors], equivalent)


def judged(row: dict, survivor_keys: list[str], equivalent: dict[str, str]) -> dict:
    """`row` with its equivalent survivors counted and its kill rate over the rest."""
    num_equivalent = sum(key in equivalent for key in survivor_keys)
    num_judged = row["num_killed"] + row["num_survived"] - num_equivalent
    return row | dict(num_equivalent=num_equivalent,
                      kill_rate=round(row["num_killed"] / num_judged, 3) if num_judged else None)


def _changed_lines(diff: str) -> list[str]:
    return [d.strip() for d in diff.splitlines()
            if d[:1] in "+-" and not d.startswith(("---", "+++"))][:2]


def save_survivors(runs: list[dict]) -> None:
    """Replace the survivors of each module just run (others keep their latest run's)."""
    path = results_dir() / SURVIVORS
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    for run in runs:
        data[run["module"]] = [dict(key=o["key"], change=_changed_lines(o["diff"]))
                               for o in run["outcomes"] if o["status"] == "survived"]
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def rejudge(equivalent: dict[str, str]) -> None:
    """Count equivalent survivors and the kill rate of each module's latest row anew, from its
    saved survivors and the current verdicts: a judgement made after the run, no new run."""
    path = results_dir() / f"{BENCHMARK}.json"
    results = load_results(path).model_dump()
    survivors = json.loads((results_dir() / SURVIVORS).read_text(encoding="utf-8"))
    latest = {row["values"]["module"]: row for row in results["rows"]}
    for module, rows in survivors.items():
        row = latest.get(module)
        if row is not None and row["values"]["num_survived"] == len(rows):
            row["values"] = judged(row["values"], [r["key"] for r in rows], equivalent)
    path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def write_doc(equivalent: dict[str, str]) -> None:
    """docs/mutation.md: every recorded row, then each module's latest survivors."""
    results = load_results(results_dir() / f"{BENCHMARK}.json")
    head = ["date (UTC)", "machine", "load (1 min)", "commit",
            *(c.label for c in results.columns)]
    lines = ["# Mutation testing of the core rules", "",
             "Written by `bench/bench_mutation.py` (cosmic-ray over each module with only its own "
             "tests; a fixed sample of each module's mutants). The kill rate leaves out "
             "survivors judged equivalent (listed below with the reason) and mutants that do "
             "not run. Goal: at least 90% in every module.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in results.rows:
        cells = [row.date, row.machine, str(row.load_average), row.commit or "",
                 *(str(row.values.get(c.key, "")) for c in results.columns)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Survivors of each module's latest run", ""]
    survivors = json.loads((results_dir() / SURVIVORS).read_text(encoding="utf-8"))
    for module, rows in survivors.items():
        lines.append(f"### {module}: {len(rows)} survived")
        lines.append("")
        for o in rows:
            verdict = equivalent.get(o["key"])
            lines.append(f"- `{o['key']}`: " + (f"equivalent: {verdict}" if verdict
                                                 else "not killed (a missing test)"))
            lines += [f"  `{d}`" for d in o["change"]]
        lines.append("")
    # A trial run into another results folder (MOLCAP_BENCH_RESULTS_DIR) keeps its page there.
    doc = DOC if results_dir() == RESULTS_DIR else results_dir() / DOC.name
    doc.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="*", default=list(MODULES), choices=list(MODULES))
    parser.add_argument("--sample", type=int, default=100,
                        help="mutants run per module (0: all of them)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="seconds a mutant's test run may take before it counts as killed")
    parser.add_argument("--jobs", type=int, default=2, help="modules run side by side")
    parser.add_argument("--rejudge", action="store_true",
                        help="run nothing: apply bench/mutation_equivalent.json to each "
                             "module's latest row and survivors, and rewrite docs/mutation.md")
    args = parser.parse_args(argv)
    equivalent = {e["mutant"]: e["reason"] for e in
                  json.loads(EQUIVALENT.read_text(encoding="utf-8"))}
    if args.rejudge:
        rejudge(equivalent)
        write_doc(equivalent)
        return 0
    load_before = os.getloadavg()[0]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(lambda m: run_module(m, MODULES[m], sample=args.sample,
                                                  seed=args.seed, timeout_s=args.timeout_s),
                             args.modules))
    rows = [summarize(run, equivalent) for run in runs]
    # The column labels and the title live in bench/results/bench_mutation.json.
    append_rows(BENCHMARK, rows, source=f"bench/bench_mutation.py --sample {args.sample} "
                f"--seed {args.seed}", load_average=f"{load_before:.1f}-{os.getloadavg()[0]:.1f}")
    save_survivors(runs)
    write_doc(equivalent)
    for row in rows:
        print(f"{row['module']}: {row['num_killed']}/{row['num_sampled']} killed, "
              f"kill rate {row['kill_rate']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
