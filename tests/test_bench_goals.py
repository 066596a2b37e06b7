"""bench/goals.py: each issue-25 goal is read from the last recorded run of its benchmark,
said met or not against its target, and an unmet one points at the note explaining it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.goals import render_goals  # noqa: E402
from bench.record import BenchmarkResults  # noqa: E402


def results(name: str, keys: list[str], rows: list[tuple[str, dict]]) -> BenchmarkResults:
    return BenchmarkResults(
        benchmark=name, title=name, about="test", columns=[dict(key=k, label=k) for k in keys],
        rows=[dict(machine="Test CPU", load_average=0.5, date=date, source=f"run {date}",
                   values=values) for date, values in rows])


def goal_lines(page: str, goal: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith(f"| {goal} |")]


def test_the_vidur_goal_reads_the_last_row_and_says_met_or_not():
    keys = ["ratio"]
    met = render_goals({"bench_vidur": results("bench_vidur", keys, [
        ("d1", {"ratio": "5 / 7 / 9x"}), ("d2", {"ratio": "18 / 21.5 / 25x"})])})
    [line] = goal_lines(met, "Vidur ratio")
    assert "median 21.5x" in line and "| yes |" in line and line.endswith("|  |")
    unmet = render_goals({"bench_vidur": results("bench_vidur", keys, [
        ("d2", {"ratio": "18 / 21.5 / 25x"}), ("d3", {"ratio": "7 / 8 / 9x"})])})
    [line] = goal_lines(unmet, "Vidur ratio")
    assert "median 8x" in line and "| no |" in line and line.endswith("| (a) |")
    assert "\n(a) " in unmet


def test_the_multilora_floor_is_the_slowest_case_of_the_last_run_of_each_size():
    keys = ["config", "load", "num_requests", "requests_per_cpu_s"]
    case = dict(config="16a/16s", load=0.5, num_requests=20_000)
    page = render_goals({"bench_multilora": results("bench_multilora", keys, [
        ("d1", case | {"requests_per_cpu_s": 900.0}),  # an earlier run: not read
        ("d2", case | {"requests_per_cpu_s": 12_000.0}),
        ("d2", case | {"config": "384a/32s", "load": 1.5, "requests_per_cpu_s": 11_000.0}),
        ("d2", case | {"num_requests": 2_000, "requests_per_cpu_s": 10.0}),  # --quick: not read
    ])})
    [line] = goal_lines(page, "multi-LoRA speed")
    assert "slowest 11,000 (384a/32s at 150%) of 2 cases" in line and "| yes |" in line


def test_no_rows_no_section():
    assert render_goals({"bench_vidur": results("bench_vidur", ["ratio"], [])}) == ""
