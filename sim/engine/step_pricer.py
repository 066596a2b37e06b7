"""Step times for the engine: the reference calls `predict_step` per step; the fast path prices a
whole run of decode steps at once.

Within a step only attention depends on the contexts; every other term of `predict_step` depends
on token counts, adapters and sequences, which a run of decode steps keeps fixed. So a decode
step k of a run costs `const + sum_i T[c_i + k * adv]`, where `T[c]` is one decode item's
attention at context c (`sim.cost.cost_model.attention_s_per_item`). `T` is tabulated once per
replica and prefix-summed, so the time of any number of steps is O(batch) to evaluate. The
non-attention part is cached by the counts it depends on, read off the plan without building a
`StepBatch`; a step holding replays, re-encodes or partial-layer prefills is priced the same way
(its counts kept per kind of item), so only a new combination of counts calls `predict_step`.
"""

from __future__ import annotations

import math

import numpy as np

from sim.cost.cost_model import (
    CostCoeffs,
    StepBatch,
    StepCost,
    attention_s_per_item,
    create_step_batch,
    predict_counted_step,
    predict_step,
)
from sim.cost.layer_costs import LayerCosts
from sim.engine.step_plan import StepPlan

MAX_CACHED_CHUNKS = 1 << 16
"""Attention seconds of prompt chunks, replays and re-encodes kept per pricer (cleared when
full: memory stays bounded on runs of millions of distinct prompts)."""


def reencode_span(seq) -> tuple[int, int]:
    """(tokens, cached tokens it ends at) of a sequence's encoder-window re-encode."""
    end = seq.num_reencode_context_tokens
    return min(seq.num_reencode_tokens, end), end


class DecodeRun:
    """Times of a run of identical-structure decode steps: cumulative seconds after j steps.

    `prefix[x]` is Q[x - adv] (0 below adv) for the strided prefix sum Q of the decode attention
    table: an item at context c spends prefix[c + adv * j] - prefix[c] on attention in j steps.
    """

    def __init__(self, const_s: float, contexts: np.ndarray, prefix: np.ndarray, adv: int):
        self.const_s, self.contexts, self.prefix, self.adv = const_s, contexts, prefix, adv
        self._base = prefix[contexts]
        self._elapsed: dict[int, float] = {}

    def elapsed_s(self, num_steps: int) -> float:
        """Seconds of the first `num_steps` steps."""
        seconds = self._elapsed.get(num_steps)
        if seconds is None:
            last = self.contexts + self.adv * num_steps
            seconds = num_steps * self.const_s + float((self.prefix[last] - self._base).sum())
            self._elapsed[num_steps] = seconds
        return seconds

    def steps_to_reach(self, elapsed_s: float, max_steps: int) -> int:
        """Fewest steps (>= 1, at most `max_steps`) whose end lies at or after `elapsed_s` into
        the run. Step ends grow about linearly (attention grows slowly with the contexts), so
        the search starts at the linear guess from the run's end, widens until it brackets the
        step and bisects: a few evaluations of `elapsed_s`, each O(batch). Exact because
        `elapsed_s` never decreases with the steps (every term it sums does not)."""
        if elapsed_s <= 0:
            return 1
        ends_after = self.elapsed_s
        guess = min(max_steps, max(1, math.ceil(max_steps * elapsed_s / ends_after(max_steps))))
        # Bracket: ends_after(lo) < elapsed_s (lo = 0 ends at 0) and elapsed_s <= ends_after(hi)
        # or hi = max_steps.
        width = 1
        if ends_after(guess) >= elapsed_s:
            lo, hi = max(0, guess - 1), guess
            while lo > 0 and ends_after(lo) >= elapsed_s:
                lo, hi, width = max(0, lo - 2 * width), lo, 2 * width
        else:
            lo, hi = guess, min(max_steps, guess + 1)
            while hi < max_steps and ends_after(hi) < elapsed_s:
                lo, hi, width = hi, min(max_steps, hi + 2 * width), 2 * width
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ends_after(mid) >= elapsed_s else (mid, hi)
        return hi


def non_attention_s(cost: StepCost) -> float:
    """The step's seconds but attention: its other terms summed (so that the value depends on
    those terms only, not on the float rounding of the attention it leaves out)."""
    return (cost.dense_gemm_s + cost.moe_gemm_s + cost.lora_s + cost.direft_s + cost.replay_s
            + cost.routing_s + cost.communication_s + cost.overhead_s)


_SHARED_NON_ATTENTION: dict[str, dict[tuple, float]] = {}
"""Non-attention step seconds by pricing identity, kept across runs of one process: a capacity
search simulates the same deployment many times (seeds, rates) and re-pricing the same step
shapes is most of a short run's pricing."""
MAX_SHARED_TABLES = 32


class StepPricer:
    """Prices engine steps for one replica."""

    def __init__(self, coeffs: CostCoeffs, profile: LayerCosts, *, replay_first_layer: int,
                 num_decode_compute_tokens: int, num_tokens_per_decode_step: int,
                 is_fast: bool, shared_key: str | None = None):
        """`shared_key` names everything `predict_step` depends on besides the batch (the
        coefficients and what built the profile); pricers with the same key share one cache."""
        self.coeffs, self.profile = coeffs, profile
        self.replay_first_layer = replay_first_layer
        self.num_decode_compute_tokens = num_decode_compute_tokens
        self.adv = num_tokens_per_decode_step
        self.is_fast = is_fast
        self._non_attention_s: dict[tuple, float] = {}
        if shared_key is not None:
            key = f"{shared_key}|{replay_first_layer}|{num_decode_compute_tokens}"
            if key not in _SHARED_NON_ATTENTION and len(_SHARED_NON_ATTENTION) >= \
                    MAX_SHARED_TABLES:
                del _SHARED_NON_ATTENTION[next(iter(_SHARED_NON_ATTENTION))]  # the oldest
            self._non_attention_s = _SHARED_NON_ATTENTION.setdefault(key, {})
        self._strided_prefix = np.zeros(0)
        self._chunk_attention_s: dict[tuple[int, int, int, int], float] = {}
        self._table = np.zeros(0)
        self.num_predict_calls = 0
        # Per-layer widths the cost model multiplies token counts by: while they are whole
        # numbers, its sums over items are exact (below 2**53), and a plain step is priced from
        # its counts (`predict_counted_step`).
        widths = (profile.adapter_weights_prefix, profile.lora_wrapped_in_prefix,
                  profile.lora_wrapped_out_prefix)
        self._max_exact_tokens = 0
        if all(np.array_equal(w, np.round(w)) for w in widths):
            largest = max(1.0, *(float(np.abs(w).max(initial=0.0)) for w in widths))
            self._max_exact_tokens = int(2.0**52 / largest)

    def batch(self, plan: StepPlan) -> StepBatch:
        """The cost model's view of `plan`'s first step."""
        num_layers = self.profile.num_layers
        new, ctx, ids, adapted, first, last, replay, samples = [], [], [], [], [], [], [], []
        for seq, num_new in plan.prefills:
            seq_last = num_layers if seq.last_layer < 0 else seq.last_layer
            ends_prompt = seq.num_computed_tokens + num_new == seq.num_tokens
            new.append(num_new), ctx.append(seq.num_computed_tokens), ids.append(seq.adapter)
            adapted.append(seq.is_prefill_adapted), first.append(seq.first_layer)
            last.append(seq_last), replay.append(False)
            samples.append(ends_prompt and seq.num_output_tokens > 0)
        contexts = self.decode_contexts(plan).tolist()
        for seq, context in zip(plan.decodes, contexts, strict=True):
            new.append(self.num_decode_compute_tokens), ctx.append(context)
            ids.append(seq.adapter), adapted.append(seq.is_decode_adapted), first.append(0)
            last.append(num_layers), replay.append(False), samples.append(True)
        for seq in plan.replays:
            num_replay = min(seq.num_replay_tokens, seq.num_replay_context_tokens)
            new.append(num_replay), ctx.append(seq.num_replay_context_tokens - num_replay)
            ids.append(seq.adapter), adapted.append(True), first.append(self.replay_first_layer)
            last.append(num_layers), replay.append(True), samples.append(False)
        for seq in plan.reencodes:  # rebuilds existing positions' encoder KV: priced as replay
            num, ctx_end = reencode_span(seq)
            new.append(num), ctx.append(ctx_end - num), ids.append(seq.adapter)
            adapted.append(seq.is_prefill_adapted), first.append(0)
            last.append(self.replay_first_layer), replay.append(True), samples.append(False)
        return create_step_batch(
            new, ctx, num_layers=num_layers, adapter_ids=ids, is_adapted=adapted,
            first_layer=first, last_layer=last, is_replay=replay, is_last_chunk=samples,
            is_prompt=[True] * len(plan.prefills) + [False] * (len(new) - len(plan.prefills)),
            num_routing_decisions=plan.num_routing_decisions)

    def step_s(self, plan: StepPlan) -> float:
        """Seconds of one step of `plan`, adapter loads included."""
        if not self.is_fast:
            self.num_predict_calls += 1
            return predict_step(self.coeffs, self.profile, self.batch(plan)).total_s \
                + plan.adapter_load_s
        attention = 0.0
        if plan.prefills or plan.replays or plan.reencodes:
            attention += self._other_attention_total_s(plan)
        if plan.decodes:
            contexts = self.decode_contexts(plan)
            try:  # the table usually covers every context already: no max to take
                per_item = self._table[contexts]
            except IndexError:
                per_item = self._decode_table(int(contexts.max()))[contexts]
            attention += float(per_item.sum())
        return self._cached_non_attention_s(plan) + attention + plan.adapter_load_s

    def _other_attention_total_s(self, plan: StepPlan) -> float:
        """Attention seconds of every item but the decodes (prompt chunks, replays, re-encodes),
        each over its own layers, summed. An item's seconds depend only on its (tokens, context,
        first layer, last layer), `attention_s_per_item` being elementwise, so they are cached
        by that key; the sum is numpy's over the items in plan order, the sum of pricing them
        together."""
        items = self._other_items(plan)
        cache = self._chunk_attention_s
        missing = [item for item in items if item not in cache]
        if missing:
            if len(cache) + len(missing) > MAX_CACHED_CHUNKS:
                cache.clear()
                missing = items
            new, ctx, first, last = (np.array(column) for column in zip(*missing, strict=True))
            seconds = attention_s_per_item(self.coeffs, self.profile, new, ctx, first, last)
            cache.update(zip(missing, seconds.tolist(), strict=True))
        if len(items) == 1:
            return cache[items[0]]
        return float(np.array([cache[item] for item in items]).sum())

    def _other_items(self, plan: StepPlan) -> list[tuple[int, int, int, int]]:
        """(tokens, context, first layer, last layer) of each prefill chunk, replay and
        re-encode of `plan`, in that order."""
        num_layers, rfl = self.profile.num_layers, self.replay_first_layer
        items = [(num_new, seq.num_computed_tokens, seq.first_layer,
                  num_layers if seq.last_layer < 0 else seq.last_layer)
                 for seq, num_new in plan.prefills]
        for seq in plan.replays:
            num = min(seq.num_replay_tokens, seq.num_replay_context_tokens)
            items.append((num, seq.num_replay_context_tokens - num, rfl, num_layers))
        for seq in plan.reencodes:
            num, end = reencode_span(seq)
            items.append((num, end - num, 0, rfl))
        return items

    def _plan_key(self, plan: StepPlan) -> tuple:
        """What the non-attention terms of a full-layer, replay-free step depend on: tokens,
        sampled tokens, adapted tokens, distinct adapters, items, routing decisions, and
        whether it has a prompt chunk."""
        num_tokens = num_samples = num_adapted = 0
        adapters = set()
        for seq, num_new in plan.prefills:
            num_tokens += num_new
            if seq.num_computed_tokens + num_new == seq.num_tokens and seq.num_output_tokens:
                num_samples += 1
            if seq.is_prefill_adapted and seq.adapter >= 0:
                num_adapted += num_new
                adapters.add(seq.adapter)
        num_adapted_decodes = 0
        if plan.num_group_decodes:  # counted by the group as members join and leave
            num_adapted_decodes = plan.group.num_adapted
            adapters.update(plan.group.adapters)
        for seq in plan.decodes[plan.num_group_decodes:]:
            if seq.is_decode_adapted and seq.adapter >= 0:
                num_adapted_decodes += 1
                adapters.add(seq.adapter)
        ndct, num_decodes = self.num_decode_compute_tokens, len(plan.decodes)
        return (num_tokens + ndct * num_decodes, num_samples + num_decodes,
                num_adapted + ndct * num_adapted_decodes, len(adapters),
                len(plan.prefills) + num_decodes, plan.num_routing_decisions,
                bool(plan.prefills))

    def _is_plain(self, plan: StepPlan) -> bool:
        """No replay, no re-encode and every prefill over all layers: `_plan_key` prices it."""
        num_layers = self.profile.num_layers
        return not (plan.replays or plan.reencodes or any(
            seq.first_layer != 0 or 0 <= seq.last_layer != num_layers
            for seq, _ in plan.prefills))

    def _mixed_key(self, plan: StepPlan) -> tuple:
        """What the non-attention seconds of any step depend on: per kind of item (its layers,
        replay or not, sampling or not, prompt chunk or not, adapted or not) its tokens and
        items, the distinct adapters of the adapted items, the routing decisions. (The step's
        total splits its terms between replays and the rest, but the split does not change the
        sum.) A CED turn's re-encode or a switch's replay puts one such item into a step, so
        these keys repeat."""
        num_layers, rfl = self.profile.num_layers, self.replay_first_layer
        groups: dict[tuple, list[int]] = {}
        adapters: set[int] = set()

        def add(kind: tuple, num_tokens: int, adapter: int, is_adapted: bool) -> None:
            is_adapted = is_adapted and adapter >= 0
            totals = groups.setdefault((*kind, is_adapted), [0, 0])
            totals[0] += num_tokens
            totals[1] += 1
            if is_adapted:
                adapters.add(adapter)

        for seq, num_new in plan.prefills:
            samples = seq.num_computed_tokens + num_new == seq.num_tokens \
                and seq.num_output_tokens > 0
            last = num_layers if seq.last_layer < 0 else seq.last_layer
            add((seq.first_layer, last, False, samples, True), num_new, seq.adapter,
                seq.is_prefill_adapted)
        for seq in plan.decodes:
            add((0, num_layers, False, True, False), self.num_decode_compute_tokens, seq.adapter,
                seq.is_decode_adapted)
        for seq in plan.replays:
            num = min(seq.num_replay_tokens, seq.num_replay_context_tokens)
            add((rfl, num_layers, True, False, False), num, seq.adapter, True)
        for seq in plan.reencodes:
            add((0, rfl, True, False, False), reencode_span(seq)[0], seq.adapter,
                seq.is_prefill_adapted)
        return ("mixed", tuple(sorted((k, *v) for k, v in groups.items())), len(adapters),
                plan.num_routing_decisions)

    def _cached_non_attention_s(self, plan: StepPlan) -> float:
        """Every term but attention: a function of counts only (`_plan_key` for full-layer,
        replay-free steps, `_mixed_key` for the others), computed once per key."""
        is_plain = self._is_plain(plan)
        key = self._plan_key(plan) if is_plain else self._mixed_key(plan)
        cached = self._non_attention_s.get(key)
        if cached is None:
            self.num_predict_calls += 1
            if is_plain and key[0] <= self._max_exact_tokens:
                num_tokens, num_samples, num_adapted, num_adapters, num_items, num_routing, \
                    has_prompt = key
                cached = non_attention_s(predict_counted_step(
                    self.coeffs, self.profile, num_tokens=num_tokens, num_samples=num_samples,
                    num_adapted_tokens=num_adapted, num_adapters=num_adapters,
                    num_items=num_items, has_prompt=has_prompt,
                    num_routing_decisions=num_routing))
                self._non_attention_s[key] = cached
                return cached
            batch = self.batch(plan)
            cost = predict_step(self.coeffs, self.profile, batch)
            if is_plain:
                cached = non_attention_s(cost)
            else:  # replay_s holds the replays' attention too: take every item's out
                cached = cost.total_s - float(attention_s_per_item(
                    self.coeffs, self.profile, batch.num_new_tokens, batch.num_context_tokens,
                    batch.first_layer, batch.last_layer).sum())
            self._non_attention_s[key] = cached
        return cached

    def decode_run(self, plan: StepPlan, num_steps: int) -> DecodeRun:
        """Step times of repeating the pure-decode `plan` up to `num_steps` times."""
        const_s = self._cached_non_attention_s(plan)
        contexts = self.decode_contexts(plan)
        max_index = int(contexts.max()) + self.adv * num_steps
        return DecodeRun(const_s, contexts, self._prefix(max_index), self.adv)

    @staticmethod
    def decode_contexts(plan: StepPlan) -> np.ndarray:
        """Context tokens of each of `plan`'s decodes, in order."""
        if plan.decode_contexts is not None:
            return plan.decode_contexts
        return np.fromiter((s.num_computed_tokens for s in plan.decodes), np.int64,
                           count=len(plan.decodes))

    def _decode_table(self, max_index: int) -> np.ndarray:
        """T[x]: one decode item's attention seconds at context x, for x <= max_index."""
        if self._table.size <= max_index:
            size = max(max_index + 1, 2 * self._table.size, 4096)
            p = self.profile
            self._table = attention_s_per_item(self.coeffs, p, self.num_decode_compute_tokens,
                                               np.arange(size), 0, p.num_layers)
        return self._table

    def _prefix(self, max_index: int) -> np.ndarray:
        """P[x] = Q[x - adv] (0 for x < adv), Q[x] = T[x] + T[x - adv] + ... the strided prefix
        sum of the decode attention table T, for x <= max_index (see `DecodeRun`)."""
        if self._strided_prefix.size > max_index:
            return self._strided_prefix
        size = max(max_index + 1, 2 * self._strided_prefix.size, 4096)
        size = -(-size // self.adv) * self.adv
        table = self._decode_table(size - 1)[:size]
        strided = np.cumsum(table.reshape(-1, self.adv), axis=0).reshape(-1)
        self._strided_prefix = np.concatenate((np.zeros(self.adv), strided))
        return self._strided_prefix
