"""The analysis and the simulation price a strategy's adapters with one rule: every LoRA slot at
engine.max_lora_rank (vLLM pads its buffers to it), over the union of the adapters' modules.
Both read it from the scenario's one resolution (`planner.scenario.resolved`)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from planner.predict.simulation import create_sim_config, strategy_spec
from planner.scenario.loading import load_resolved
from planner.scenario.pricing import adapter_pricing
from planner.scenario.resolved import create_strategy_costing, resolve_scenario
from planner.scenario.schema import Scenario
from planner.search.slo_search import Deployment
from planner.search.strategy_plan import with_deployment
from sim.simulate import create_profile

REPO = Path(__file__).resolve().parents[2]

MIXED = [{"name": "small", "rank": 8, "target_modules": ["q_proj", "v_proj"]},
         {"name": "wide", "rank": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"]}]


def scenario(kind="multi_lora", adapters=MIXED, max_lora_rank=32, **strategy):
    return Scenario.model_validate(dict(
        model="llama-3.1-8b", hardware=dict(gpu="H100-SXM"),
        engine=dict(max_num_seqs=8, max_lora_rank=max_lora_rank),
        strategies=[dict(kind=kind, adapters=adapters, **strategy)]))


def _same(a, b) -> list[str]:
    """Fields (dotted, into nested records) where two LayerCosts differ."""
    out = []
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y):
            out += [f"{f.name}.{name}" for name in _same(x, y)]
        elif not np.array_equal(np.asarray(x), np.asarray(y)):
            out.append(f.name)
    return out


def test_analysis_and_simulation_price_mixed_adapters_identically():
    s = scenario()
    analysis = create_strategy_costing(s, 0).profile
    simulation = create_profile(create_sim_config(s, 0))
    assert _same(analysis, simulation) == []
    assert analysis.adapter_rank == 32  # max_lora_rank, not the largest adapter's 16
    pricing = adapter_pricing(s.strategies[0], s.strategy_arch(0), 32)
    assert {m for _, m in pricing.placements} == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"}


def test_each_adapter_still_loads_its_own_bytes():
    config = create_sim_config(scenario(), 0)
    small, wide = config.strategy.adapters
    assert 0 < small.num_bytes_per_gpu < wide.num_bytes_per_gpu


def test_the_base_model_prices_no_adapter():
    s = Scenario.model_validate(dict(
        model="llama-3.1-8b", strategies=[dict(kind="base")]))
    assert create_strategy_costing(s, 0).profile.adapter_kind == "none"
    assert create_profile(create_sim_config(s, 0)).adapter_kind == "none"


def _default():
    return load_resolved(REPO / "scenarios" / "default.yaml")


@pytest.mark.parametrize("index", range(len(_default().scenario.strategies)))
def test_every_strategy_of_the_default_scenario_is_priced_alike(index):
    """Each strategy kind of the shipped scenario: the analysis's layer costs and the
    simulator's, built from the same resolution, agree field by field, and the simulator's
    adapter numbers are the resolved ones."""
    resolved = _default()
    analysis = create_strategy_costing(resolved, index)
    config = create_sim_config(resolved, index)
    assert _same(analysis.profile, create_profile(config)) == []
    assert analysis.coeffs == config.coeffs
    own = resolved.strategies[index]
    assert analysis.kv_layout == config.strategy.kv_layout == own.kv_layout
    assert config.strategy.adapter_kind == own.adapters.kind
    if own.adapters.kind != "none":
        assert config.strategy.adapter_rank == own.adapters.rank
        assert tuple(config.strategy.adapter_placements) == own.adapters.placements


def test_a_search_point_on_another_gpu_is_priced_alike():
    """The capacity search prices a candidate analytically (its rate bound) and simulates it:
    on another GPU kind and TP both read that kind's resolved coefficients and the same
    adapter pricing."""
    s = scenario().model_copy(update=dict(search=scenario().search.model_copy(
        update=dict(gpus=("H100-SXM", "H20")))))
    resolved = resolve_scenario(s)
    d = Deployment("H20", 2, 1, 8, 4)
    point = resolved.at(with_deployment(s, d))
    config = create_sim_config(point, 0)
    analysis = create_strategy_costing(point, 0)
    assert config.gpu.name == "H20"
    assert config.tensor_parallel_size == analysis.tensor_parallel_size == 2
    assert _same(analysis.profile, create_profile(config)) == []
    assert config.coeffs == analysis.coeffs == resolved.coeffs("H20")
    assert resolved.coeffs("H20") != resolved.coeffs("H100-SXM")


def test_adapter_bytes_per_gpu_split_over_the_tp_group():
    s = scenario()
    resolved = resolve_scenario(s)
    one = strategy_spec(resolved, 0).adapters
    two = strategy_spec(resolved.at(with_deployment(s, Deployment("H100-SXM", 2, 1, 8, 4))),
                        0).adapters
    assert [a.num_bytes_per_gpu / 2 for a in one] == [a.num_bytes_per_gpu for a in two]
