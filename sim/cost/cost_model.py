"""Pure cost model of one engine step: roofline terms scaled by fitted efficiency coefficients.

`predict_step(coeffs, profile, batch) -> StepCost` prices a step holding prefill chunks, decode
tokens and bounded replays (each item with its own context, adapter and layer range). Each term
is max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)) per layer; `StepCost` keeps
the named terms so a report can say where time goes. No I/O, no globals, no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from sim.cost.coeffs import (  # noqa: F401  (re-exported: callers import them from here)
    DEFAULT_COEFFS,
    CostCoeffs,
    adapter_disk_load_s,
    adapter_load_s,
    default_coeffs,
)
from sim.cost.layer_costs import LayerCosts
from sim.cost.lora_kernels import lora_program_counts, lora_working_macs
from sim.cost.tp_communication import find_all_reduce_fit, tensor_parallel_communication_s


@dataclass(frozen=True)
class StepBatch:
    """Items of one step as parallel arrays (one entry per sequence chunk)."""

    num_new_tokens: np.ndarray
    """int [N]: tokens this item computes in this step (prefill chunk, 1 for decode, W replay)."""
    num_context_tokens: np.ndarray
    """int [N]: tokens already in KV before this item's tokens."""
    adapter_ids: np.ndarray
    """int [N]: adapter of the item, -1 for none."""
    is_adapted: np.ndarray
    """bool [N]: the adapter applies to these tokens (False for decode tokens under PreFT)."""
    first_layer: np.ndarray
    """int [N]: first layer the item runs."""
    last_layer: np.ndarray
    """int [N]: one past the last layer the item runs."""
    is_replay: np.ndarray
    """bool [N]: a bounded replay (priced in the replay term)."""
    is_last_chunk: np.ndarray
    """bool [N]: the item samples a token (decode, or the prompt's last chunk): pays the LM head."""
    is_prompt: np.ndarray
    """bool [N]: a prompt chunk (prefill), not a decode token nor a replay."""
    num_routing_decisions: int = 0
    """Routing-head decisions taken in this step."""


def create_step_batch(
    num_new_tokens, num_context_tokens, *, num_layers: int, adapter_ids=None, is_adapted=None,
    first_layer=None, last_layer=None, is_replay=None, is_last_chunk=None, is_prompt=None,
    num_routing_decisions: int = 0,
) -> StepBatch:
    """A StepBatch with defaults: no adapter, every layer, no replay, every non-replay item
    samples a token (a replay only rebuilds KV), a non-replay item of more than one token is a
    prompt chunk."""
    new = np.asarray(num_new_tokens, dtype=np.int64)
    n = new.shape[0]

    def full(value, default, dtype):
        return np.full(n, default, dtype) if value is None else np.asarray(value, dtype=dtype)

    ids = full(adapter_ids, -1, np.int64)
    replay = full(is_replay, False, bool)
    return StepBatch(
        num_new_tokens=new,
        num_context_tokens=np.asarray(num_context_tokens, dtype=np.int64),
        adapter_ids=ids,
        is_adapted=full(is_adapted, True, bool) & (ids >= 0),
        first_layer=full(first_layer, 0, np.int64),
        last_layer=full(last_layer, num_layers, np.int64),
        is_replay=replay,
        is_last_chunk=~replay if is_last_chunk is None else np.asarray(is_last_chunk, bool),
        is_prompt=(new > 1) & ~replay if is_prompt is None else np.asarray(is_prompt, bool),
        num_routing_decisions=num_routing_decisions,
    )


@dataclass(frozen=True)
class StepCost:
    """Seconds of one step by named term; the terms sum to `total_s`."""

    dense_gemm_s: float
    moe_gemm_s: float
    attention_s: float
    lora_s: float
    direft_s: float
    replay_s: float
    routing_s: float
    communication_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        """Step time, seconds."""
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, float]:
        """Terms by name, plus total_s."""
        terms = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**terms, "total_s": self.total_s}


def _roofline(flops, num_bytes, peak_flops, flops_eff, bandwidth, bw_eff):
    return np.maximum(flops / (peak_flops * flops_eff), num_bytes / (bandwidth * bw_eff))


def _tokens_per_layer(p: LayerCosts, batch: StepBatch, mask: np.ndarray) -> np.ndarray:
    """float [L]: tokens each layer computes, counting only items in `mask`."""
    diff = np.zeros(p.num_layers + 1)
    np.add.at(diff, batch.first_layer[mask], batch.num_new_tokens[mask])
    np.add.at(diff, batch.last_layer[mask], -batch.num_new_tokens[mask])
    return np.cumsum(diff[:-1])


def _layers_in_range(prefix: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Count of flagged layers in [first, last) per item, from a prefix sum of a layer mask."""
    return prefix[last] - prefix[first]


def _gemm_s(c: CostCoeffs, p: LayerCosts, tokens: np.ndarray, num_logit_rows: int):
    """(dense, moe) seconds for `tokens` [L] per layer plus the LM head for `num_logit_rows`."""
    g = p.gpu
    active = tokens > 0
    dense_flops = 2 * tokens * p.dense_params_per_layer / p.tp
    dense_bytes = active * p.dense_params_per_layer * p.weight_dtype_bytes / p.tp
    dense = _roofline(dense_flops, dense_bytes, g.bf16_dense_flops, c.gemm_flops_efficiency,
                      g.hbm_bandwidth_bytes_per_s, c.memory_bandwidth_efficiency).sum()
    if num_logit_rows:
        head_flops = 2 * num_logit_rows * p.lm_head_params / p.tp
        head_bytes = p.lm_head_params * p.weight_dtype_bytes / p.tp
        dense += float(_roofline(head_flops, head_bytes, g.bf16_dense_flops,
                                 c.gemm_flops_efficiency, g.hbm_bandwidth_bytes_per_s,
                                 c.memory_bandwidth_efficiency))
    if p.num_routed_experts == 0:
        return float(dense), 0.0
    k, e = p.num_experts_per_token, p.num_routed_experts
    # Expected distinct experts hit when tokens pick k of e experts uniformly at random.
    distinct = e * (1 - (1 - k / e) ** tokens) * p.is_moe_layer
    moe_flops = 2 * tokens * k * p.expert_params * p.is_moe_layer / p.tp
    moe_bytes = distinct * p.expert_params * p.weight_dtype_bytes / p.tp
    moe = _roofline(moe_flops, moe_bytes, g.bf16_dense_flops, c.gemm_flops_efficiency,
                    g.hbm_bandwidth_bytes_per_s, c.memory_bandwidth_efficiency).sum()
    return float(dense), float(moe)


def _attention_terms(c: CostCoeffs, p: LayerCosts, num_new, num_context, first,
                     last) -> list[np.ndarray]:
    """Attention seconds of each item, one array per kind of layer (standard; CED encoder,
    decoder, index). Arguments broadcast."""
    g = p.gpu
    n = np.asarray(num_new, dtype=float)
    ctx = np.asarray(num_context, dtype=float)
    first, last = np.asarray(first), np.asarray(last)
    causal = n * (n + 1) / 2

    def timed(prefix, pairs, num_bytes, extra_flops=0.0):
        flops = pairs * p.attention_flops_per_pair + extra_flops
        per_layer = _roofline(flops, num_bytes, g.bf16_dense_flops, c.attention_flops_efficiency,
                              g.hbm_bandwidth_bytes_per_s, c.memory_bandwidth_efficiency)
        return _layers_in_range(prefix, first, last) * per_layer

    is_ced = p.compression_ratio != 1 or p.window_tokens != 0
    terms = []
    # Full attention over the whole cached context (decoder-only models). A CED model without
    # such layers skips the term: it is 0, and adding 0 first changes no sum.
    if not is_ced or p.standard_prefix[-1]:
        terms.append(timed(p.standard_prefix, n * ctx + causal,
                           (ctx + n) * p.kv_layer_bytes_per_gpu))
    if not is_ced:
        return terms
    records = (ctx + n) / p.compression_ratio
    # CED encoder: full attention through the compressed global KV plus the chunk itself.
    terms.append(timed(p.encoder_prefix, n * (ctx / p.compression_ratio) + causal,
                       records * p.global_record_bytes + n * p.kv_layer_bytes_per_gpu))
    # CED decoder: local window plus the top-k selected global records.
    window = np.minimum(ctx + n, p.window_tokens)
    selected = np.minimum(records, p.index_topk)
    read = np.minimum(records, n * p.index_topk) * p.global_record_bytes
    terms.append(timed(p.decoder_prefix, n * (window + selected),
                       read + window * p.kv_layer_bytes_per_gpu))
    # Index layers also score every record with the indexer keys to pick the top-k. Indexer
    # keys are fp8, one byte per element, so index_key_bytes is also the key width in elements.
    terms.append(timed(p.index_prefix, 0.0, records * p.index_key_bytes,
                       extra_flops=2 * n * records * p.index_key_bytes))
    return terms


def attention_s_per_item(c: CostCoeffs, p: LayerCosts, num_new, num_context, first,
                         last) -> np.ndarray:
    """Attention seconds of each item (arrays broadcast): `num_new` tokens attending over
    `num_context` cached tokens through layers [first, last), its kinds of layer in order."""
    terms = _attention_terms(c, p, num_new, num_context, first, last)
    return terms[0] if len(terms) == 1 else sum(terms[1:], terms[0])


def _attention_s(c: CostCoeffs, p: LayerCosts, batch: StepBatch, mask: np.ndarray) -> float:
    """Attention seconds of the items in `mask`: each item's (`attention_s_per_item`, which
    depends on that item alone), summed over the items in batch order. Items first, then their
    sum: so a simulator can price an item once, keep it and sum the kept values, bit for bit."""
    return float(attention_s_per_item(c, p, batch.num_new_tokens[mask],
                                      batch.num_context_tokens[mask], batch.first_layer[mask],
                                      batch.last_layer[mask]).sum())


def _adapted_mask(p: LayerCosts, batch: StepBatch, mask: np.ndarray) -> np.ndarray:
    return mask & batch.is_adapted if p.adapter_kind != "none" else np.zeros_like(mask)


def _adapter_read_s(c: CostCoeffs, p: LayerCosts, batch: StepBatch, adapted: np.ndarray,
                    flops_efficiency: float):
    """(roofline seconds, distinct adapters) of the adapted items' edit on their layers."""
    g = p.gpu
    n = batch.num_new_tokens[adapted].astype(float)
    per_rank = (p.adapter_weights_prefix[batch.last_layer[adapted]]
                - p.adapter_weights_prefix[batch.first_layer[adapted]])
    flops = 2.0 * p.adapter_rank * float((n * per_rank).sum()) / p.tp
    num_adapters = np.unique(batch.adapter_ids[adapted]).size
    # Each distinct adapter's A and B are read once per step (Punica-style gather kernels).
    num_bytes = num_adapters * p.adapter_rank * p.adapter_weights_prefix[-1] * 2 / p.tp
    t = _roofline(flops, num_bytes, g.bf16_dense_flops, flops_efficiency,
                  g.hbm_bandwidth_bytes_per_s, c.memory_bandwidth_efficiency)
    return float(t), num_adapters


def _lora_s(c: CostCoeffs, p: LayerCosts, batch: StepBatch, mask: np.ndarray) -> float:
    """LoRA seconds of the items in `mask`: shrink/expand FLOPs and adapter reads of adapted
    tokens, plus what the engine's LoRA path costs every token of the step (slice launches and
    per-token weight gathers over the wrapped modules of the layers each item runs). A profile
    with wrapped slices but another adapter kind (DiReFT_P served by a LoRA-enabled vLLM)
    pays the wrapper only."""
    if not p.lora_slices_prefix[-1] or not mask.any():
        return 0.0
    adapted = _adapted_mask(p, batch, mask) if p.adapter_kind == "lora" else mask & False
    t = 0.0
    if adapted.any():
        t, num_adapters = _adapter_read_s(c, p, batch, adapted, c.lora_flops_efficiency)
        t += c.lora_launch_overhead_s + num_adapters * c.lora_per_adapter_overhead_s
    first, last = batch.first_layer[mask], batch.last_layer[mask]
    # Layers the step runs at all: launches happen once per layer, not per item.
    t += c.lora_slice_launch_s * float(p.lora_slices_prefix[last.max()]
                                       - p.lora_slices_prefix[first.min()])
    t += _lora_grid_s(c, p, batch, mask, adapted)
    if c.lora_token_gather_share:
        widths = p.lora_wrapped_out_prefix  # expand always runs; shrink only if a token adapts
        if adapted.any():
            widths = widths + p.lora_wrapped_in_prefix
        n = batch.num_new_tokens[mask].astype(float)
        per_rank = float((n * (widths[last] - widths[first])).sum())
        num_bytes = c.lora_token_gather_share * p.adapter_rank * per_rank * p.weight_dtype_bytes
        t += num_bytes / p.tp / (p.gpu.hbm_bandwidth_bytes_per_s * c.memory_bandwidth_efficiency)
    return t


def _lora_grid_s(c: CostCoeffs, p: LayerCosts, batch: StepBatch, mask: np.ndarray,
                 adapted: np.ndarray) -> float:
    """Seconds of the GPU LoRA kernels' launch grid: a fixed cost per step, each program
    that exits at once (slots without tokens) and each that computes (`sim.cost.lora_kernels`)."""
    grid = p.lora_grid
    if grid is None or not (c.lora_kernel_step_s or c.lora_idle_shrink_program_s
                            or c.lora_idle_expand_program_s or c.lora_working_program_s
                            or c.lora_working_mac_s):
        return 0.0
    if not adapted.any() and not p.lora_kernels_run_unadapted:
        return 0.0
    num_tokens = int(batch.num_new_tokens[mask].sum())
    # The adapted tokens counted as spread evenly over the step's distinct adapters: a step's
    # price then depends only on counts (what the simulator's fast path caches prices by).
    num_adapters = np.unique(batch.adapter_ids[adapted]).size
    tokens = np.full(num_adapters, batch.num_new_tokens[adapted].sum() / max(num_adapters, 1))
    shrink, expand, working = lora_program_counts(grid, num_tokens, tokens, p.adapter_rank or 1)
    t = (c.lora_kernel_step_s + shrink * c.lora_idle_shrink_program_s
         + expand * c.lora_idle_expand_program_s + working * c.lora_working_program_s)
    if c.lora_working_mac_s:  # 0 in a profile without it: its prices stay bit for bit
        t += c.lora_working_mac_s * lora_working_macs(grid, tokens, p.adapter_rank or 1)
    return t


def _direft_s(c: CostCoeffs, p: LayerCosts, batch: StepBatch, mask: np.ndarray) -> float:
    """DiReFT seconds of the adapted items in `mask`, by its own shapes: a rank-r edit of the
    residual stream (A and B, r x hidden) on each edited layer, for the edited positions only
    (prompt positions under DiReFT_P), plus a per-layer, per-adapter edit overhead."""
    adapted = _adapted_mask(p, batch, mask)
    if p.adapter_kind != "direft" or not adapted.any():
        return 0.0
    t, num_adapters = _adapter_read_s(c, p, batch, adapted, c.direft_flops_efficiency)
    first, last = batch.first_layer[adapted], batch.last_layer[adapted]
    num_layers = float(p.direft_layers_prefix[last.max()] - p.direft_layers_prefix[first.min()])
    return t + c.direft_layer_overhead_s * num_layers * num_adapters


def _communication_s(c: CostCoeffs, p: LayerCosts, tokens: np.ndarray) -> float:
    """Two all-reduces of the activations per layer under tensor parallelism."""
    if p.tp == 1:
        return 0.0
    interconnect = "nvlink" if p.gpu.nvlink_bandwidth_bytes_per_s else "pcie"
    return tensor_parallel_communication_s(
        tp=p.tp, hidden_size=p.hidden_size, tokens_per_layer=tokens,
        fit=find_all_reduce_fit(c.all_reduce_fits, p.tp, interconnect),
        link_bytes_per_s=p.gpu.nvlink_bandwidth_bytes_per_s or p.gpu.pcie_bandwidth_bytes_per_s,
        efficiency=c.communication_efficiency, latency_s=c.communication_latency_s,
        latency_per_gpu_s=c.communication_latency_per_gpu_s)


def _model_terms(c: CostCoeffs, p: LayerCosts, batch: StepBatch, mask: np.ndarray) -> dict:
    tokens = _tokens_per_layer(p, batch, mask)
    logit_rows = int((batch.is_last_chunk & mask & (batch.last_layer == p.num_layers)).sum())
    dense, moe = _gemm_s(c, p, tokens, logit_rows)
    return {
        "dense_gemm_s": dense,
        "moe_gemm_s": moe,
        "attention_s": _attention_s(c, p, batch, mask),
        "lora_s": _lora_s(c, p, batch, mask),
        "direft_s": _direft_s(c, p, batch, mask),
        "communication_s": _communication_s(c, p, tokens),
    }


def routing_decision_s(c: CostCoeffs, p: LayerCosts, num_decisions: int) -> float:
    """Seconds of `num_decisions` routing-head decisions (pointer head over cached options), at
    least `p.min_decision_s` each (a measured time of a head that runs inside the step)."""
    if num_decisions == 0:
        return 0.0
    g = p.gpu
    # Option embeddings are cached: each decision runs the head once on one pooled query.
    t = _roofline(2.0 * p.num_head_params * num_decisions, p.num_head_params * 2.0,
                  g.bf16_dense_flops, c.gemm_flops_efficiency, g.hbm_bandwidth_bytes_per_s,
                  c.memory_bandwidth_efficiency)
    return max(float(t) + num_decisions * c.routing_overhead_s, num_decisions * p.min_decision_s)


def predict_step(coeffs: CostCoeffs, profile: LayerCosts, batch: StepBatch) -> StepCost:
    """Seconds of one engine step, split into named terms (replays priced in `replay_s`)."""
    everything = np.ones(batch.num_new_tokens.shape[0], dtype=bool)
    all_terms = _model_terms(coeffs, profile, batch, everything)
    # Without replays the regular items are all items: the same terms (replay_s is then 0).
    has_replay = bool(batch.is_replay.any())
    regular = _model_terms(coeffs, profile, batch, ~batch.is_replay) if has_replay else all_terms
    replay = sum(all_terms.values()) - sum(regular.values())
    num_seqs = int((~batch.is_replay).sum())
    is_empty = num_seqs == 0 and not has_replay and batch.num_routing_decisions == 0
    layers = (int(batch.last_layer.max() - batch.first_layer.min())
              if batch.first_layer.size else None)
    overhead = 0.0 if is_empty else _overhead_s(coeffs, num_seqs, bool(batch.is_prompt.any()),
                                                layers)
    return StepCost(
        **regular,
        replay_s=replay,
        routing_s=routing_decision_s(coeffs, profile, batch.num_routing_decisions),
        overhead_s=overhead,
    )


def _overhead_s(c: CostCoeffs, num_seqs: int, has_prompt: bool, num_layers: int | None) -> float:
    """Fixed costs of a step of `num_seqs` sequences over a span of `num_layers` layers."""
    overhead = c.step_overhead_s + num_seqs * c.per_sequence_overhead_s
    if has_prompt:
        overhead += c.prompt_step_overhead_s
    if c.layer_overhead_s and num_layers is not None:
        overhead += c.layer_overhead_s * float(num_layers)
    return overhead


def predict_counted_step(coeffs: CostCoeffs, profile: LayerCosts, *, num_tokens: int,
                         num_samples: int, num_adapted_tokens: int, num_adapters: int,
                         num_items: int, has_prompt: bool,
                         num_routing_decisions: int = 0) -> StepCost:
    """`predict_step` of a non-empty step whose items all run every layer and none is a
    replay, from its counts alone, attention left out (attention_s 0: it depends on each
    item's context). Such a step's other terms see its items only through these counts, in
    sums of whole numbers (exact in any order while the profile's per-layer widths are whole
    and the sums stay below 2**53), so they are predict_step's for any batch with these
    counts, bit for bit: this prices them on one adapted item per distinct adapter and one
    unadapted item, without a batch of every item."""
    n = num_adapters + 1
    new = np.zeros(n, dtype=np.int64)
    new[0] = num_adapted_tokens
    new[num_adapters] += num_tokens - num_adapted_tokens
    ids = np.arange(n, dtype=np.int64)
    ids[num_adapters] = -1
    batch = StepBatch(
        num_new_tokens=new, num_context_tokens=np.zeros(n, dtype=np.int64), adapter_ids=ids,
        is_adapted=ids >= 0, first_layer=np.zeros(n, dtype=np.int64),
        last_layer=np.full(n, profile.num_layers, dtype=np.int64),
        is_replay=np.zeros(n, dtype=bool), is_last_chunk=np.ones(n, dtype=bool),
        is_prompt=np.zeros(n, dtype=bool))
    everything = np.ones(n, dtype=bool)
    tokens = _tokens_per_layer(profile, batch, everything)
    dense, moe = _gemm_s(coeffs, profile, tokens, num_samples)
    return StepCost(
        dense_gemm_s=dense, moe_gemm_s=moe, attention_s=0.0,
        lora_s=_lora_s(coeffs, profile, batch, everything),
        direft_s=_direft_s(coeffs, profile, batch, everything), replay_s=0.0,
        routing_s=routing_decision_s(coeffs, profile, num_routing_decisions),
        communication_s=_communication_s(coeffs, profile, tokens),
        overhead_s=_overhead_s(coeffs, num_items, has_prompt, profile.num_layers))
