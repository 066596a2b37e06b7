"""The real `molcap` console script, end to end, in a subprocess."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
_SCRIPT = shutil.which("molcap", path=str(Path(sys.executable).parent))
COMMAND = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "app.cli"]

SMALL = """\
name: small
description: Three strategies on a small model.
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB}
strategies:
  - kind: base
  - kind: multi_lora
    adapters: [{name: chat, rank: 8}, {name: code, rank: 8}]
  - kind: preft
    adapters: [{name: chat, rank: 8}, {name: code, rank: 8}]
workload: {kind: conversations, num_turns: 3}
analysis:
  context_tokens: [512, 2048]
  adapters_visited: [1, 2]
  decode_tokens_per_turn: [16, 256]
  decision_every_tokens: [32]
  distinct_adapters: [1, 2]
  decode_batch_size: 4
"""

# name -> (file text, line, field path, words the message must hold)
BAD = {
    "malformed_yaml": ("name: [demo\nstrategies: [{kind: base}]\n", 2, "malformed YAML", []),
    "duplicate_key": ("seed: 1\nstrategies: [{kind: base}]\nseed: 2\n", 3, "malformed YAML",
                      ["duplicate key 'seed'"]),
    "unknown_key": ("engine:\n  max_num_seqz: 4\nstrategies: [{kind: base}]\n", 2,
                    "engine.max_num_seqz", ["unknown key", "'max_num_seqs'"]),
    "wrong_type": ("engine:\n  block_size: big\nstrategies: [{kind: base}]\n", 2,
                   "engine.block_size", ["'big'", "integer"]),
    "negative": ("engine:\n  max_loras: -3\nstrategies: [{kind: base}]\n", 2, "engine.max_loras",
                 ["-3", "greater than or equal to 1"]),
    "absurd_rate": ("workload:\n  kind: punica\n  arrival_rate_per_s: 1.0e+30\n"
                    "strategies: [{kind: base}]\n", 3, "workload.arrival_rate_per_s",
                    ["1e+30", "less than or equal to 1000000"]),
    "context_too_long": ("workload:\n  kind: punica\n  max_prompt_tokens: 140000\n"
                         "strategies: [{kind: base}]\n", 3, "workload.max_prompt_tokens",
                         ["140128", "131072"]),
    "rank_above_max": ("strategies:\n  - kind: multi_lora\n    adapters:\n"
                       "      - {name: chat, rank: 32}\n", 4, "strategies.0.adapters.0.rank",
                       ["32", "max_lora_rank=16"]),
    "lora_on_ced_encoder": ("model: ced-40\nhardware: {gpu: H200, num_gpus_per_replica: 8, "
                            "tensor_parallel_size: 8}\nstrategies:\n  - kind: mol2\n"
                            "    adapters:\n      - {name: chat, layers: [3]}\n", 6,
                            "strategies.0.adapters.0.layers", ["(3, 'q_proj')", "'mol2'"]),
    "does_not_fit": ("model: llama-3.1-70b\nhardware: {gpu: H20}\nstrategies: [{kind: base}]\n",
                     2, "hardware", ["llama-3.1-70b", "H20", "allowed"]),
    "unknown_model": ("model: llama-9\nstrategies: [{kind: base}]\n", 1, "model",
                      ["'llama-9'", "llama-3.1-8b"]),
}


def molcap(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", "NO_COLOR": "1"}
    return subprocess.run([*COMMAND, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_validate_good_files(tmp_path):
    small = write(tmp_path, "small.yaml", SMALL)
    shipped = sorted(str(p) for p in (REPO / "scenarios").glob("*.yaml"))
    result = molcap("validate", str(small), *shipped, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert f"ok {small}" in result.stdout
    for path in shipped:
        assert f"ok {path}" in result.stdout


@pytest.mark.parametrize("case", sorted(BAD))
def test_validate_bad_file_exits_2_with_located_message(tmp_path, case):
    text, line, field, words = BAD[case]
    path = write(tmp_path, f"{case}.yaml", text)
    result = molcap("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    located = [m for m in result.stderr.splitlines() if m.startswith(f"{path}:{line}: {field}")]
    assert len(located) == 1, result.stderr
    for word in words:
        assert word in located[0], (word, located[0])


def test_validate_reports_every_bad_file_and_passes_the_good_one(tmp_path):
    good = write(tmp_path, "good.yaml", SMALL)
    bad1 = write(tmp_path, "bad1.yaml", BAD["negative"][0])
    bad2 = write(tmp_path, "bad2.yaml", BAD["unknown_model"][0])
    result = molcap("validate", str(bad1), str(good), str(bad2), cwd=tmp_path)
    assert result.returncode == 2
    assert f"ok {good}" in result.stdout
    assert f"{bad1}:2: engine.max_loras" in result.stderr
    assert f"{bad2}:1: model" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_missing_file(tmp_path):
    result = molcap("validate", str(tmp_path / "absent.yaml"), cwd=tmp_path)
    assert result.returncode == 2
    assert "absent.yaml" in result.stderr and "Traceback" not in result.stderr


def test_schema_to_stdout_and_to_file(tmp_path):
    result = molcap("schema", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["title"] == "Scenario"
    assert {"strategies", "workload", "hardware", "engine"} <= set(schema["properties"])
    out = tmp_path / "scenario.schema.json"
    assert molcap("schema", "--out", str(out), cwd=tmp_path).returncode == 0
    assert json.loads(out.read_text()) == schema


def test_run_writes_report_and_tables(tmp_path):
    scenario = write(tmp_path, "small.yaml", SMALL)
    result = molcap("run", str(scenario), "--out", str(tmp_path / "reports"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out_dir = tmp_path / "reports" / "small"
    report = out_dir / "report.html"
    assert str(report) in result.stdout
    html = report.read_text(encoding="utf-8")
    assert "<html" in html.lower() and "small" in html
    # Self-contained: no script or stylesheet fetched from anywhere (plotly.js is inlined; its
    # source mentions URLs in strings, so look at the tags, not at every string).
    assert re.search(r"<script[^>]*\bsrc=", html) is None
    assert re.search(r"<link[^>]*\bhref=", html) is None
    assert html.count("<script") >= 2  # the inlined library and at least one figure
    csv = pd.read_csv(out_dir / "comparisons.csv")
    parquet = pd.read_parquet(out_dir / "comparisons.parquet")
    assert len(csv) == len(parquet) > 0
    assert set(csv["strategy"]) == {"base", "multi_lora", "preft"}
    assert {"kv_per_conversation", "switch_cost", "routing_vs_reply_length",
            "routing_vs_decision_frequency", "decode_step_vs_adapters"} <= set(csv["comparison"])
    assert csv["value"].notna().all()


def test_run_on_bad_scenario_exits_2_and_writes_nothing(tmp_path):
    path = write(tmp_path, "bad.yaml", BAD["rank_above_max"][0])
    result = molcap("run", str(path), "--out", str(tmp_path / "reports"), cwd=tmp_path)
    assert result.returncode == 2
    assert f"{path}:4: strategies.0.adapters.0.rank" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "reports").exists()
