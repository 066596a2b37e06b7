"""`molcap calibrate` on bad input: exit 2, one located line, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "calibrate" / "profiles" / "cpu-vllm-tiny-llama.yaml"


def molcap(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "app.cli", "calibrate", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_validate_with_a_broken_profile_exits_2_with_its_location(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(SHIPPED.read_text().replace("  step_overhead_s: ",
                                                  "  step_overhead_s: -1 #", 1))
    line = next(i for i, ln in enumerate(broken.read_text().splitlines(), 1)
                if "step_overhead_s: -1" in ln)
    done = molcap("validate", "--profile", str(broken), "--out", "v", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{broken}:{line}: coefficients.step_overhead_s: " in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "v").exists()


def test_fit_without_profiled_samples_exits_2_naming_the_folder(tmp_path):
    done = molcap("fit", "--samples", "nothing-here", "--out", "profiles", cwd=tmp_path)
    assert done.returncode == 2
    assert "nothing-here" in done.stderr and "molcap calibrate measure" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "profiles").exists()


@pytest.mark.parametrize("command", ["measure", "profile"])  # profile: the old name, kept
def test_measure_rejects_an_unknown_engine(tmp_path, command):
    done = molcap(command, "--engine", "tgi", cwd=tmp_path)
    assert done.returncode == 2 and "'tgi'" in done.stderr and "vllm, ced, all" in done.stderr


def test_gpu_commands_on_a_missing_or_incomplete_slice_exit_2_with_one_line(tmp_path):
    for command in ("validate-gpu", "fit-gpu"):
        done = molcap(command, "--data-dir", "no-such-slice", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (f"calibrate {command}: no-such-slice: no such folder "
                                       "(the agullo-dt slice)")
    (tmp_path / "empty").mkdir()
    done = molcap("validate-gpu", "--data-dir", "empty", "--docs", "d", "--profiles", "p",
                  cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("calibrate validate-gpu: empty: agullo-dt slice lacks "
                                   "derived/runs_summary.csv.gz, overhead_steps.csv")
    done = molcap("fit-gpu", "--data-dir", "empty", "--out", "p", cwd=tmp_path)
    assert done.returncode == 2 and "empty/derived/runs_summary.csv.gz: missing" in done.stderr
    assert "Traceback" not in done.stderr
    assert not any((tmp_path / name).exists() for name in ("d", "p"))
