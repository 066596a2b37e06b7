"""Step times for the engine: the reference calls `predict_step` per step; the fast path prices
the same steps from tables and caches, bit for bit.

A step's seconds are `predict_step`'s `total_s`: its named terms summed in field order. Only
attention depends on the contexts; every other term depends on token counts, adapters and
sequences, so the fast path caches those terms by the counts (read off the plan without building
a `StepBatch`; a step holding replays, re-encodes or partial-layer prefills keyed per kind of
item), and only a new combination of counts calls the cost model. Attention is each item's
seconds (`sim.cost.cost_model.attention_s_per_item`: elementwise, so an item's value does not
depend on the batch around it) summed over the step's items in plan order by the same numpy sum
as `predict_step`'s; a decode item's value is read from a table over contexts, a prompt
chunk's, replay's or re-encode's from a cache. A run of decode steps is priced step by step the
same way, vectorized over the steps (`DecodeRun`), and its step ends are the reference's clock:
each the previous end plus the step's seconds.
"""

from __future__ import annotations

from functools import partial, reduce
from operator import add

import numpy as np

from sim.cost.cost_model import (
    CostCoeffs,
    StepBatch,
    _model_terms,
    attention_s_per_item,
    create_step_batch,
    predict_counted_step,
    predict_step,
)
from sim.cost.layer_costs import LayerCosts
from sim.engine import run_pricing
from sim.engine.decode_run import DecodeRun, ListedDecodeRun
from sim.engine.run_pricing import (
    PAIRWISE_BLOCK,
    TERM_NAMES,
    StepTerms,
    create_step_terms,
    non_attention_terms,
    price_decode_steps,
    price_run_ends,
    step_function,
    total_s,
)
from sim.engine.step_plan import StepPlan

MAX_LISTED_RUN_VALUES = 600
LISTED_RUN_STEP_ITEMS = 10
"""A decode run of B decodes and S steps is priced whole in plain floats when S * (B +
`LISTED_RUN_STEP_ITEMS`) is at most `MAX_LISTED_RUN_VALUES`, else in numpy chunks as it goes.
(Counted in CPU instructions: a numpy run's calls, shares and busy time cost about what 600
(step, decode) values cost in plain floats, and a plain step about what 10 values cost.)"""

MAX_CACHED_CHUNKS = 1 << 16
"""Attention seconds of prompt chunks, replays and re-encodes kept per pricer (cleared when
full: memory stays bounded on runs of millions of distinct prompts)."""

def reencode_span(seq) -> tuple[int, int]:
    """(tokens, cached tokens it ends at) of a sequence's encoder-window re-encode."""
    end = seq.num_reencode_context_tokens
    return min(seq.num_reencode_tokens, end), end


_SHARED_NON_ATTENTION: dict[str, dict[tuple, StepTerms]] = {}
"""Non-attention step terms by pricing identity, kept across runs of one process: a capacity
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
        self._non_attention_s: dict[tuple, StepTerms] = {}
        if shared_key is not None:
            key = f"{shared_key}|{replay_first_layer}|{num_decode_compute_tokens}"
            if key not in _SHARED_NON_ATTENTION and len(_SHARED_NON_ATTENTION) >= \
                    MAX_SHARED_TABLES:
                del _SHARED_NON_ATTENTION[next(iter(_SHARED_NON_ATTENTION))]  # the oldest
            self._non_attention_s = _SHARED_NON_ATTENTION.setdefault(key, {})
        self._chunk_attention_s: dict[tuple[int, int, int, int], float] = {}
        """Attention seconds of a prompt chunk, replay or re-encode, by its item."""
        self._table = np.zeros(0)
        """One decode item's attention seconds by context."""
        self._table_list: list[float] = []
        """`_table` as a list (plain floats for short runs)."""
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
        cached = self._cached_terms(plan)
        if cached.everything is None and run_pricing.IS_SUM_SEQUENTIAL:  # no replay: common
            total = cached.before_s + self._attention_s(plan)
            for term in cached.after_s:
                total += term
            return total + plan.adapter_load_s
        regular = self._attention_s(plan)
        terms = cached.terms
        if cached.everything is not None:  # `predict_step`'s replay_s: all items' less regular
            every = self._attention_s(plan, with_replays=True)
            named = dict(zip(TERM_NAMES, terms, strict=True))
            replay = sum(every if k == "attention_s" else v for k, v in cached.everything) \
                - sum(regular if k == "attention_s" else named[k] for k, _ in cached.everything)
            terms = tuple(replay if k == "replay_s" else v for k, v in named.items())
        return total_s(terms, regular) + plan.adapter_load_s

    def _attention_s(self, plan: StepPlan, with_replays: bool = False) -> float:
        """Attention seconds of `plan` as `predict_step` sums them: each item's seconds (a
        decode's from the table over contexts, a prompt chunk's, replay's or re-encode's from
        the cache), numpy's sum over them in plan order (prompt chunks, decodes, then replays
        and re-encodes if `with_replays`)."""
        has_others = plan.prefills or (with_replays and (plan.replays or plan.reencodes))
        if not plan.decodes:
            values = self._item_attention_s(self._other_items(plan, with_replays))
        else:
            contexts = self.decode_contexts(plan).tolist()
            try:  # the table usually covers every context already: no max to take
                values = [self._table_list[c] for c in contexts]
            except IndexError:
                self._decode_table(max(contexts))
                values = [self._table_list[c] for c in contexts]
            if has_others:
                chunks = self._item_attention_s(self._other_items(plan, with_replays))
                num_prefills = len(plan.prefills)
                values = chunks[:num_prefills] + values + chunks[num_prefills:]
        if len(values) > PAIRWISE_BLOCK:
            return float(np.array(values).sum())
        return step_function(len(values), 0)(values, 0.0)  # numpy's sum, in plain floats

    def _item_attention_s(self, items: list[tuple[int, int, int, int]]) -> list[float]:
        """Attention seconds of each (tokens, context, first layer, last layer) item, cached
        by that key (`attention_s_per_item` is elementwise)."""
        cache = self._chunk_attention_s
        missing = [item for item in items if item not in cache]
        if missing:
            if len(cache) + len(missing) > MAX_CACHED_CHUNKS:
                cache.clear()
                missing = list(dict.fromkeys(items))
            new, ctx, first, last = (np.array(column) for column in zip(*missing, strict=True))
            seconds = attention_s_per_item(self.coeffs, self.profile, new, ctx, first, last)
            cache.update(zip(missing, seconds.tolist(), strict=True))
        return [cache[item] for item in items]

    def _other_items(self, plan: StepPlan,
                     with_replays: bool = True) -> list[tuple[int, int, int, int]]:
        """(tokens, context, first layer, last layer) of each prefill chunk, then (if
        `with_replays`) of each replay and re-encode of `plan`."""
        num_layers, rfl = self.profile.num_layers, self.replay_first_layer
        items = [(num_new, seq.num_computed_tokens, seq.first_layer,
                  num_layers if seq.last_layer < 0 else seq.last_layer)
                 for seq, num_new in plan.prefills]
        if not with_replays:
            return items
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

    def _cached_terms(self, plan: StepPlan) -> StepTerms:
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
                cost = predict_counted_step(
                    self.coeffs, self.profile, num_tokens=num_tokens, num_samples=num_samples,
                    num_adapted_tokens=num_adapted, num_adapters=num_adapters,
                    num_items=num_items, has_prompt=has_prompt,
                    num_routing_decisions=num_routing)
                everything = None
            else:
                batch = self.batch(plan)
                cost = predict_step(self.coeffs, self.profile, batch)
                everything = None
                if batch.is_replay.any():
                    terms = _model_terms(self.coeffs, self.profile, batch,
                                         np.ones(batch.num_new_tokens.shape[0], dtype=bool))
                    everything = tuple(terms.items())
            cached = self._non_attention_s[key] = create_step_terms(non_attention_terms(cost),
                                                                    everything)
        return cached

    def _cached_non_attention_s(self, plan: StepPlan) -> float:
        """`non_attention_s` of a replay-free step, from the cached terms."""
        cached = self._cached_terms(plan)
        assert cached.everything is None, "a step with replays prices its replays with attention"
        return reduce(add, cached.terms)

    def decode_run(self, plan: StepPlan, start_s: float,
                   num_steps: int) -> DecodeRun | ListedDecodeRun:
        """The step ends of repeating the pure-decode `plan` up to `num_steps` times from
        `start_s`: step k's decodes at contexts + k * adv, each step priced as `step_s`. A
        short run (`MAX_LISTED_RUN_VALUES`) is priced whole at once in plain floats, a longer
        one in numpy chunks as far as it gets."""
        cached = self._cached_terms(plan)
        assert cached.everything is None and not plan.prefills and not plan.adapter_load_s
        contexts = self.decode_contexts(plan)
        if num_steps * (contexts.size + LISTED_RUN_STEP_ITEMS) > MAX_LISTED_RUN_VALUES:
            return self._numpy_run(cached, contexts, start_s, num_steps)
        listed = contexts.tolist()
        last = max(listed) + self.adv * (num_steps - 1)
        if last >= len(self._table_list):
            self._decode_table(last)
        return ListedDecodeRun(price_run_ends(cached, self._table_list, listed, self.adv,
                                              start_s, num_steps))

    def _numpy_run(self, cached: StepTerms, contexts: np.ndarray, start_s: float,
                   num_steps: int) -> DecodeRun:
        """A run of up to `num_steps` steps from `start_s`, priced in numpy chunks."""
        return DecodeRun(start_s, num_steps,
                         partial(price_decode_steps, cached, self._decode_table, contexts,
                                 self.adv), num_items=contexts.size)

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
            self._table = np.ascontiguousarray(np.broadcast_to(attention_s_per_item(
                self.coeffs, p, self.num_decode_compute_tokens, np.arange(size), 0,
                p.num_layers), (size,)))
            self._table_list = self._table.tolist()
        return self._table

