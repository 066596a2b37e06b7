"""The analysis and the simulation price a strategy's adapters with one rule: every LoRA slot at
engine.max_lora_rank (vLLM pads its buffers to it), over the union of the adapters' modules."""

import dataclasses

import numpy as np

from planner.predict.simulation import create_sim_config
from planner.scenario.pricing import adapter_pricing, create_strategy_costing
from planner.scenario.schema import Scenario
from sim.simulate import create_profile

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
