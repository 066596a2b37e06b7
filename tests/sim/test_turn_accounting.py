"""What a turn's record counts: recomputed tokens are work done a second time (a first turn's
context is new), and an in-engine head's measured decision time is GPU work in its step, as a
measured time is a floor for every other router."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.simulate import simulate
from sim.workload.generate import Workload


def one_conversation(initial_tokens=2048, domains=(0, 1, 1)) -> Workload:
    """One conversation, turns far apart (each runs alone), switching domain once."""
    n = len(domains)
    return Workload(
        conv_arrival_s=np.zeros(1), conv_first_turn=np.zeros(1, int),
        conv_num_turns=np.array([n]), conv_initial_tokens=np.array([initial_tokens]),
        turn_domain=np.array(domains), turn_user_tokens=np.full(n, 64),
        turn_reply_tokens=np.full(n, 16), turn_think_s=np.array([0.0] + [100.0] * (n - 1)))


@pytest.mark.parametrize("kind", ("multi_lora", "mol2", "base"))
def test_a_first_turns_context_is_not_a_recompute(kind):
    turns = simulate(small_config(kind), one_conversation()).turns
    first = turns.iloc[0]
    assert first.num_prefill_tokens_computed >= 2048 + 64  # the whole prompt was computed
    assert first.num_recomputed_tokens == 0


def test_a_re_prefill_under_another_adapter_is_a_recompute():
    # Llama (per-adapter KV): the switched turn prefills the whole history under adapter 1;
    # the turn after it hits adapter 1's cache and recomputes at most the last block.
    turns = simulate(small_config("multi_lora"), one_conversation()).turns
    switched, after = turns.iloc[1], turns.iloc[2]
    assert switched.is_switch and switched.num_recomputed_tokens >= 2048
    assert after.num_recomputed_tokens <= 16


def serial_mol2(**fields):
    config = small_config("mol2", strategy_fields=dict(routing_accuracy=1.0, **fields))
    return simulate(config, one_conversation(domains=(0, 1, 2, 3)))


def test_an_in_engine_heads_measured_time_is_gpu_work_in_the_answer_step():
    derived = serial_mol2()
    measured = serial_mol2(measured_decision_time_s=0.25)
    tiny = serial_mol2(measured_decision_time_s=1e-9)
    # The head's own time is far below 0.25 s: each turn's first token comes that much later,
    # the GPUs are busy for it, and the routing GPU-seconds count it.
    head_s = derived.summary["routing_gpu_s"] / derived.summary["num_routed_turns"]
    extra = measured.turns["ttft_s"].to_numpy() - derived.turns["ttft_s"].to_numpy()
    np.testing.assert_allclose(extra, 0.25 - head_s / 8, rtol=1e-6)  # TP=8 GPUs per replica
    assert measured.summary["routing_gpu_s"] == pytest.approx(4 * 0.25 * 8, rel=1e-9)
    busy = [r.turns[["prefill_busy_s", "reencode_busy_s", "replay_busy_s"]].sum(axis=1)
            for r in (measured, derived)]
    np.testing.assert_allclose(busy[0] - busy[1], extra, rtol=1e-6)
    # A measured time below the head's own never makes it cheaper.
    assert tiny.summary["routing_gpu_s"] == pytest.approx(derived.summary["routing_gpu_s"])
