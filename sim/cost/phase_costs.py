"""Costs of whole phases built from `predict_step`: a chunked prefill, a decode run, a replay.

Pure functions over a LayerCosts; they price one sequence alone (or one decode batch) and are
what the analytical comparisons and the capacity search's pruning use.
"""

from __future__ import annotations

import numpy as np

from sim.cost.cost_model import CostCoeffs, StepCost, create_step_batch, predict_step
from sim.cost.layer_costs import LayerCosts

MAX_EXACT_DECODE_STEPS = 64
"""Decode runs up to this length are priced step by step; longer ones are interpolated."""


def prefill_s(
    coeffs: CostCoeffs, profile: LayerCosts, num_tokens: int, *, num_context_tokens: int = 0,
    max_chunk_tokens: int = 8192, adapter_id: int = 0, is_adapted: bool = True,
    first_layer: int = 0, last_layer: int | None = None, is_replay: bool = False,
    num_routing_decisions: int = 0,
) -> float:
    """Seconds to prefill `num_tokens` after `num_context_tokens`, chunk by chunk, alone."""
    total, done = 0.0, 0
    last = profile.num_layers if last_layer is None else last_layer
    while done < num_tokens:
        chunk = min(max_chunk_tokens, num_tokens - done)
        is_final = done + chunk == num_tokens
        batch = create_step_batch(
            [chunk], [num_context_tokens + done], num_layers=profile.num_layers,
            adapter_ids=[adapter_id], is_adapted=[is_adapted], first_layer=[first_layer],
            last_layer=[last], is_replay=[is_replay], is_last_chunk=[is_final and not is_replay],
            num_routing_decisions=num_routing_decisions if is_final else 0,
        )
        total += predict_step(coeffs, profile, batch).total_s
        done += chunk
    return total


def decode_step(
    coeffs: CostCoeffs, profile: LayerCosts, *, batch_size: int, num_context_tokens: int,
    num_distinct_adapters: int, is_adapted: bool = True,
) -> StepCost:
    """One decode step of `batch_size` sequences spread round-robin over distinct adapters."""
    ids = np.arange(batch_size) % max(num_distinct_adapters, 1)
    if num_distinct_adapters == 0:
        ids = np.full(batch_size, -1)
    batch = create_step_batch(
        np.ones(batch_size, dtype=np.int64), np.full(batch_size, num_context_tokens),
        num_layers=profile.num_layers, adapter_ids=ids,
        is_adapted=np.full(batch_size, is_adapted),
    )
    return predict_step(coeffs, profile, batch)


def decode_run_s(
    coeffs: CostCoeffs, profile: LayerCosts, *, num_tokens: int, num_context_tokens: int,
    batch_size: int = 1, num_distinct_adapters: int = 1, is_adapted: bool = True,
) -> float:
    """Seconds to decode `num_tokens` one step at a time (context grows by one each step).

    Step time is piecewise linear in the context (attention grows, GEMMs do not), so long runs
    are priced at `MAX_EXACT_DECODE_STEPS` + 1 evenly spaced contexts and interpolated.
    """
    def step_s(context: int) -> float:
        return decode_step(coeffs, profile, batch_size=batch_size, num_context_tokens=context,
                           num_distinct_adapters=num_distinct_adapters,
                           is_adapted=is_adapted).total_s

    contexts = num_context_tokens + np.arange(num_tokens)
    if num_tokens <= MAX_EXACT_DECODE_STEPS:
        return float(sum(step_s(int(c)) for c in contexts))
    sampled = np.linspace(contexts[0], contexts[-1], MAX_EXACT_DECODE_STEPS + 1).round()
    times = [step_s(int(c)) for c in sampled]
    return float(np.interp(contexts, sampled, times).sum())


def bounded_replay_s(
    coeffs: CostCoeffs, profile: LayerCosts, *, num_context_tokens: int, window_tokens: int,
    first_decoder_layer: int, max_chunk_tokens: int = 8192,
) -> float:
    """Seconds to recompute the last W positions through the decoder layers under the target."""
    num_tokens = min(window_tokens, num_context_tokens)
    return prefill_s(
        coeffs, profile, num_tokens, num_context_tokens=num_context_tokens - num_tokens,
        max_chunk_tokens=max_chunk_tokens, first_layer=first_decoder_layer, is_replay=True,
    )
