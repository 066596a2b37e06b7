"""Rules that only indirect tests guarded (each was found by a mutation that left tests/sim
green): a CED switch at a context shorter than the replay window replays only that context,
a replay carries its LoRA cost, and admission counts the cached blocks it reuses."""

from __future__ import annotations

import numpy as np
import pytest
from sim_configs import small_config

from sim.config import EngineLimits
from sim.cost.cost_model import create_step_batch, predict_step
from sim.engine.scheduler import Engine
from sim.engine.sequence import Sequence
from sim.engine.step_plan import StepPlan
from sim.engine.step_pricer import StepPricer
from sim.simulate import create_profile

WINDOW = 128
"""The CED sliding window a switch replays."""


def _pricers():
    config = small_config("mol2")
    profile = create_profile(config)
    rfl = config.arch.ced.num_encoder_layers
    pricers = [StepPricer(config.coeffs, profile, replay_first_layer=rfl,
                          num_decode_compute_tokens=1, num_tokens_per_decode_step=1, is_fast=fast)
               for fast in (True, False)]
    return config, profile, rfl, pricers


def _replay_plan(num_replay_tokens: int, num_context_tokens: int) -> StepPlan:
    """A step that holds only one switch's replay, `num_context_tokens` into the conversation."""
    seq = Sequence(seq_id=1, hop="answer", adapter=3, kv_namespace=-1,
                   num_prompt_tokens=num_context_tokens + 8, num_output_tokens=16, submit_s=0.0,
                   num_computed_tokens=num_context_tokens, num_replay_tokens=num_replay_tokens,
                   num_replay_context_tokens=num_context_tokens)
    return StepPlan(replays=[seq])


def _expected_replay_s(profile, coeffs, rfl: int, num_tokens: int, num_context: int) -> float:
    """The replay priced from a batch built by hand: the last `num_tokens` positions before the
    context's end, through the decoder layers, under the target adapter."""
    batch = create_step_batch([num_tokens], [num_context - num_tokens],
                              num_layers=profile.num_layers, adapter_ids=[3], is_adapted=[True],
                              first_layer=[rfl], last_layer=[profile.num_layers],
                              is_replay=[True], is_last_chunk=[False], is_prompt=[False])
    return predict_step(coeffs, profile, batch).total_s


@pytest.mark.parametrize("num_context", [40, WINDOW - 1, WINDOW, 3 * WINDOW])
def test_a_switch_replays_the_window_or_the_whole_context_when_shorter(num_context):
    config, profile, rfl, pricers = _pricers()
    num = min(WINDOW, num_context)
    expected = _expected_replay_s(profile, config.coeffs, rfl, num, num_context)
    for pricer in pricers:
        plan = _replay_plan(WINDOW, num_context)
        batch = pricer.batch(plan)
        assert batch.num_new_tokens.tolist() == [num]
        assert batch.num_context_tokens.tolist() == [num_context - num]  # never negative
        assert pricer.step_s(plan) == pytest.approx(expected, rel=1e-12), pricer.is_fast


def test_a_short_context_replay_shares_the_table_entry_of_the_same_work():
    # The fast path keys its table by what a step computes: a 128-token window capped at a
    # 40-token context is the same step as a 40-token replay, so it is priced once.
    _, _, _, (fast, _) = _pricers()
    first = fast.step_s(_replay_plan(40, 40))
    calls = fast.num_predict_calls
    assert fast.step_s(_replay_plan(WINDOW, 40)) == first
    assert fast.num_predict_calls == calls


def test_a_replay_carries_its_lora_cost():
    config, profile, rfl, pricers = _pricers()
    num_context = 3 * WINDOW
    batch = create_step_batch([WINDOW], [num_context - WINDOW], num_layers=profile.num_layers,
                              adapter_ids=[3], is_adapted=[True], first_layer=[rfl],
                              last_layer=[profile.num_layers], is_replay=[True],
                              is_last_chunk=[False], is_prompt=[False])
    cost = predict_step(config.coeffs, profile, batch)
    unadapted = predict_step(config.coeffs, profile, create_step_batch(
        [WINDOW], [num_context - WINDOW], num_layers=profile.num_layers, adapter_ids=[3],
        is_adapted=[False], first_layer=[rfl], last_layer=[profile.num_layers],
        is_replay=[True], is_last_chunk=[False], is_prompt=[False]))
    as_chunk = predict_step(config.coeffs, profile, create_step_batch(
        [WINDOW], [num_context - WINDOW], num_layers=profile.num_layers, adapter_ids=[3],
        is_adapted=[True], first_layer=[rfl], last_layer=[profile.num_layers],
        is_last_chunk=[False], is_prompt=[False]))
    # A replay's every term lands in replay_s; its adapter's share is the LoRA term the same
    # tokens on the same layers cost as an ordinary item.
    assert as_chunk.lora_s > 0
    assert cost.replay_s - unadapted.replay_s == pytest.approx(as_chunk.lora_s, rel=1e-9)
    for pricer in pricers:  # the simulator prices a switch's replay as adapted
        plan = _replay_plan(WINDOW, num_context)
        assert pricer.batch(plan).is_adapted.tolist() == [True]
        assert pricer.step_s(plan) == pytest.approx(cost.total_s, rel=1e-12)


BLOCK = 16


def _stream_seq(seq_id: int, num_tokens: int) -> Sequence:
    """A prompt of `num_tokens` from conversation stream 1 (its full blocks are cacheable)."""
    return Sequence(seq_id=seq_id, hop="answer", adapter=-1, kv_namespace=-1,
                    num_prompt_tokens=num_tokens, num_output_tokens=1, submit_s=0.0,
                    stream_id=1, num_stream_prompt_tokens=num_tokens)


def _engine_after_a_cached_prompt(num_blocks: int) -> Engine:
    """An engine whose pool holds a finished 4-block prompt of stream 1, cached, unreferenced."""
    limits = EngineLimits(block_size=BLOCK, max_num_batched_tokens=4096)
    engine = Engine(limits, num_blocks, [0.0] * 4, check_invariants=True)
    engine.add(_stream_seq(0, 4 * BLOCK))
    now = 0.0
    while engine.num_outstanding:
        now += 1.0
        engine.commit(engine.schedule(now), 1, now)
    assert engine.kv.num_free == num_blocks and engine.kv.num_cached == 4
    return engine


def test_admission_reuses_cached_blocks_and_allocates_only_the_rest():
    # 6 blocks, 4 of them the cached prefix: a 6-block prompt of the same stream needs 2 new.
    engine = _engine_after_a_cached_prompt(6)
    seq = _stream_seq(1, 6 * BLOCK)
    engine.add(seq)
    plan = engine.schedule(10.0)
    assert plan.prefills == [(seq, 2 * BLOCK)]
    assert seq.num_cached_tokens == seq.num_computed_tokens == 4 * BLOCK
    assert seq.num_blocks == 6 and engine.kv.num_free == 0


def test_admission_counts_the_reused_blocks_as_no_longer_free():
    # 6 blocks, 4 cached: a 7-block prompt reuses 4 and needs 3 more, but only 2 others are
    # free (reusing the cached blocks takes them off the evictable list): it must wait.
    engine = _engine_after_a_cached_prompt(6)
    seq = _stream_seq(1, 7 * BLOCK)
    engine.add(seq)
    plan = engine.schedule(10.0)
    assert plan.prefills == [] and list(engine.waiting) == [seq]
    assert engine.kv.num_free == 6 and engine.kv.num_cached == 4
    engine.kv.check_invariants()


def test_the_pricer_flags_a_replay_item_as_a_replay():
    # The hand-built batches above must mean what the pricer builds: a replay item is flagged.
    _, _, _, (fast, _) = _pricers()
    batch = fast.batch(_replay_plan(WINDOW, 3 * WINDOW))
    assert np.asarray(batch.is_replay).tolist() == [True]
