"""Pure shape arithmetic of a transformer: parameter counts per part and LoRA-able module shapes.

All counts are numbers of weights (not bytes) for the whole model, before tensor parallelism.
"""

from __future__ import annotations

from collections import Counter

from sim.hardware.specs import ModelArch


def attention_params_per_layer(arch: ModelArch) -> int:
    """Weights of one attention block: Q, K/V (or the MLA latent path) and O projections."""
    h, nh, hd = arch.hidden_size, arch.num_attention_heads, arch.head_dim
    q = h * nh * (hd + arch.qk_rope_head_dim)
    o = nh * hd * h
    if arch.attention == "gqa":
        return q + 2 * h * arch.num_kv_heads * hd + o
    # MLA: down-project to the latent (+ rope key), up-project the latent to per-head K and V.
    kv_down = h * (arch.kv_lora_rank + arch.qk_rope_head_dim)
    kv_up = arch.kv_lora_rank * nh * 2 * hd
    return q + kv_down + kv_up + o


def dense_ffn_params(arch: ModelArch) -> int:
    """Weights of one gated dense FFN (gate, up, down)."""
    return 3 * arch.hidden_size * arch.intermediate_size


def expert_params(arch: ModelArch) -> int:
    """Weights of one routed or shared expert (gated FFN); 0 for a dense model."""
    if arch.moe is None:
        return 0
    return 3 * arch.hidden_size * arch.moe.expert_intermediate_size


def is_moe_layer(arch: ModelArch, layer: int) -> bool:
    """Whether `layer` uses experts rather than a dense FFN."""
    return arch.moe is not None and layer >= arch.moe.num_dense_layers


def num_moe_layers(arch: ModelArch) -> int:
    """Layers whose FFN is a mixture of experts."""
    return 0 if arch.moe is None else arch.num_layers - arch.moe.num_dense_layers


def embedding_params(arch: ModelArch) -> int:
    """Input embedding plus output head (shared when tied)."""
    one = arch.vocab_size * arch.hidden_size
    return one if arch.tie_word_embeddings else 2 * one


def total_params(arch: ModelArch) -> int:
    """All weights of the model, experts included."""
    num_moe = num_moe_layers(arch)
    num_dense = arch.num_layers - num_moe
    moe_per_layer = 0
    if arch.moe is not None:
        num_experts = arch.moe.num_routed_experts + arch.moe.num_shared_experts
        router_gate = arch.hidden_size * arch.moe.num_routed_experts
        moe_per_layer = num_experts * expert_params(arch) + router_gate
    return (
        arch.num_layers * attention_params_per_layer(arch)
        + num_dense * dense_ffn_params(arch)
        + num_moe * moe_per_layer
        + embedding_params(arch)
    )


def module_shape(arch: ModelArch, module: str, layer: int) -> tuple[int, int]:
    """(in_features, out_features) of a LoRA-able linear module at `layer`.

    On MoE layers the FFN modules are the shared expert's (vLLM does not wrap routed experts
    with LoRA), so their width is the expert intermediate size.
    """
    h, nh, hd = arch.hidden_size, arch.num_attention_heads, arch.head_dim
    kv_width = arch.kv_lora_rank if arch.attention == "mla" else arch.num_kv_heads * hd
    inter = arch.intermediate_size
    if is_moe_layer(arch, layer):
        inter = arch.moe.expert_intermediate_size * max(arch.moe.num_shared_experts, 1)
    shapes = {
        "q_proj": (h, nh * (hd + arch.qk_rope_head_dim)),
        "k_proj": (h, kv_width),
        "v_proj": (h, kv_width),
        "o_proj": (nh * hd, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    if module not in shapes:
        raise KeyError(f"unknown module {module!r}; LoRA-able modules: {sorted(shapes)}")
    return shapes[module]


_PER_RANK_CACHE: dict[tuple[int, tuple], tuple[ModelArch, int]] = {}
"""lora_weights_per_rank by (id of the arch, placements), holding the arch so its id stays its
own: scenario validation prices every model's whole-model LoRA buffers hundreds of times."""
MAX_PER_RANK_CACHE = 256


def lora_weights_per_rank(arch: ModelArch, placements: list[tuple[int, str]]) -> int:
    """A and B weights per unit of rank over (layer, module) placements: sum of in + out."""
    key = (id(arch), tuple(placements))
    cached = _PER_RANK_CACHE.get(key)
    if cached is not None and cached[0] is arch:  # a frozen arch: same object, same shapes
        return cached[1]
    if len(_PER_RANK_CACHE) >= MAX_PER_RANK_CACHE:
        _PER_RANK_CACHE.clear()
    value = _lora_weights_per_rank(arch, placements)
    _PER_RANK_CACHE[key] = (arch, value)
    return value


def _lora_weights_per_rank(arch: ModelArch, placements: list[tuple[int, str]]) -> int:
    # Shapes depend only on (dense or MoE layer, module): price each kind once, not each pair.
    kinds = Counter((is_moe_layer(arch, layer), module) for layer, module in placements)
    first_moe = arch.moe.num_dense_layers if arch.moe is not None else 0
    return sum(count * sum(module_shape(arch, module, first_moe if moe else 0))
               for (moe, module), count in kinds.items())
