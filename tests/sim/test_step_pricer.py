"""The fast step pricer (`sim.engine.step_pricer`) against its definition, bit for bit: a step
costs what `predict_step` says of the step's batch, a run of decode steps ends where its steps
added one by one end, and `steps_to_reach` is the first step that ends at or after a time. The
batch itself is checked item by item against what each kind of item computes."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sim_configs import small_config

from sim.engine import step_pricer
from sim.engine.decode_group import DecodeGroup
from sim.engine.decode_run import DecodeRun, ListedDecodeRun, delay_to
from sim.engine.sequence import Sequence
from sim.engine.step_plan import StepPlan
from sim.engine.step_pricer import StepPricer
from sim.simulate import create_profile


def _pricers(ndct: int = 1, adv: int = 1):
    """(fast, reference) pricers of the CED model (replays and re-encodes are priced)."""
    config = small_config("contextual_mol")
    coeffs = config.coeffs.model_copy(update={"prompt_step_overhead_s": 1e-3})
    profile = create_profile(config)
    rfl = config.arch.ced.num_encoder_layers
    return [StepPricer(coeffs, profile, replay_first_layer=rfl, num_decode_compute_tokens=ndct,
                       num_tokens_per_decode_step=adv, is_fast=fast) for fast in (True, False)]


def _seq(seq_id: int, adapter: int, computed: int, prompt: int | None = None,
         **fields) -> Sequence:
    return Sequence(seq_id=seq_id, hop="answer", adapter=adapter, kv_namespace=adapter,
                    num_prompt_tokens=computed if prompt is None else prompt,
                    num_output_tokens=64, submit_s=0.0, num_computed_tokens=computed,
                    num_generated_tokens=0 if prompt is not None else 1, **fields)


def _random_plan(rng: random.Random, num_layers: int, *, plain: bool) -> StepPlan:
    """A step of random shape: prompt chunks (ending their prompt or not, adapted or not, over
    all layers or, unless `plain`, a part), decodes (some as a decode group), and, unless
    `plain`, replays and re-encodes."""
    plan, ids = StepPlan(), iter(range(10_000))
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        computed, chunk = rng.choice((0, 64, 700)), rng.choice((1, 2, 17, 256, 257, 1024, 2048))
        seq = _seq(next(ids), rng.choice((-1, 0, 1, 2)), computed,
                   prompt=computed + chunk + rng.choice((0, 0, 1, 300)),
                   is_prefill_adapted=rng.random() < 0.7)
        seq.num_output_tokens = rng.choice((0, 64))
        if not plain and rng.random() < 0.3:
            seq.first_layer, seq.last_layer = rng.choice(((0, 12), (12, -1), (0, num_layers)))
        plan.prefills.append((seq, chunk))
    decodes = [_seq(next(ids), rng.choice((-1, 0, 1, 2, 3)), rng.randrange(1, 5000),
                    is_decode_adapted=rng.random() < 0.7)
               for _ in range(rng.choice((0, 1, 3, 6)))]
    num_group = rng.randrange(len(decodes) + 1) if decodes and rng.random() < 0.5 else 0
    if num_group:
        plan.group = DecodeGroup(block_size=16, tokens_per_step=1)
        for order, seq in enumerate(decodes[:num_group]):
            seq.num_blocks = seq.num_computed_tokens // 16 + 2
            plan.group.join(seq, order)
        plan.num_group_decodes = num_group
        plan.decode_contexts = np.array([s.num_computed_tokens for s in decodes], np.int64)
    plan.decodes = decodes
    if not plain:
        for _ in range(rng.choice((0, 1, 1, 2))):
            context = rng.choice((40, 127, 128, 900))
            plan.replays.append(_seq(next(ids), rng.choice((-1, 1, 2)), context,
                                     num_replay_tokens=128, num_replay_context_tokens=context))
        if rng.random() < 0.4:
            context = rng.choice((64, 640))
            plan.reencodes.append(_seq(next(ids), rng.choice((-1, 1)), context,
                                       num_reencode_tokens=128,
                                       num_reencode_context_tokens=context,
                                       is_prefill_adapted=rng.random() < 0.5))
    plan.num_routing_decisions = rng.choice((0, 0, 1, 2))
    if not (plan.prefills or plan.decodes or plan.replays or plan.reencodes):
        plan.decodes = [_seq(9999, 1, 333)]
    return plan


@pytest.mark.parametrize("plain", (True, False), ids=("plain steps", "mixed steps"))
@pytest.mark.parametrize("ndct", (1, 3))
def test_every_step_costs_what_predict_step_says_of_its_batch(plain, ndct):
    # The fast path caches non-attention seconds by counts: two steps that differ in anything
    # those seconds depend on must not share an entry, whatever order they come in. Many
    # random steps through one pricer make any key that forgets a count collide.
    fast, reference = _pricers(ndct)
    rng = random.Random(ndct * 2 + plain)
    plans = [_random_plan(rng, fast.profile.num_layers, plain=plain) for _ in range(250)]
    expected = [reference.step_s(plan) for plan in plans]
    for plan, seconds in zip(plans, expected, strict=True):
        assert fast.step_s(plan) == seconds
    assert fast.num_predict_calls < len(plans)  # the table is used, so keys repeat


def _pair(chunk_a: list[tuple[int, int]], chunk_b: list[tuple[int, int]]):
    """Two steps with the same switch's replay, differing only in their prompt chunks, given as
    (computed, tokens); none of them ends its prompt."""
    plans = []
    for chunks in (chunk_a, chunk_b):
        prefills = [(_seq(i, 1, computed, prompt=computed + num + 50), num)
                    for i, (computed, num) in enumerate(chunks)]
        replay = _seq(9, 2, 700, num_replay_tokens=128, num_replay_context_tokens=700)
        plans.append(StepPlan(prefills=prefills, replays=[replay]))
    return plans


@pytest.mark.parametrize("chunks", [
    ([(0, 1000)], [(0, 499), (0, 500)]),  # tokens + items equal, not tokens and items
    ([(0, 1000)], [(0, 999)]),
    ([(0, 1000), (0, 1000)], [(0, 1000)]),
])
def test_mixed_steps_with_other_chunk_tokens_or_counts_are_priced_apart(chunks):
    fast, reference = _pricers()
    for plan in _pair(*chunks):
        assert fast.step_s(plan) == reference.step_s(plan)


def _plain_step(chunks: list[tuple[int, int]], num_decodes: int, **fields) -> StepPlan:
    """Prompt chunks given as (tokens, tokens left in the prompt after it), of no adapter,
    then decodes of no adapter."""
    prefills = [(_seq(i, -1, 0, prompt=num + left, **fields), num)
                for i, (num, left) in enumerate(chunks)]
    return StepPlan(prefills=prefills, decodes=[_seq(10 + i, -1, 500) for i in range(num_decodes)])


@pytest.mark.parametrize("pair", [
    # The same tokens and items, one chunk samples and one does not. (Hundreds of decodes: the
    # LM head is compute-bound, so one more sampled row costs its FLOPs.)
    (_plain_step([(4000, 0)], 600), _plain_step([(4000, 5)], 600)),
    # the same tokens and items, one more sampled row
    (_plain_step([(4000, 5)], 601), _plain_step([(2000, 5), (2001, 5)], 600)),
    # the same tokens and items, over all layers or the first 12 only
    (_plain_step([(300, 5)], 1), _plain_step([(300, 5)], 1, last_layer=12)),
    # the same items and sampled rows, 4000 tokens with one decode or 4004 with two (a key
    # mixing tokens and decodes as (tokens + 1) ^ decodes gives both 4000)
    (_plain_step([(3000, 0), (999, 5)], 1), _plain_step([(4002, 5)], 2)),
    # the same tokens and items over the first 12 layers or the first 20
    (_plain_step([(300, 5)], 1, last_layer=20), _plain_step([(300, 5)], 1, last_layer=12)),
], ids=("sampling", "samples", "tokens", "all layers or some", "other layers"))
def test_steps_that_differ_in_one_count_are_priced_apart(pair):
    fast, reference = _pricers()
    for plan in pair:
        assert fast.step_s(plan) == reference.step_s(plan)
    assert reference.step_s(pair[0]) != reference.step_s(pair[1])


def test_each_item_of_a_mixed_step_is_in_the_batch_as_what_it_computes():
    fast, _ = _pricers()
    rfl, num_layers = fast.replay_first_layer, fast.profile.num_layers
    turn = _seq(10, 2, 640, prompt=1000, num_reencode_tokens=128,
                num_reencode_context_tokens=640)  # a CED turn's chunk after a cached prefix
    ending = _seq(11, -1, 0, prompt=300)  # a whole prompt in one chunk: it samples
    ending.is_prefill_adapted = False
    switch = _seq(12, 3, 700, num_replay_tokens=128, num_replay_context_tokens=512)
    short = _seq(13, 1, 60, num_replay_tokens=128, num_replay_context_tokens=60)
    decodes = [_seq(20, 0, 1000, is_decode_adapted=False), _seq(21, 1, 1037)]
    batch = fast.batch(StepPlan(prefills=[(turn, 260), (ending, 300)], decodes=decodes,
                                replays=[switch, short], reencodes=[turn],
                                num_routing_decisions=2))
    assert batch.num_new_tokens.tolist() == [260, 300, 1, 1, 128, 60, 128]
    assert batch.num_context_tokens.tolist() == [640, 0, 1000, 1037, 512 - 128, 0, 640 - 128]
    assert batch.adapter_ids.tolist() == [2, -1, 0, 1, 3, 1, 2]
    assert batch.is_adapted.tolist() == [True, False, False, True, True, True, True]
    assert batch.first_layer.tolist() == [0, 0, 0, 0, rfl, rfl, 0]
    assert batch.last_layer.tolist() == [num_layers] * 6 + [rfl]
    assert batch.is_replay.tolist() == [False] * 4 + [True] * 3
    assert batch.is_last_chunk.tolist() == [False, True, True, True, False, False, False]
    assert batch.is_prompt.tolist() == [True, True] + [False] * 5
    assert batch.num_routing_decisions == 2


@pytest.mark.parametrize("adv", (1, 4))
@pytest.mark.parametrize("start_s", (0.0, 12.345))
@pytest.mark.parametrize("listed", (True, False))
def test_a_decode_run_ends_where_its_steps_end_one_by_one(adv, start_s, listed, monkeypatch):
    # Priced whole in plain floats (a short run), or in numpy chunks.
    monkeypatch.setattr(step_pricer, "MAX_LISTED_RUN_VALUES", 10**9 if listed else 0)
    fast, reference = _pricers(adv=adv)
    # The last context reaches 4961 + 40 = 5001 at adv 1: past the table's first 4096 entries,
    # at an odd index (a table one entry short would end at 5000).
    decodes = [_seq(i, i % 3 - 1, 100 + 900 * i) for i in range(4)] + [_seq(4, 1, 4961)]
    contexts = np.array([s.num_computed_tokens for s in decodes], np.int64)
    num_steps = 40
    run = fast.decode_run(StepPlan(decodes=decodes), start_s, num_steps)
    assert isinstance(run, ListedDecodeRun) == listed
    now = start_s
    for step in range(num_steps + 1):  # the clock of the step-by-step path, bit for bit
        assert run.end_s(step) == now, step
        now += reference.step_s(StepPlan(decodes=decodes, decode_contexts=contexts + adv * step))
    assert list(run.step_s(num_steps)) == np.diff([run.end_s(k) for k in range(41)]).tolist()


def _first_step_at_or_after(run: DecodeRun, time_s: float, max_steps: int) -> int:
    return next((k for k in range(1, max_steps + 1) if run.end_s(k) >= time_s), max_steps)


def _check_steps_to_reach(new_run, max_steps: int) -> None:
    # Each time is searched on a fresh run: how far a run is priced depends on what it was
    # asked before.
    ends = [new_run().end_s(k) for k in range(max_steps + 1)]
    targets = [ends[0] - 1.0, ends[0], ends[-1], ends[-1] * 1.5]
    for k in range(1, max_steps + 1):
        targets += [ends[k], (ends[k - 1] + ends[k]) / 2, np.nextafter(ends[k], np.inf)]
    for time_s in targets:
        assert new_run().steps_to_reach(time_s, max_steps) == \
            _first_step_at_or_after(new_run(), time_s, max_steps), time_s


@pytest.mark.parametrize("shape", ("rising", "falling", "flat stretches"))
def test_steps_to_reach_is_the_first_step_that_ends_at_or_after_a_time(shape):
    # Step times that rise steeply, fall or stay at zero for a while (equal step ends: the
    # first of them counts).
    steps = np.arange(1, 301, dtype=float)
    step_s = {"rising": steps ** 3, "falling": 1 / steps,
              "flat stretches": (steps % 50 < 25) * 1.0}[shape]
    for max_steps in (300, 37):
        _check_steps_to_reach(lambda n=max_steps: DecodeRun(
            0.0, n, lambda first, count: step_s[first:first + count]), max_steps)


@pytest.mark.parametrize("listed", (True, False))
def test_steps_to_reach_in_a_priced_decode_run(listed, monkeypatch):
    monkeypatch.setattr(step_pricer, "MAX_LISTED_RUN_VALUES", 10**9 if listed else 0)
    fast, _ = _pricers(adv=64)  # contexts grow fast: attention takes over from the constant
    decodes = [_seq(1, 1, 1), _seq(2, 2, 10)]
    assert isinstance(fast.decode_run(StepPlan(decodes=decodes), 3.0, 400),
                      ListedDecodeRun) == listed
    _check_steps_to_reach(lambda: fast.decode_run(StepPlan(decodes=decodes), 3.0, 400), 400)


def test_a_timer_delay_lands_on_the_step_end_exactly():
    # A run's timer ends at `now + delay` in SimPy: the delay must make that the very float the
    # step-by-step clock reaches, over every scale of times, at binade edges included.
    rng = np.random.default_rng(0)
    now = rng.uniform(0.0, 1.0, 5000) * 10.0 ** rng.integers(-6, 4, 5000)
    end = now + rng.uniform(0.0, 1.0, 5000) * 10.0 ** rng.integers(-6, 4, 5000)
    pairs = list(zip(now.tolist(), end.tolist(), strict=True)) + [(0.0, 0.1), (5.0, 5.0)]
    pairs += [(np.nextafter(2.0 ** k, 0.0), 2.0 ** (k + j)) for k in range(-3, 4) for j in (0, 1)]
    for n, e in pairs:
        delay = delay_to(n, e)
        assert delay >= 0.0 and n + delay == e, (n, e)
