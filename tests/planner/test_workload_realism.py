"""Scenario inputs of workload realism and routing quality, resolved as the simulator sees them:
router accuracy (a number, a curve over domains, or the published default), output lengths
(fixed, lognormal, sampled from a trace), mixed named/routed traffic, per-strategy reply scale."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from sim_configs import small_config

from planner.predict.simulation import create_workload, strategy_spec
from planner.scenario.schema import Scenario
from sim.simulate import simulate
from sim.workload.generate import conversation_workload
from sim.workload.traces import TRACES_DIR


def adapters(n):
    return [{"name": f"d{i}"} for i in range(n)]


def scenario(strategy=None, workload=None):
    return Scenario.model_validate(dict(
        model="ced-40", hardware=dict(gpu="H200", num_gpus_per_replica=8, tensor_parallel_size=8),
        strategies=[strategy or {"kind": "mol2", "adapters": adapters(4)}],
        workload=workload or {"kind": "punica", "num_requests": 400, "num_output_tokens": 100}))


CURVE = [{"num_domains": 1, "accuracy": 1.0}, {"num_domains": 4, "accuracy": 0.96},
         {"num_domains": 16, "accuracy": 0.84}]


@pytest.mark.parametrize(("num_adapters", "expected"), [(2, 1 - 0.04 / 3), (8, 0.92), (32, 0.84)])
def test_router_accuracy_curve_is_read_at_the_number_of_domains(num_adapters, expected):
    s = scenario({"kind": "contextual_mol", "adapters": adapters(num_adapters),
                  "router_accuracy_curve": CURVE})
    assert strategy_spec(s, 0).routing_accuracy == pytest.approx(expected, rel=1e-12)


def test_router_accuracy_defaults_to_the_published_figure_and_a_number_wins():
    assert strategy_spec(scenario(), 0).routing_accuracy == 0.9463  # MoL2 5-seed mean
    s = scenario({"kind": "mol2", "adapters": adapters(4), "router_accuracy": 0.5})
    assert strategy_spec(s, 0).routing_accuracy == 0.5
    assert strategy_spec(scenario({"kind": "multi_lora", "adapters": adapters(4)}),
                         0).routing_accuracy == 1.0  # the client names the adapter
    with pytest.raises(ValidationError, match="both given"):
        scenario({"kind": "mol2", "adapters": adapters(4), "router_accuracy": 0.9,
                  "router_accuracy_curve": CURVE})


def replies(output_lengths, **workload):
    w = {"kind": "punica", "num_requests": 400, "num_output_tokens": 100,
         "output_lengths": output_lengths, **workload}
    return create_workload(scenario(workload=w), 4, np.random.default_rng(0)).turn_reply_tokens


def test_output_lengths_fixed_lognormal_or_from_a_trace():
    assert (replies({}) == 100).all()
    lognormal = replies({"distribution": "lognormal", "lognormal_sigma": 1.0,
                         "max_tokens": 10_000})
    assert 80 < np.median(lognormal) < 125 and lognormal.std() > 50
    assert lognormal.min() >= 1
    clipped = replies({"distribution": "lognormal", "max_tokens": 150})
    assert clipped.max() == 150
    sampled = replies({"distribution": "trace"})
    trace = TRACES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    column = np.loadtxt(trace, delimiter=",", skiprows=1, usecols=2, dtype=np.int64)
    assert set(sampled) <= set(column) and len(set(sampled)) > 50
    # The prompts are the same whatever the output distribution.
    base = create_workload(scenario(), 4, np.random.default_rng(0))
    w = {"kind": "punica", "num_requests": 400, "num_output_tokens": 100,
         "output_lengths": {"distribution": "lognormal"}}
    other = create_workload(scenario(workload=w), 4, np.random.default_rng(0))
    assert (base.turn_user_tokens == other.turn_user_tokens).all()


def test_mixed_traffic_names_a_share_of_the_turns():
    w = {"kind": "conversations", "num_conversations": 100, "num_turns": 4,
         "named_adapter_share": 0.25}
    named = create_workload(scenario(workload=w), 4, np.random.default_rng(0)).turn_is_named
    assert 70 < named.sum() < 130
    assert create_workload(scenario(), 4, np.random.default_rng(0)).turn_is_named is None


def test_a_strategy_scales_its_own_reply_lengths():
    s = scenario({"kind": "preft", "adapters": adapters(2), "output_length_scale": 1.5})
    assert strategy_spec(s, 0).output_length_scale == 1.5
    workload = conversation_workload(np.random.default_rng(0), num_conversations=3, num_turns=2,
                                     num_domains=2, num_reply_tokens=20, num_user_tokens=16,
                                     num_initial_context_tokens=64)
    scaled = simulate(small_config("preft", strategy_fields={"output_length_scale": 1.5}),
                      workload).turns
    assert (scaled.num_output_tokens == 30).all()
    assert (scaled.groupby("conv_id").num_context_tokens.diff().dropna() == 16 + 30).all()
