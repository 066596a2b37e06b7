"""Routing accuracy: misroutes are sampled per routed turn, answered by a wrong adapter, counted,
and cost the extra switch when the next turn corrects them; client-named turns are always right
and skip the router."""

import numpy as np
import pytest

from sim.simulate import simulate
from sim.testing import small_config
from sim.workloads import conversation_workload, with_named_share


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
