"""Capacity planning with the real simulator as `evaluate`, and resumable `molcap run`."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.predict.simulation import simulate_strategy
from planner.scenario.loading import scenario_from_text
from planner.search.slo import slo_violations
from planner.search.strategy_plan import plan_strategy, with_deployment, with_rate, workload_shape

ROOT = Path(__file__).resolve().parents[2]
SMALL = """
name: small_plan
model: llama-3.1-8b
hardware: {gpu: H100-SXM}
engine: {max_num_seqs: 32, max_loras: 2, max_lora_rank: 16}
strategies:
  - kind: multi_lora
    adapters: [{name: a}, {name: b}, {name: c}]
  - kind: preft
    adapters: [{name: a}, {name: b}, {name: c}]
workload:
  kind: punica
  num_requests: 300
  num_adapters: 3
  num_output_tokens: 64
  arrival_rate_per_s: 12.0
slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.05}
search:
  gpus: [H100-SXM, A100-80GB]
  max_num_replicas: 8
  max_turns_per_evaluation: 120
  num_seeds: 2
analysis: {context_tokens: [512], decode_tokens_per_turn: [16], adapters_visited: [1]}
"""


@pytest.fixture(scope="module")
def scenario():
    return scenario_from_text(SMALL, "small.yaml")


def test_plan_is_feasible_and_verified_by_the_simulator(scenario):
    plan, dropped = plan_strategy(scenario, 0)
    assert plan.is_feasible and dropped == []
    chosen = plan.chosen
    assert chosen.rate_per_s == pytest.approx(12.0, rel=0.05)
    # Independently re-simulate the chosen deployment at the target rate with the same seeds.
    shape = workload_shape(scenario)
    point = with_rate(with_deployment(scenario, chosen.deployment), chosen.rate_per_s, shape)
    runs = [simulate_strategy(point, 0, seed=scenario.seed + s,
                              num_replicas=chosen.deployment.num_replicas).summary
            for s in range(2)]
    mean = {k: sum(r[k] for r in runs) / 2 for k in ("ttft_p99_s", "tpot_p99_s")}
    assert slo_violations(scenario.slo, mean) == []
    assert mean["ttft_p99_s"] == pytest.approx(chosen.mean["ttft_p99_s"])
    # Nothing cheaper among the verified alternatives.
    assert all(r.cost_per_hour_usd >= chosen.cost_per_hour_usd for r in plan.runner_ups)


def test_unreachable_slo_is_reported_infeasible(scenario):
    strict = scenario.model_copy(update={"slo": scenario.slo.model_copy(
        update={"ttft_p99_s": 1e-5})})
    plan, _ = plan_strategy(strict, 1)
    assert not plan.is_feasible and plan.chosen is None
    assert "misses the SLOs even at a trickle" in plan.reason


def _molcap_run(tmp_path: Path, *files: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", *map(str, files), "--out",
         str(tmp_path / "out"), "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # run from a background job, Ctrl-C would be ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_interrupted_run_resumes_without_recomputing(tmp_path):
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    points = tmp_path / "out" / "small_plan" / "points"
    first = _molcap_run(tmp_path, scenario)
    deadline = time.time() + 240
    while len(list(points.glob("*.json"))) < 1 and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C
    _, err = first.communicate(timeout=120)
    finished = {p.name: p.stat().st_mtime_ns for p in points.glob("*.json")}
    assert finished, "a point must have finished before the interruption"
    if first.returncode != 0:  # interrupted mid-run (it may also have just finished)
        assert first.returncode == 130 and "Traceback" not in err and "resume" in err
    second = _molcap_run(tmp_path, scenario)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    assert "capacity plan" in out and "multi_lora" in out
    after = {p.name: p.stat().st_mtime_ns for p in points.glob("*.json")}
    assert len(after) == 4  # a simulation and a plan per strategy
    assert all(after[name] == mtime for name, mtime in finished.items())
    assert (tmp_path / "out" / "small_plan" / "report.html").exists()
