"""An offline throughput scenario (no arrival rate: every request at t=0) is simulated and
reported; `molcap run` and `molcap validate` say in one line that planning needs a rate."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from planner.scenario.workloads import OFFLINE_NOTE

OFFLINE = """\
name: offline
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB}
strategies:
  - kind: base
  - kind: multi_lora
    adapters: [{name: chat, rank: 8}, {name: code, rank: 8}]
workload: {kind: punica, num_requests: 24, num_output_tokens: 8}
analysis: {context_tokens: [512], adapters_visited: [1], decode_tokens_per_turn: [16],
           decision_every_tokens: [32], distinct_adapters: [1], decode_batch_size: 2}
"""


def molcap(*args, cwd):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_offline_scenario_is_simulated_and_says_planning_needs_a_rate(tmp_path):
    path = tmp_path / "offline.yaml"
    path.write_text(OFFLINE, encoding="utf-8")
    checked = molcap("validate", str(path), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.count(OFFLINE_NOTE) == 1
    done = molcap("run", str(path), "--out", str(tmp_path / "out"), "--backend", "inline",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(OFFLINE_NOTE) == 1
    assert "failed" not in done.stdout + done.stderr
    # No plan: the pricing line names the profile of the scenario's own GPU.
    assert "  A100-80GB priced by profile a100-80gb-" in done.stdout, done.stdout
    tables = tmp_path / "out" / "offline" / "tables"
    summary = pd.read_csv(tables / "sim_summary.csv")
    assert list(summary["strategy"]) == ["base", "multi_lora"]
    assert (summary["num_turns"] == 24).all() and (summary["output_tokens_per_s"] > 0).all()
    assert not (tables / "plans.csv").exists()
    assert OFFLINE_NOTE in (tmp_path / "out" / "offline" / "report.html").read_text()
