"""Nothing lies about a failure: a run or sweep whose points failed finishes the others, writes
what succeeded and exits non-zero, its last line saying how many failed and where to see why."""

from __future__ import annotations

import subprocess

import pandas as pd
from planner_helpers import TINY, molcap, write_tiny

FAILED_POINTS_EXIT = 1
STEP_BOUND = "simulation: {max_engine_steps: 1}\n"
"""Makes every simulation (and so every point) of TINY raise."""


def last_line(result: subprocess.CompletedProcess) -> str:
    return (result.stdout + result.stderr).strip().splitlines()[-1]


def test_a_run_whose_points_all_failed_exits_non_zero(tmp_path):
    path = write_tiny(tmp_path, "tiny", TINY + STEP_BOUND)
    result = molcap("run", str(path), "--out", "out", "--backend", "inline", cwd=tmp_path)
    assert result.returncode == FAILED_POINTS_EXIT, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "4 of 4 points failed" in last_line(result)
    assert "max_engine_steps=1 reached" in result.stderr  # why, once per point
    report = tmp_path / "out" / "tiny" / "report.html"
    assert "out/tiny/report.html" in last_line(result) and "Failed points" in report.read_text()
    assert (tmp_path / "out" / "tiny" / "comparisons.csv").is_file()  # what succeeded is kept


def test_a_run_with_some_failed_points_keeps_the_others(tmp_path):
    # Two files: one fails every point, the other succeeds; both are written, the exit says 1.
    bad = write_tiny(tmp_path, "bad", TINY.replace("name: tiny", "name: bad") + STEP_BOUND)
    good = write_tiny(tmp_path, "good", TINY.replace("name: tiny", "name: good"))
    result = molcap("run", str(bad), str(good), "--out", "out", "--backend", "inline",
                    cwd=tmp_path)
    assert result.returncode == FAILED_POINTS_EXIT, result.stdout + result.stderr
    assert "4 of 8 points failed" in last_line(result)
    plans = pd.read_csv(tmp_path / "out" / "good" / "tables" / "plans.csv")
    assert plans["is_feasible"].all() and len(plans) == 2


def test_a_sweep_with_failed_points_exits_non_zero(tmp_path):
    write_tiny(tmp_path, "tiny", TINY + STEP_BOUND)
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: failing\nscenario: tiny.yaml\nevaluate: simulate\nparameters:\n"
                    "  - {field: engine.max_num_seqs, values: [4, 8]}\n", encoding="utf-8")
    result = molcap("sweep", str(spec), "--out", "out", "--backend", "inline", cwd=tmp_path)
    assert result.returncode == FAILED_POINTS_EXIT, result.stdout + result.stderr
    assert "2 of 2 points failed" in last_line(result)
    assert "Traceback" not in result.stdout + result.stderr


def test_a_clean_run_exits_zero(tmp_path):
    path = write_tiny(tmp_path)
    result = molcap("run", str(path), "--out", "out", "--backend", "inline", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "failed" not in result.stdout + result.stderr
