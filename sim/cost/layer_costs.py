"""Per-layer constants the cost model needs, computed once per (model, GPU, TP, adapter shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim.cost.lora_kernels import LoraGrid, create_lora_grid
from sim.cost.memory_model import kv_bytes_per_token_per_layer, kv_replication
from sim.cost.model_shapes import (
    attention_params_per_layer,
    dense_ffn_params,
    expert_params,
    is_moe_layer,
    module_shape,
)
from sim.hardware.specs import GpuSpec, ModelArch


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """Plain arrays and numbers derived from the architecture; the cost model reads only these."""

    num_layers: int
    gpu: GpuSpec
    tp: int
    weight_dtype_bytes: float
    hidden_size: int
    dense_params_per_layer: np.ndarray  # float [L]: attention + dense FFN / shared experts + gate
    is_moe_layer: np.ndarray  # float [L]: 1.0 where the FFN is routed experts
    expert_params: int
    num_routed_experts: int
    num_experts_per_token: int
    lm_head_params: int
    attention_flops_per_pair: float  # per query-key pair per layer, per GPU
    kv_layer_bytes_per_gpu: float  # local KV bytes per token per layer, per GPU
    standard_prefix: np.ndarray  # int [L+1]: prefix count of full-attention decoder-only layers
    encoder_prefix: np.ndarray  # int [L+1]: prefix count of CED encoder layers
    decoder_prefix: np.ndarray  # int [L+1]: prefix count of CED sliding-window decoder layers
    index_prefix: np.ndarray  # int [L+1]: prefix count of CED index layers
    compression_ratio: int
    global_record_bytes: int
    index_key_bytes: int
    index_topk: int
    window_tokens: int
    adapter_kind: Literal["lora", "direft", "none"]
    adapter_rank: int
    adapter_weights_prefix: np.ndarray  # float [L+1]: prefix sum of adapter weights per unit rank
    lora_slices_prefix: np.ndarray  # int [L+1]: prefix count of module slices the engine wraps
    lora_wrapped_in_prefix: np.ndarray  # float [L+1]: prefix sum of wrapped slices' in-features
    lora_wrapped_out_prefix: np.ndarray  # float [L+1]: prefix sum of their out-features
    direft_layers_prefix: np.ndarray  # int [L+1]: prefix count of layers a DiReFT adapter edits
    num_head_params: int
    min_decision_s: float = 0.0
    """Least seconds one routing-head decision takes on the GPU (a measured decision time of a
    head that runs inside the engine's step); 0: the head's own roofline time."""
    lora_grid: LoraGrid | None = None
    """Launch grid of the engine's GPU LoRA kernels over its `max_loras` slots (None: no
    LoRA-enabled engine, or `max_loras` not given)."""
    lora_kernels_run_unadapted: bool = True
    """The LoRA kernels run on a step with no adapted token (vLLM 0.8.5 launches them for
    base-model requests too); False where the adapter path is skipped then (PreFT)."""


def _prefix(mask: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(mask)]).astype(np.int64)


def _attention_flops_per_pair(arch: ModelArch) -> float:
    # Score (q.k) and value (p.v) products per head; MLA runs absorbed over the latent.
    if arch.attention == "gqa":
        qk, v = arch.head_dim, arch.head_dim
    else:
        qk, v = arch.kv_lora_rank + arch.qk_rope_head_dim, arch.kv_lora_rank
    return 2.0 * arch.num_attention_heads * (qk + v)


def _adapter_weights_per_layer(
    arch: ModelArch, kind: str, placements: list[tuple[int, str]]
) -> np.ndarray:
    weights = np.zeros(arch.num_layers)
    for layer, module in placements:
        if kind == "direft":
            # DiReFT edits the residual stream once per layer: A and B are rank x hidden.
            weights[layer] = 2 * arch.hidden_size
        else:
            weights[layer] += sum(module_shape(arch, module, layer))
    return weights


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Linear modules vLLM wraps with LoRA on every layer when no target_modules limit is set."""


def _wrapped_widths(arch: ModelArch, placements) -> tuple[np.ndarray, ...]:
    """Per layer: wrapped slice count, summed in-features, summed out-features."""
    count, width_in, width_out = (np.zeros(arch.num_layers) for _ in range(3))
    for layer, module in placements:
        d_in, d_out = module_shape(arch, module, layer)
        count[layer] += 1
        width_in[layer] += d_in
        width_out[layer] += d_out
    return count, width_in, width_out


def create_layer_costs(
    arch: ModelArch, gpu: GpuSpec, tensor_parallel_size: int = 1, *,
    adapter_kind: Literal["lora", "direft", "none"] = "none", adapter_rank: int = 0,
    adapter_placements: list[tuple[int, str]] = (), num_head_params: int = 0,
    lora_wrapped_placements: list[tuple[int, str]] | None = None, min_decision_s: float = 0.0,
    max_loras: int = 0, lora_kernels_run_unadapted: bool = True,
) -> LayerCosts:
    """Precompute the per-layer arrays for `predict_step`. `lora_wrapped_placements` are the
    (layer, module) slices the engine's LoRA path runs for every token (None: for LoRA, every
    module of `LORA_MODULES` on every layer, as vLLM wraps them; none for other kinds).
    `max_loras` > 0 gives the wrapped slices' GPU kernel grid (`sim.lora_kernels`)."""
    layers = np.arange(arch.num_layers)
    moe = np.array([is_moe_layer(arch, int(i)) for i in layers], dtype=float)
    shared = 0
    if arch.moe is not None:
        shared = arch.moe.num_shared_experts * expert_params(arch)
        shared += arch.hidden_size * arch.moe.num_routed_experts  # router gate
    ffn = np.where(moe > 0, shared, dense_ffn_params(arch))
    dense = attention_params_per_layer(arch) + ffn
    ced = arch.ced
    is_encoder = layers < ced.num_encoder_layers if ced else np.zeros(arch.num_layers, bool)
    is_decoder = (layers >= ced.num_encoder_layers) if ced else np.zeros(arch.num_layers, bool)
    is_index = np.isin(layers, ced.index_layers) if ced else np.zeros(arch.num_layers, bool)
    tp = tensor_parallel_size
    kv_layer = kv_bytes_per_token_per_layer(arch) * kv_replication(arch, tp)
    adapter_weights = _adapter_weights_per_layer(arch, adapter_kind, list(adapter_placements))
    if lora_wrapped_placements is None and adapter_kind == "lora":
        lora_wrapped_placements = [(i, m) for i in range(arch.num_layers) for m in LORA_MODULES]
    wrapped = lora_wrapped_placements or []
    num_slices, width_in, width_out = _wrapped_widths(arch, wrapped)
    grid = None
    if max_loras > 0 and wrapped:
        grid = create_lora_grid({(layer, m): module_shape(arch, m, layer)
                                 for layer, m in wrapped}, max_loras)
    edited = np.zeros(arch.num_layers, bool)
    edited[[layer for layer, _ in adapter_placements]] = adapter_kind == "direft"
    return LayerCosts(
        num_layers=arch.num_layers, gpu=gpu, tp=tp, weight_dtype_bytes=arch.weight_dtype_bytes,
        hidden_size=arch.hidden_size, dense_params_per_layer=dense.astype(float),
        is_moe_layer=moe, expert_params=expert_params(arch),
        num_routed_experts=arch.moe.num_routed_experts if arch.moe else 0,
        num_experts_per_token=arch.moe.num_experts_per_token if arch.moe else 0,
        lm_head_params=arch.vocab_size * arch.hidden_size,
        attention_flops_per_pair=_attention_flops_per_pair(arch) / tp,
        kv_layer_bytes_per_gpu=kv_layer,
        standard_prefix=_prefix(~(is_encoder | is_decoder)),
        encoder_prefix=_prefix(is_encoder), decoder_prefix=_prefix(is_decoder),
        index_prefix=_prefix(is_index),
        compression_ratio=ced.global_kv_compression_ratio if ced else 1,
        global_record_bytes=ced.global_kv_record_bytes if ced else 0,
        index_key_bytes=ced.index_key_bytes if ced else 0,
        index_topk=ced.index_topk if ced else 0,
        window_tokens=ced.sliding_window_tokens if ced else 0,
        adapter_kind=adapter_kind, adapter_rank=adapter_rank,
        adapter_weights_prefix=np.concatenate([[0.0], np.cumsum(adapter_weights)]),
        lora_slices_prefix=_prefix(num_slices),
        lora_wrapped_in_prefix=np.concatenate([[0.0], np.cumsum(width_in)]),
        lora_wrapped_out_prefix=np.concatenate([[0.0], np.cumsum(width_out)]),
        direft_layers_prefix=_prefix(edited),
        num_head_params=num_head_params, min_decision_s=min_decision_s,
        lora_grid=grid, lora_kernels_run_unadapted=lora_kernels_run_unadapted,
    )
