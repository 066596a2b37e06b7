"""The CED turn as the write-up describes it: each turn incrementally encodes C[-W:] + U (no
adapter on the encoder), the global KV is written once per position, and the last W positions
are replayed through the decoder only when the window holds another adapter's KV. Each piece
is priced and shown in the turn's breakdown; engine_ext's way (the encoder keeps its window KV,
only U is encoded) is the named alternative `ced_encoder_window="kept"`."""

import numpy as np
import pytest
from sim_configs import small_config

from planner.predict.analysis import _replay_in_step_s
from planner.scenario.pricing import StrategyCosting
from sim.simulate import create_profile, simulate
from sim.workload.generate import Workload

DOMAINS = (0, 0, 1, 1, 2)


def serial(initial_tokens=4096) -> Workload:
    """One conversation, turns far apart (each runs alone on the replica)."""
    n = len(DOMAINS)
    return Workload(
        conv_arrival_s=np.zeros(1), conv_first_turn=np.zeros(1, int),
        conv_num_turns=np.array([n]), conv_initial_tokens=np.array([initial_tokens]),
        turn_domain=np.array(DOMAINS), turn_user_tokens=np.full(n, 96),
        turn_reply_tokens=np.full(n, 16), turn_think_s=np.array([0.0] + [100.0] * (n - 1)))


def run(kind="multi_lora", window="recompute", **engine):
    config = small_config(kind, model="ced-40", ced_encoder_window=window, **engine)
    return config, simulate(config, serial())


@pytest.mark.parametrize("kind", ("multi_lora", "mol2", "preft"))
def test_every_turn_after_a_cached_prefix_re_encodes_the_window(kind):
    config, result = run(kind)
    w = config.arch.ced.sliding_window_tokens
    turns, answers = result.turns, result.requests[result.requests.hop == "answer"]
    assert (turns.reencode_busy_s.iloc[1:] > 0).all()
    assert turns.reencode_busy_s.iloc[0] == 0  # nothing cached: the prefill encodes it all
    assert list(turns.num_reencode_tokens) == [0] + [w] * (len(DOMAINS) - 1)
    assert result.summary["num_reencode_tokens"] == w * (len(DOMAINS) - 1)
    # The global KV is written once: only the new tokens (and a partial block) are prefilled.
    assert (answers.num_prefill_tokens_computed.iloc[1:] < 96 + 16 + w).all()
    # The decoder window is replayed only where it holds another adapter's KV.
    assert list(turns.num_replay_tokens > 0) == [False, False, True, False, True]
    assert set(turns.num_replay_tokens) <= {0, w}


def test_the_re_encode_is_priced_as_the_encoder_over_w_positions_in_the_answer_step():
    config, recompute = run()
    _, kept = run(window="kept")
    assert (kept.turns.reencode_busy_s == 0).all()
    costing = StrategyCosting("x", "multi_lora", config.arch, config.gpu,
                              config.tensor_parallel_size, create_profile(config), config.coeffs,
                              config.arch.ced.sliding_window_tokens, "shared")
    ced = config.arch.ced
    for i in range(1, len(DOMAINS)):
        turn = recompute.turns.iloc[i]
        cached = recompute.requests.query("hop == 'answer'").num_cached_tokens.iloc[i]
        new = turn.num_context_tokens + turn.num_user_tokens - cached
        price = _replay_in_step_s(costing, new, cached, window_tokens=ced.sliding_window_tokens,
                                  layers=(0, ced.num_encoder_layers))
        assert price > 0
        assert turn.ttft_s - kept.turns.ttft_s.iloc[i] == pytest.approx(price, rel=1e-9)
    breakdown = recompute.turns[["prefill_busy_s", "reencode_busy_s", "replay_busy_s",
                                 "decode_busy_s"]]
    assert (breakdown.iloc[1:] >= 0).all().all()


def test_without_a_cached_prefix_the_prefill_writes_every_window():
    _, result = run(enable_prefix_caching=False)
    turns = result.turns
    assert (turns.reencode_busy_s == 0).all() and (turns.num_replay_tokens == 0).all()
    assert (turns.num_prefill_tokens_computed >= turns.num_context_tokens).all()


def test_a_decoder_only_model_has_no_encoder_window_to_re_encode():
    config = small_config("multi_lora")
    assert config.arch.ced is None
    assert (simulate(config, serial()).turns.reencode_busy_s == 0).all()


def test_disaggregated_prefill_workers_re_encode_and_the_turn_counts_it():
    from sim.config import ClusterSpec, DisaggregationSpec
    config = small_config("multi_lora", model="ced-40")
    config = config.model_copy(update={"cluster": ClusterSpec(
        disaggregation=DisaggregationSpec(num_prefill_workers=1, num_decode_workers=1))})
    result = simulate(config, serial())
    w = config.arch.ced.sliding_window_tokens
    assert list(result.turns.num_reencode_tokens) == [0] + [w] * (len(DOMAINS) - 1)
    sides = result.requests.groupby("hop", observed=True)["busy_reencode_s"].sum()
    assert sides["prefill"] > 0 and sides["answer"] == 0  # the decode side is the answer
