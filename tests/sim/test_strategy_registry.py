"""A strategy is one object behind a registry: a new one, defined here, registered with one line
and simulated, with no change to the simulator."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.config import StrategySpec
from sim.simulate import simulate
from sim.strategies.registry import STRATEGIES, get_strategy, register
from sim.strategies.strategy import Strategy
from sim.workload.generate import conversation_workload

SHIPPED = ("base", "multi_lora", "preft", "mol", "contextual_mol", "mol2", "multi_agent")
CLASSIFIER_TOKENS = 96


class ClassifierRouted(Strategy):
    """A LoRA per domain, chosen by a classifier that reads the conversation plus a fixed prompt
    on the base model and emits one token."""

    kind = "classifier_routed"
    is_routing = True

    def route_hop(self, spec, num_prompt_tokens, routing_last_layer):
        return dict(hop="route", adapter=-1, num_prompt_tokens=num_prompt_tokens
                    + CLASSIFIER_TOKENS, num_output_tokens=1)


@pytest.fixture
def registered():
    register(ClassifierRouted())
    yield
    del STRATEGIES[ClassifierRouted.kind]


def _workload():
    return conversation_workload(
        np.random.default_rng(0), num_conversations=6, num_turns=3, num_domains=4,
        switch_probability=0.5, num_initial_context_tokens=256, num_user_tokens=64,
        num_reply_tokens=16, think_time_s=0.1, arrival_rate_per_s=10.0)


def test_every_shipped_kind_is_registered():
    assert set(SHIPPED) <= set(STRATEGIES)
    assert all(get_strategy(kind).kind == kind for kind in SHIPPED)


def test_an_unknown_kind_names_the_registered_ones():
    with pytest.raises(KeyError, match="registered: .*multi_lora"):
        get_strategy("nope")
    with pytest.raises(ValueError, match="unknown strategy kind 'nope'"):
        StrategySpec(kind="nope")


def test_a_strategy_defined_in_a_test_simulates(registered):
    base = small_config("multi_lora", max_num_seqs=8)
    config = base.model_copy(update={"strategy": base.strategy.model_copy(
        update={"kind": ClassifierRouted.kind})})
    workload = _workload()
    result = simulate(config, workload, timeseries_interval_s=0.0)
    plain = simulate(base, workload, timeseries_interval_s=0.0)
    requests = result.requests
    routes = requests[requests["hop"] == "route"]
    assert len(result.turns) == workload.num_turns
    assert len(routes) == workload.num_turns  # every turn is routed, one pass each
    assert (routes["num_output_tokens"] == 1).all()
    context = result.turns["num_context_tokens"] + result.turns["num_user_tokens"]
    assert sorted(routes["num_prompt_tokens"]) == sorted(context + CLASSIFIER_TOKENS)
    assert result.turns["e2e_s"].sum() > plain.turns["e2e_s"].sum()
    assert not (plain.requests["hop"] == "route").any()
