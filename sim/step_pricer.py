"""Step times for the engine: the reference calls `predict_step` per step; the fast path prices a
whole run of decode steps at once.

Within a step only attention depends on the contexts; every other term of `predict_step` depends
on token counts, adapters and sequences, which a run of decode steps keeps fixed. So a decode
step k of a run costs `const + sum_i T[c_i + k * adv]`, where `T[c]` is one decode item's
attention at context c. `T` is tabulated once per replica and prefix-summed, so the time of
any number of steps is O(batch) to evaluate. `attention_s_by_item` restates the attention term of
`sim.cost_model` item by item; a test holds them equal.
"""

from __future__ import annotations

import numpy as np

from sim.cost_model import CostCoeffs, StepBatch, create_step_batch, predict_step
from sim.cost_profile import CostProfile
from sim.engine import StepPlan


def _roofline(flops, num_bytes, peak_flops, flops_eff, bandwidth, bw_eff):
    return np.maximum(flops / (peak_flops * flops_eff), num_bytes / (bandwidth * bw_eff))


def attention_s_by_item(c: CostCoeffs, p: CostProfile, num_new, num_context, first, last):
    """Attention seconds of each item (arrays broadcast), as `predict_step` prices them."""
    g = p.gpu
    n = np.asarray(num_new, dtype=float)
    ctx = np.asarray(num_context, dtype=float)
    first, last = np.asarray(first), np.asarray(last)
    causal = n * (n + 1) / 2

    def timed(prefix, pairs, num_bytes, extra_flops=0.0):
        flops = pairs * p.attention_flops_per_pair + extra_flops
        per_layer = _roofline(flops, num_bytes, g.bf16_dense_flops, c.attention_flops_efficiency,
                              g.hbm_bandwidth_bytes_per_s, c.memory_bandwidth_efficiency)
        return (prefix[last] - prefix[first]) * per_layer

    total = timed(p.standard_prefix, n * ctx + causal, (ctx + n) * p.kv_layer_bytes_per_gpu)
    if p.compression_ratio == 1 and p.window_tokens == 0:
        return total
    records = (ctx + n) / p.compression_ratio
    total = total + timed(p.encoder_prefix, n * (ctx / p.compression_ratio) + causal,
                          records * p.global_record_bytes + n * p.kv_layer_bytes_per_gpu)
    window = np.minimum(ctx + n, p.window_tokens)
    selected = np.minimum(records, p.index_topk)
    read = np.minimum(records, n * p.index_topk) * p.global_record_bytes
    total = total + timed(p.decoder_prefix, n * (window + selected),
                          read + window * p.kv_layer_bytes_per_gpu)
    return total + timed(p.index_prefix, 0.0, records * p.index_key_bytes,
                         extra_flops=2 * n * records * p.index_key_bytes)


class DecodeRun:
    """Times of a run of identical-structure decode steps: cumulative seconds after j steps."""

    def __init__(self, const_s: float, contexts: np.ndarray, prefix: np.ndarray, adv: int):
        self.const_s, self.contexts, self.prefix, self.adv = const_s, contexts, prefix, adv
        below = contexts - adv
        self._base = np.where(below >= 0, prefix[np.maximum(below, 0)], 0.0)

    def elapsed_s(self, num_steps: int) -> float:
        """Seconds of the first `num_steps` steps."""
        last = self.contexts + self.adv * (num_steps - 1)
        return num_steps * self.const_s + float((self.prefix[last] - self._base).sum())

    def steps_to_reach(self, elapsed_s: float, max_steps: int) -> int:
        """Fewest steps (>= 1) whose end lies at or after `elapsed_s` into the run."""
        lo, hi = 0, max_steps  # elapsed_s(lo) < elapsed_s <= elapsed_s(hi), elapsed_s(0) = 0
        if elapsed_s <= 0:
            return 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.elapsed_s(mid) >= elapsed_s else (mid, hi)
        return hi


class StepPricer:
    """Prices engine steps for one replica."""

    def __init__(self, coeffs: CostCoeffs, profile: CostProfile, *, replay_first_layer: int,
                 num_decode_compute_tokens: int, num_tokens_per_decode_step: int,
                 is_fast: bool):
        self.coeffs, self.profile = coeffs, profile
        self.replay_first_layer = replay_first_layer
        self.num_decode_compute_tokens = num_decode_compute_tokens
        self.adv = num_tokens_per_decode_step
        self.is_fast = is_fast
        self._non_attention_s: dict[tuple, float] = {}
        self._strided_prefix = np.zeros(0)
        self.num_predict_calls = 0

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
        for seq in plan.decodes:
            new.append(self.num_decode_compute_tokens), ctx.append(seq.num_computed_tokens)
            ids.append(seq.adapter), adapted.append(seq.is_decode_adapted), first.append(0)
            last.append(num_layers), replay.append(False), samples.append(True)
        for seq in plan.replays:
            num_replay = min(seq.num_replay_tokens, seq.num_replay_context_tokens)
            new.append(num_replay), ctx.append(seq.num_replay_context_tokens - num_replay)
            ids.append(seq.adapter), adapted.append(True), first.append(self.replay_first_layer)
            last.append(num_layers), replay.append(True), samples.append(False)
        return create_step_batch(
            new, ctx, num_layers=num_layers, adapter_ids=ids, is_adapted=adapted,
            first_layer=first, last_layer=last, is_replay=replay, is_last_chunk=samples,
            num_routing_decisions=plan.num_routing_decisions)

    def step_s(self, plan: StepPlan) -> float:
        """Seconds of one step of `plan`, adapter loads included."""
        batch = self.batch(plan)
        if not self.is_fast or plan.replays or (batch.first_layer != 0).any() \
                or (batch.last_layer != self.profile.num_layers).any():
            self.num_predict_calls += 1
            return predict_step(self.coeffs, self.profile, batch).total_s + plan.adapter_load_s
        attention = attention_s_by_item(self.coeffs, self.profile, batch.num_new_tokens,
                                        batch.num_context_tokens, batch.first_layer,
                                        batch.last_layer)
        return self._cached_non_attention_s(batch) + float(attention.sum()) + plan.adapter_load_s

    def _cached_non_attention_s(self, batch: StepBatch) -> float:
        """Every term but attention: a function of counts only (full-layer items, no replay)."""
        adapted = batch.is_adapted
        key = (int(batch.num_new_tokens.sum()), int(batch.is_last_chunk.sum()),
               int(batch.num_new_tokens[adapted].sum()),
               int(np.unique(batch.adapter_ids[adapted]).size), batch.num_new_tokens.size,
               batch.num_routing_decisions)
        cached = self._non_attention_s.get(key)
        if cached is None:
            self.num_predict_calls += 1
            cost = predict_step(self.coeffs, self.profile, batch)
            cached = self._non_attention_s[key] = cost.total_s - cost.attention_s
        return cached

    def decode_run(self, plan: StepPlan, num_steps: int) -> DecodeRun:
        """Step times of repeating the pure-decode `plan` up to `num_steps` times."""
        const_s = self._cached_non_attention_s(self.batch(plan))
        contexts = np.fromiter((s.num_computed_tokens for s in plan.decodes), dtype=np.int64,
                               count=len(plan.decodes))
        max_index = int(contexts.max()) + self.adv * num_steps
        return DecodeRun(const_s, contexts, self._prefix(max_index), self.adv)

    def _prefix(self, max_index: int) -> np.ndarray:
        """Q[x] = T[x] + T[x - adv] + ... of the decode attention table T, for x <= max_index."""
        if self._strided_prefix.size > max_index:
            return self._strided_prefix
        size = max(max_index + 1, 2 * self._strided_prefix.size, 4096)
        size = -(-size // self.adv) * self.adv
        p = self.profile
        table = attention_s_by_item(self.coeffs, p, self.num_decode_compute_tokens,
                                    np.arange(size), 0, p.num_layers)
        self._strided_prefix = np.cumsum(table.reshape(-1, self.adv), axis=0).reshape(-1)
        return self._strided_prefix
