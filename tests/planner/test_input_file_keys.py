"""A point's key covers the content of every file it reads: edit a trace, an output-length
trace or a cost profile between two `molcap run`s into the same --out, and the second run
computes new numbers (the same as a fresh folder) instead of reusing the first run's points."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from planner_helpers import REPO, molcap

TRACE_SCENARIO = """\
name: edited
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB}
strategies: [{kind: base}]
workload: {kind: trace, path: t.csv}
search: {max_turns_per_evaluation: 30, num_seeds: 1}
"""

PROFILE_SCENARIO = """\
name: edited
model: vllm-tiny-llama
hardware: {gpu: cpu, profile: profile.yaml}
engine: {version: "0.32.0", max_num_seqs: 8, block_size: 32}
strategies: [{kind: base}]
workload: {kind: punica, num_requests: 20, num_adapters: 1, num_output_tokens: 8,
           max_prompt_tokens: 400, arrival_rate_per_s: 2.0}
search: {max_turns_per_evaluation: 20, num_seeds: 1}
"""

LENGTHS_SCENARIO = """\
name: edited
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB}
strategies: [{kind: base}]
workload: {kind: conversations, num_conversations: 6, num_turns: 2,
           num_initial_context_tokens: 128, num_user_tokens: 32, num_reply_tokens: 16,
           think_time_s: 1.0, arrival_rate_per_s: 1.0,
           output_lengths: {distribution: trace, trace_path: lengths.csv,
                            trace_column: GeneratedTokens}}
search: {max_turns_per_evaluation: 12, num_seeds: 1}
"""


def _trace(output_tokens: int) -> str:
    rows = "".join(f"{0.5 * i},{100 + i},{output_tokens}\n" for i in range(30))
    return "timestamp,input_length,output_length\n" + rows


def _lengths(output_tokens: int) -> str:
    return "ContextTokens,GeneratedTokens\n" + f"10,{output_tokens}\n" * 5


def _run(folder: Path, out: str) -> dict[str, pd.DataFrame]:
    done = molcap("run", "s.yaml", "--out", out, "--workers", "1", cwd=folder)
    assert done.returncode == 0, done.stderr
    tables = folder / out / "edited" / "tables"
    return {name: pd.read_csv(tables / f"{name}.csv") for name in ("sim_turns", "sim_summary",
                                                                     "plans")}


def _edit_between_runs(tmp_path: Path, scenario: str, name: str, before: str, after: str):
    (tmp_path / "s.yaml").write_text(scenario, encoding="utf-8")
    (tmp_path / name).write_text(before, encoding="utf-8")
    first = _run(tmp_path, "out")
    (tmp_path / name).write_text(after, encoding="utf-8")
    again = _run(tmp_path, "out")
    fresh = _run(tmp_path, "fresh")
    for table in again:
        pd.testing.assert_frame_equal(again[table], fresh[table], check_exact=False, rtol=1e-12)
    return first, again


def test_an_edited_trace_reruns_its_points(tmp_path):
    first, again = _edit_between_runs(tmp_path, TRACE_SCENARIO, "t.csv", _trace(8), _trace(16))
    assert set(first["sim_turns"]["num_output_tokens"]) == {8}
    assert set(again["sim_turns"]["num_output_tokens"]) == {16}


def test_an_edited_output_length_trace_reruns_its_points(tmp_path):
    first, again = _edit_between_runs(tmp_path, LENGTHS_SCENARIO, "lengths.csv", _lengths(8),
                                      _lengths(24))
    assert set(first["sim_turns"]["num_output_tokens"]) == {8}
    assert set(again["sim_turns"]["num_output_tokens"]) == {24}


def test_an_edited_cost_profile_reruns_its_points(tmp_path):
    shipped = (REPO / "calibrate" / "profiles" / "cpu-vllm-tiny-llama.yaml").read_text()
    line = next(x for x in shipped.splitlines() if x.strip().startswith("gemm_flops_efficiency"))
    value = float(line.split(":")[1])
    slower = shipped.replace(line, line.replace(line.split(":")[1].strip(), repr(value / 4)))
    first, again = _edit_between_runs(tmp_path, PROFILE_SCENARIO, "profile.yaml", shipped,
                                      slower)
    assert (again["sim_summary"]["e2e_mean_s"] > first["sim_summary"]["e2e_mean_s"]).all()


def test_the_same_files_reuse_every_point(tmp_path):
    (tmp_path / "s.yaml").write_text(TRACE_SCENARIO, encoding="utf-8")
    (tmp_path / "t.csv").write_text(_trace(8), encoding="utf-8")
    _run(tmp_path, "out")
    points = tmp_path / "out" / "edited" / "points"
    before = {p.name: p.stat().st_mtime_ns for p in points.glob("*.json")}
    shutil.copy(tmp_path / "t.csv", tmp_path / "t2.csv")  # an unrelated file changes nothing
    (tmp_path / "t.csv").touch()  # nor does a new mtime with the same content
    _run(tmp_path, "out")
    assert {p.name: p.stat().st_mtime_ns for p in points.glob("*.json")} == before


def test_sweep_point_keys_follow_the_trace_content(tmp_path):
    from planner.jobs.sweep_spec import load_sweep

    (tmp_path / "base.yaml").write_text(TRACE_SCENARIO, encoding="utf-8")
    (tmp_path / "sweep.yaml").write_text(
        "name: s\nscenario: base.yaml\nparameters:\n"
        "  - {field: workload.rate_scale, values: [1.0, 2.0]}\n", encoding="utf-8")
    keys = []
    for output_tokens in (8, 16, 8):
        (tmp_path / "t.csv").write_text(_trace(output_tokens), encoding="utf-8")
        keys.append([p.key for p in load_sweep(tmp_path / "sweep.yaml")[1]])
    assert keys[0] == keys[2] and set(keys[0]).isdisjoint(keys[1])
