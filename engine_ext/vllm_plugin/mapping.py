"""Per-token adapter mapping of one engine step with prefill-only adapters masked out.

vLLM's runner maps every scheduled token to its request's `lora_int_id` (0 = base). Here the
prefill-only rule of `engine_ext.forward_context.build_token_slots` is applied to that ragged
batch: a token of a LoRA_P adapter at a position at or past the prompt length (a decode token, or
an output token recomputed after preemption) gets 0. Positions come from the tokens computed
before the step, so a chunked prefill that straddles the end of the prompt is masked exactly.
No vLLM import: the runner patch passes numpy arrays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine_ext.forward_context import NO_ADAPTER, build_token_slots
from engine_ext.vllm_plugin import guards
from engine_ext.vllm_plugin.direft import ReftStep, reft_rows


def _mask(req_ids: np.ndarray, tok_req: np.ndarray, positions: np.ndarray,
          prompt_lens: np.ndarray, is_prefill_only: Callable[[int], bool]) -> np.ndarray:
    """lora id per token, prefill-only adapters dropped past the prompt (engine_ext rule)."""
    distinct = sorted({int(x) for x in req_ids} - {0})
    slot_of = {lora_id: slot for slot, lora_id in enumerate(distinct)}
    req_slots = np.array([slot_of.get(int(x), NO_ADAPTER) for x in req_ids], dtype=np.int64)
    # One "request" per token (T = 1) turns the ragged batch into engine_ext's [B, T] form.
    slots = build_token_slots(
        req_slots[tok_req].tolist(),
        torch.from_numpy(positions.astype(np.int64))[:, None],
        prompt_lens[tok_req].tolist(),
        [is_prefill_only(lora_id) for lora_id in distinct],
    ).numpy()
    ids = np.array([0, *distinct], dtype=np.int64)
    return ids[slots + 1]


def token_positions(num_computed: np.ndarray,
                    num_scheduled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(request row, absolute position) of each scheduled token of a step, both [N]."""
    tok_req = np.repeat(np.arange(len(num_scheduled)), num_scheduled)  # [N]
    starts = np.cumsum(num_scheduled) - num_scheduled  # [R]
    offsets = np.arange(len(tok_req)) - starts[tok_req]  # [N] position inside the step
    return tok_req, num_computed[tok_req] + offsets


def step_lora_mapping(
    req_lora_ids: np.ndarray,
    num_computed: np.ndarray,
    num_scheduled: np.ndarray,
    num_prompt: np.ndarray,
    num_sampled: np.ndarray,
    is_prefill_only: Callable[[int], bool],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sampled-token mapping, token mapping) of lora ids for one step.

    req_lora_ids, num_computed, num_scheduled, num_prompt, num_sampled: [R] per request of the
    batch, in the runner's order. is_prefill_only(lora_id) says whether an adapter is LoRA_P.
    """
    num_reqs = len(req_lora_ids)
    tok_req, positions = token_positions(num_computed, num_scheduled)
    token_map = _mask(req_lora_ids, tok_req, positions, num_prompt, is_prefill_only)
    # Sampled rows are the last num_sampled tokens of each request in the step.
    smp_req = np.repeat(np.arange(num_reqs), num_sampled)  # [S]
    smp_starts = np.cumsum(num_sampled) - num_sampled
    smp_pos = (num_computed + num_scheduled - num_sampled)[smp_req] + (
        np.arange(len(smp_req)) - smp_starts[smp_req])
    sampled_map = _mask(req_lora_ids, smp_req, smp_pos, num_prompt, is_prefill_only)
    return tuple(int(x) for x in sampled_map), tuple(int(x) for x in token_map)


def step_mapping(state, step):
    """(sampled-token LoRA map, token LoRA map, DiReFT edits) of a step.

    DiReFT adapters get their rows in the edits and LoRA id 0 in both maps.
    """
    prompt_map, token_map = step_lora_mapping(
        step.req_lora_ids, step.num_computed, step.num_scheduled, step.num_prompt,
        step.num_sampled, lambda lora_id: state.is_prefill_only(step.lora_paths[lora_id]))
    if not step.reft_ids:
        return prompt_map, token_map, None
    tokens = np.asarray(token_map, dtype=np.int64)
    tok_req, positions = token_positions(step.num_computed, step.num_scheduled)
    edits = []
    for lora_id in sorted(step.reft_ids):
        if not state.support.allows(guards.DIREFT):
            continue  # the front end rejects these requests; never apply a refused feature
        weights = state.reft_store.get(step.lora_paths[lora_id], state.model_shape)
        edits.append((weights, reft_rows(tokens, positions, step.num_prompt[tok_req], lora_id,
                                         weights)))
    prompt_map, token_map = (tuple(0 if x in step.reft_ids else x for x in mapping)
                             for mapping in (prompt_map, token_map))
    return prompt_map, token_map, ReftStep(edits)
