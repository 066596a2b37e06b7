"""MoL2 on a decoder-only model, routed in the engine after `route_layer` (what the molcap vLLM
plugin serves and `molcap verify` checks): the scenario rules and the simulation of it."""

from __future__ import annotations

import pytest

from planner.scenario.loading import ScenarioError, scenario_from_text

SCENARIO = """\
name: routed
model: {model}
hardware: {{gpu: cpu}}
engine: {{max_loras: 2, max_lora_rank: 8, block_size: 32}}
strategies:
  - kind: mol2
    {extra}
    adapters:
      - {{name: a0, rank: 8, target_modules: [q_proj, v_proj], layers: {layers}}}
      - {{name: a1, rank: 8, target_modules: [q_proj, v_proj], layers: [2, 3]}}
workload: {{kind: punica, num_requests: 20, num_adapters: 2, max_prompt_tokens: 64,
           num_output_tokens: 4, arrival_rate_per_s: 2.0}}
slo: {{e2e_p99_s: 60.0}}
search: {{num_seeds: 1}}
"""


def scenario(extra: str = "route_layer: 1", layers: str = "[2, 3]",
             model: str = "vllm-tiny-llama"):
    return scenario_from_text(SCENARIO.format(extra=extra, layers=layers, model=model))


def problems(**kwargs) -> str:
    with pytest.raises(ScenarioError) as err:
        scenario(**kwargs)
    return "\n".join(err.value.messages)


def test_adapters_above_the_route_layer_make_a_decoder_only_mol2_that_simulates():
    import numpy as np

    from planner.predict.simulation import create_workload
    from planner.verify.prepare import (
        PlannedDeployment,
        predict_replay,
        replica_scenario,
        scenario_deployment,
    )

    s = scenario()
    assert s.strategies[0].routing_layer(s.strategy_arch(0)) == (1, "its route_layer")
    planned = PlannedDeployment(0, "mol2", scenario_deployment(s), True, {}, "scenario")
    point = replica_scenario(s, planned, 20)
    workload = create_workload(point, 2, np.random.default_rng(0))
    summary = predict_replay(point, 0, workload, num_kv_blocks=256)
    assert summary["ttft_p50_s"] > 0 and summary["e2e_p99_s"] >= summary["ttft_p99_s"]


def test_without_route_layer_mol2_still_needs_a_ced_model():
    assert "'mol2' needs a causal encoder-decoder model" in problems(extra="routing: in_engine")


def test_an_adapter_at_or_below_the_route_layer_is_refused_naming_it():
    text = problems(layers="[1, 2, 3]")
    assert "strategies.0.adapters.0.layers: [1, 2, 3] reaches route_layer 1" in text
    assert "allowed: layers 2..3" in text
    assert "adapters.0.layers: every layer" in problems(layers="null")


def test_route_layer_routes_inside_the_engine_only_and_leaves_layers_above_it():
    assert "routing: 'outside_engine' with route_layer" in problems(
        extra="{route_layer: 1, routing: outside_engine}".strip("{}").replace(", ", "\n    "))
    assert "route_layer: 3 leaves no layer above it" in problems(extra="route_layer: 3")


def test_route_layer_on_a_ced_model_is_refused():
    text = problems(model="tiny-ced", layers="[5, 6]")
    assert "strategies.0.route_layer: 1 is for decoder-only models" in text
