"""A scenario is resolved once, at load (`planner.scenario.resolved`): the workers of `molcap run`
receive that object and resolve nothing again."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

import planner.scenario.resolved as resolved_module
from planner.jobs.strategy_points import point_function, scenario_tasks
from planner.scenario.loading import load_resolved
from planner.scenario.resolved import resolve_scenario
from planner.scenario.schema import Scenario
from sim.cost.profile import PROFILES_DIR
from sim.io.points import PointStore, run_points

PROFILE = "h100-64gb-vllm085-llama-3.1-8b.yaml"

TINY = """\
name: tiny_resolved
model: llama-3.1-8b
hardware: {gpu: H100-64GB, profile: ./fitted.yaml}
strategies:
  - kind: multi_lora
    adapters: [{name: a, rank: 8}, {name: b, rank: 16}]
  - kind: base
workload: {kind: conversations, num_conversations: 4, num_turns: 2,
  num_initial_context_tokens: 128, num_user_tokens: 16, num_reply_tokens: 16,
  think_time_s: 1.0, arrival_rate_per_s: 2.0}
slo: {ttft_p99_s: 10}
search: {gpus: [H100-64GB, H20], tensor_parallel_sizes: [1], num_seeds: 1,
  max_turns_per_evaluation: 10, max_num_replicas: 2}
"""


@pytest.fixture
def scenario_file(tmp_path) -> Path:
    """The tiny scenario beside its own copy of a fitted profile, named by a relative path."""
    shutil.copy(PROFILES_DIR / PROFILE, tmp_path / "fitted.yaml")
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY, encoding="utf-8")
    return path


def _count_resolve_pricing(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = resolved_module.resolve_pricing

    def counted(*args, **kwargs):
        calls.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(resolved_module, "resolve_pricing", counted)
    return calls


def test_resolution_holds_the_pricing_of_every_gpu_the_search_may_choose(scenario_file):
    resolved = load_resolved(scenario_file)
    assert list(resolved.pricing) == ["H100-64GB", "H20"]
    own = resolved.source("H100-64GB")
    assert own.path == (scenario_file.parent / "fitted.yaml").resolve() and not own.is_default
    assert resolved.source("H20").is_default
    names = [Path(p).name for p, _ in resolved.inputs]
    assert names[0] == "fitted.yaml" and "h20-scaled-from-h100-64gb.yaml" in names
    with pytest.raises(ValueError, match="neither the scenario's hardware.gpu"):
        resolved.source("A100-80GB")
    again = pickle.loads(pickle.dumps(resolved))
    assert again == resolved


def test_workers_over_the_process_backend_read_the_resolved_object(scenario_file, tmp_path):
    """The profile file is gone once the scenario is resolved: a worker that resolved the
    pricing again would fail to read it, and its point would record the error."""
    resolved = load_resolved(scenario_file)
    (scenario_file.parent / "fitted.yaml").unlink()
    tasks = scenario_tasks(resolved, "sim") + scenario_tasks(resolved, "plan")
    records = run_points(tasks, point_function(resolved), PointStore(tmp_path / "points"),
                         backend="local", num_workers=2)
    assert {k: r.get("error") for k, r in records.items() if r["status"] != "ok"} == {}
    assert len(records) == 4
    with pytest.raises(Exception, match="fitted.yaml"):
        resolve_scenario(resolved.scenario)  # what a re-resolving worker would have met


def test_a_run_calls_resolve_pricing_once(scenario_file, tmp_path, monkeypatch):
    """Counted in this process (inline backend): loading resolves, the comparisons, the
    simulations and every trial of the capacity search read the resolution."""
    calls = _count_resolve_pricing(monkeypatch)
    from planner.predict.analysis import run_comparisons

    resolved = load_resolved(scenario_file)
    run_comparisons(resolved)
    tasks = scenario_tasks(resolved, "sim") + scenario_tasks(resolved, "plan")
    records = run_points(tasks, point_function(resolved), PointStore(tmp_path / "points"),
                         backend="inline")
    assert all(r["status"] == "ok" for r in records.values())
    assert calls == ["tiny_resolved"]


def test_a_whole_run_with_its_report_calls_resolve_pricing_once(scenario_file, tmp_path,
                                                                monkeypatch):
    """`molcap run` end to end (inline backend, so every point counts here): the interval
    columns of the tables and the report's charts read the run's resolution too."""
    from planner.jobs.run import run_scenario_file

    calls = _count_resolve_pricing(monkeypatch)
    result = run_scenario_file(scenario_file, tmp_path / "out", backend="inline")
    assert result.errors == {} and result.report_path.exists()
    assert "interval_profile" in result.plans
    assert calls == ["tiny_resolved"]


@pytest.mark.parametrize("evaluate", ["simulate", "analysis"])
def test_sweep_workers_over_the_process_backend_read_the_parents_resolution(
        scenario_file, tmp_path, monkeypatch, evaluate):
    """The parent resolves each point's scenario once; the profile file is gone before the
    workers start, so a worker that validated and resolved its point again would fail to read
    it and record the error. The stored payloads (and so the keys) stay plain JSON."""
    import planner.jobs.sweep as sweep_module

    real = sweep_module.resolve_points

    def resolve_then_delete(points):
        out = real(points)
        (scenario_file.parent / "fitted.yaml").unlink()
        return out

    monkeypatch.setattr(sweep_module, "resolve_points", resolve_then_delete)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"name: s\nscenario: {scenario_file.name}\nevaluate: {evaluate}\n"
                    "parameters:\n  - {field: workload.arrival_rate_per_s, values: [1.0, 2.0]}\n",
                    encoding="utf-8")
    result = sweep_module.run_sweep(spec, tmp_path / "out", backend="local", num_workers=2)
    assert result.errors == {} and result.num_points == 2
    assert set(result.table["strategy"]) == {"multi_lora", "base"}
    stored = sorted((tmp_path / "out" / "s" / "points").glob("*.json"))
    assert len(stored) == 2
    payload = json.loads(stored[0].read_text(encoding="utf-8"))["payload"]
    assert set(payload) == {"params", "scenario", "evaluate"}
    with pytest.raises(Exception, match="fitted.yaml"):  # what a re-resolving worker would meet
        resolve_scenario(Scenario.model_validate(payload["scenario"]))


def test_a_sweep_point_that_fails_to_resolve_records_its_error_and_the_others_run(
        scenario_file, tmp_path, monkeypatch):
    """Resolving in the parent does not stop the sweep at one bad point: that point's worker
    meets the same error and records it, as when the workers resolved their points."""
    import planner.jobs.sweep as sweep_module

    real = sweep_module.resolve_scenario

    def fails_at_rate_2(scenario, *args, **kwargs):
        if scenario.workload.arrival_rate_per_s == 2.0:
            raise ValueError("no pricing at rate 2")
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(sweep_module, "resolve_scenario", fails_at_rate_2)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"name: s\nscenario: {scenario_file.name}\n"
                    "parameters:\n  - {field: workload.arrival_rate_per_s, values: [1.0, 2.0]}\n",
                    encoding="utf-8")
    result = sweep_module.run_sweep(spec, tmp_path / "out", backend="inline")
    assert list(result.errors.values()) == ["ValueError: no pricing at rate 2"]
    assert set(result.table["workload.arrival_rate_per_s"]) == {1.0}


def test_layer_costs_are_built_once_per_strategy_gpu_and_engine_limits(scenario_file):
    # A sweep or a capacity search prices the same strategies on the same GPUs at every point:
    # a second resolution reuses the layer costs; another GPU or max_loras builds its own.
    from planner.scenario.resolved import create_strategy_costing
    from sim.hardware.catalogue import GPUS

    first = load_resolved(scenario_file)
    again = resolve_scenario(first.scenario, first.folder)
    lora = create_strategy_costing(first, 0).profile
    assert create_strategy_costing(again, 0).profile is lora
    h20 = create_strategy_costing(first, 0, gpu=GPUS["H20"]).profile
    assert h20 is not lora and h20.gpu.name == "H20"
    engine = first.scenario.engine.model_copy(update={"max_loras": 1})
    fewer = resolve_scenario(first.scenario.model_copy(update={"engine": engine}), first.folder)
    slots = create_strategy_costing(fewer, 0).profile
    assert slots is not lora and slots.lora_grid != lora.lora_grid
