"""Routing accuracy: misroutes are sampled per routed turn, answered by a wrong adapter, counted,
and cost the extra switch when the next turn corrects them; client-named turns are always right
and skip the router."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.simulate import simulate
from sim.workload.generate import conversation_workload, with_named_share


def conversations(switch_probability=0.0, num_conversations=40, seed=0):
    return conversation_workload(
        np.random.default_rng(seed), num_conversations=num_conversations, num_turns=5,
        num_domains=4, switch_probability=switch_probability, num_initial_context_tokens=256,
        num_user_tokens=32, num_reply_tokens=8, think_time_s=0.1, arrival_rate_per_s=50.0)


def routed(kind, accuracy, workload, **fields):
    config = small_config(kind, max_num_seqs=16,
                          strategy_fields=dict(routing_accuracy=accuracy, **fields))
    return simulate(config, workload)


def answers(result):
    req = result.requests[result.requests.hop == "answer"]
    return req.set_index(["conv_id", "turn_index"])["adapter"]


@pytest.mark.parametrize("kind", ("mol", "contextual_mol", "mol2"))
def test_misroutes_follow_the_accuracy_and_are_answered_by_a_wrong_adapter(kind):
    result = routed(kind, 0.75, conversations())
    turns = result.turns.set_index(["conv_id", "turn_index"])
    n = len(turns)  # 200 routed turns: 50 misroutes expected, sd about 6
    assert result.summary["num_routed_turns"] == n
    assert 25 <= result.summary["num_misroutes"] <= 75
    assert result.summary["misroute_rate"] == result.summary["num_misroutes"] / n
    served = answers(result).loc[turns.index]
    assert (served[turns.is_misrouted] != turns.domain[turns.is_misrouted]).all()
    assert (served[~turns.is_misrouted] == turns.domain[~turns.is_misrouted]).all()


def test_a_perfect_router_and_a_client_named_adapter_never_misroute():
    assert routed("mol2", 1.0, conversations()).summary["num_misroutes"] == 0
    named = simulate(small_config("multi_lora"), conversations())
    assert named.summary["num_routed_turns"] == named.summary["num_misroutes"] == 0


def test_the_next_turn_corrects_a_misroute_with_an_extra_switch():
    # Conversations never change domain: every switch comes from a misroute or its correction.
    result = routed("mol2", 0.7, conversations(switch_probability=0.0))
    t = result.turns
    corrected = t.groupby("conv_id")["is_misrouted"].shift(1, fill_value=False)
    expected = t.is_misrouted | corrected
    expected &= t.turn_index > 0
    # A misroute right after a misroute to the same wrong adapter is not a switch.
    served = answers(result).loc[list(zip(t.conv_id, t.turn_index, strict=True))].to_numpy()
    prev = t.assign(s=served).groupby("conv_id")["s"].shift(1)
    expected &= prev.to_numpy() != served
    assert t.is_misrouted.sum() > 10
    assert (t.is_switch == expected).all()
    replayed = t[t.num_replay_tokens > 0]
    assert set(replayed.index) == set(t[t.is_switch].index)


def test_named_turns_skip_the_router_and_are_always_right():
    workload = with_named_share(np.random.default_rng(9), conversations(0.3), 0.5)
    result = routed("mol", 0.6, workload)
    t = result.turns
    named = workload.turn_is_named
    assert 60 < named.sum() < 140
    assert result.summary["num_routed_turns"] == (~named).sum()
    assert not t.is_misrouted[named].any()
    assert (t.route_s[named] == 0).all()
    routes = result.requests[result.requests.hop == "route"]
    assert len(routes) == (~named).sum()


def serial_turns():
    """One conversation, long think times: every turn runs alone on the replica."""
    return conversation_workload(
        np.random.default_rng(1), num_conversations=1, num_turns=6, num_domains=4,
        switch_probability=0.5, num_initial_context_tokens=512, num_user_tokens=64,
        num_reply_tokens=16, think_time_s=50.0, arrival_rate_per_s=1.0)


def test_in_engine_routing_costs_the_heads_time_over_a_fixed_route():
    from sim.cost.cost_model import routing_decision_s
    from sim.simulate import create_profile
    fixed = simulate(small_config("multi_lora", model="ced-40"), serial_turns())
    routed_in = simulate(small_config("mol2", strategy_fields={"routing_accuracy": 1.0}),
                         serial_turns())
    config = small_config("mol2")
    head = routing_decision_s(config.coeffs, create_profile(config), 1)
    extra = routed_in.turns["ttft_s"].to_numpy() - fixed.turns["ttft_s"].to_numpy()
    np.testing.assert_allclose(extra, head, rtol=1e-6)
    assert routed_in.summary["routing_gpu_s"] == pytest.approx(
        6 * head * config.tensor_parallel_size, rel=1e-9)
    assert fixed.summary["routing_gpu_s"] == 0


@pytest.mark.parametrize(("kind", "fields"), [("mol", {}), ("contextual_mol", {}),
                                              ("mol2", {"routing": "outside_engine"})])
def test_a_router_outside_the_engine_costs_at_least_its_own_pass_even_when_measured(kind, fields):
    derived = routed(kind, 1.0, serial_turns(), **fields)
    fast = routed(kind, 1.0, serial_turns(), measured_decision_time_s=1e-6, **fields)
    slow = routed(kind, 1.0, serial_turns(), measured_decision_time_s=2.0, **fields)
    passes = derived.turns["routing_busy_s"].to_numpy()
    assert (passes > 0).all()
    # A measured time never makes the pass free: the GPU work is the same, the decision takes
    # at least the pass and at least the measured time.
    for run in (fast, slow):
        assert run.summary["routing_gpu_s"] == pytest.approx(derived.summary["routing_gpu_s"])
    assert (fast.turns["route_s"].to_numpy() >= passes * (1 - 1e-9)).all()
    assert (slow.turns["route_s"].to_numpy() >= 2.0 * (1 - 1e-9)).all()


def test_a_dedicated_router_pool_runs_every_routing_pass_and_no_answer():
    from sim.config import ClusterSpec
    config = small_config("mol", max_num_seqs=16, strategy_fields={"routing_accuracy": 1.0})
    pooled = config.model_copy(update={"cluster": ClusterSpec(num_replicas=2,
                                                              num_router_replicas=1)})
    result = simulate(pooled, conversations(num_conversations=10))
    hops = result.requests.groupby("hop", observed=True)["replica"].apply(set)
    assert hops["route"] == {2}  # the pool's replica comes after the two serving ones
    assert hops["answer"] <= {0, 1} and hops["summary"] <= {0, 1}
    assert result.stats["num_replicas"] == 3
    assert result.summary["routing_gpu_s"] > 0
