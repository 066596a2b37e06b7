"""Where one `molcap run` spends its time: the whole command (imports, scenario resolution,
comparisons, simulations, capacity search, tables, report) in this one process under cProfile,
printed as each function's share of the total.

    python -m bench.profile_run [scenarios/default.yaml] [--top 40]

The run uses the inline backend (every point in this process, so the profile sees them all)
and a fresh temporary output folder (a reused one would resume finished points and skip
them). Shares, not seconds, are what to read on a loaded machine; the total is printed for a
quiet one. Imports are profiled too: the command's modules are first imported inside it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

# Functions whose cumulative share says which phase of the run the time went to.
PHASES = {
    "run_scenario_file": "the whole run (planner.jobs.run)",
    "load_resolved": "scenario loading and resolution",
    "run_comparisons": "analytical comparisons",
    "run_points": "simulations and capacity plans (all points)",
    "write_table": "tables (parquet and CSV)",
    "render_html": "report rendering",
    "simulate": "simulator (sim.simulate.simulate, every call)",
    "_find_and_load": "imports",
}


def profile_run(scenario: Path, out_root: Path) -> tuple[pstats.Stats, int]:
    """Run `molcap run SCENARIO --backend inline` under cProfile; (stats, exit code)."""

    def command() -> int:
        from app.cli import app

        code = app(args=["run", str(scenario), "--out", str(out_root), "--backend", "inline"],
                   standalone_mode=False)
        return int(code or 0)

    prof = cProfile.Profile()
    code = prof.runcall(command)
    return pstats.Stats(prof), code


def _where(path: str, line: int) -> str:
    if not line:
        return path  # a builtin: "~" and its name
    parts = Path(path).parts
    return f"{'/'.join(parts[-2:])}:{line}"


def profile_row(stats: pstats.Stats, scenario: Path) -> dict:
    """The run as a row of the profiles table (bench_sim_profile.json): each phase's
    cumulative share and the largest self-time shares."""
    total = stats.total_tt
    phases = []
    for name, label in PHASES.items():
        found = [v[3] for (_, _, fn), v in stats.stats.items() if fn == name]
        if found and name != "run_scenario_file":
            phases.append(f"{label} {max(found) / total:.0%}")
    ranked = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:5]
    own = ", ".join(f"{name} {v[2] / total:.0%}" for (_, _, name), v in ranked)
    return dict(workload=f"molcap run {scenario} --backend inline (bench.profile_run)",
                where_time_goes=f"cumulative shares (cProfile): {'; '.join(phases)}; largest "
                                f"self-time shares: {own}")


def share_lines(stats: pstats.Stats, top: int) -> list[str]:
    """The phases, then the `top` functions by cumulative and by self time, as shares of
    the profiled total."""
    total = stats.total_tt
    entries = stats.stats.items()  # (path, line, name) -> (prim calls, calls, self, cum, _)
    lines = [f"profiled total {total:.2f} s (one process; the shares below are of it)", "",
             "phases (cumulative share, calls)"]
    for name, label in PHASES.items():
        found = [(v[3], v[1]) for (_, _, fn), v in entries if fn == name]
        if found:
            # Recursive or nested entries of one name: the largest cumulative is the phase.
            cum, calls = max(found)
            lines.append(f"{cum / total:>7.1%} {calls:>9}  {label}")
    for title, col in (("by cumulative time", 3), ("by self time", 2)):
        ranked = sorted(entries, key=lambda kv: -kv[1][col])[:top]
        lines += ["", title, f"{'cum':>7} {'self':>7} {'calls':>9}  function"]
        for (path, line, name), (_, calls, self_s, cum_s, _) in ranked:
            lines.append(f"{cum_s / total:>7.1%} {self_s / total:>7.1%} {calls:>9}  {name} "
                         f"({_where(path, line)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", type=Path, default=Path("scenarios/default.yaml"))
    parser.add_argument("--top", type=int, default=40, help="Functions listed per ranking.")
    parser.add_argument("--stats", type=Path, help="Also write the raw pstats file here.")
    parser.add_argument("--record", action="store_true",
                        help="append the phase shares to bench/results/bench_sim_profile.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="molcap-profile-") as out_root:
        stats, code = profile_run(args.scenario, Path(out_root))
    if args.stats:
        stats.dump_stats(args.stats)
    print("\n".join(share_lines(stats, args.top)))
    if code:
        print(f"molcap run exited with {code}: the profile is of a failed run", file=sys.stderr)
    elif args.record:
        from bench.record import append_rows

        append_rows("bench_sim_profile", [profile_row(stats, args.scenario)],
                    source="python -m bench.profile_run " + " ".join(
                        argv if argv is not None else sys.argv[1:]))
    return code


if __name__ == "__main__":
    sys.exit(main())
