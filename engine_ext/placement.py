"""Placement rule of the shared-KV strategy on the CED model.

No adapter on the encoder (layers 0..E-1) and none on layer-E attention (its compressor and indexer
write the global KV, its keys and values feed the replay anchor). LoRA is allowed on layer-E FFN and
on every module of layers E+1..L-1; DiReFT on the outputs of layers E..L-1. Then the encoder state,
the global KV and the anchor are LoRA-independent, which is what bounded replay relies on.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_ext.config import EngineConfig
from engine_ext.lora import layer_index

# Linears applied to one row per token: the only ones a per-token LoRA slot can address.
TOKENWISE_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "compress",
     "index_q"}
)


class PlacementError(ValueError):
    """An adapter touches a module the shared-KV strategy must keep adapter-free."""

    def __init__(self, module: str, reason: str) -> None:
        super().__init__(f"{module}: {reason}")
        self.module = module
        self.reason = reason


def placement_violation(cfg: EngineConfig, module_name: str) -> str | None:
    """Why a LoRA on `module_name` breaks KV sharing, or None when it is allowed."""
    layer = layer_index(module_name)
    first = cfg.first_decoder_layer
    if layer is None:
        return "outside the transformer layers (embeddings or lm_head)"
    if layer < first:
        return f"layer {layer} is in the encoder (layers 0..{first - 1} are shared by all adapters)"
    if layer == first and ".self_attn." in module_name:
        return (f"layer {layer} attention writes the shared global KV and the replay anchor; "
                f"only its FFN may carry LoRA")
    return None


def check_lora_placement(
    cfg: EngineConfig, module_names: Iterable[str], *, allow_unsafe: bool = False
) -> None:
    """Raise `PlacementError` for the first module that breaks the rule.

    `allow_unsafe=True` lets experiments place LoRA anywhere per-token LoRA can run (for example
    to show that LoRA on layer-E attention breaks the bitwise independence of the history).
    """
    for name in sorted(module_names):
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in TOKENWISE_MODULES:
            raise PlacementError(name, f"{leaf!r} is not a per-token linear; LoRA unsupported")
        reason = placement_violation(cfg, name)
        if reason is not None and not allow_unsafe:
            raise PlacementError(name, reason + " (pass allow_unsafe_placement=True to force)")


def check_reft_placement(
    cfg: EngineConfig, layers: Iterable[int], *, allow_unsafe: bool = False
) -> None:
    """DiReFT may edit the outputs of layers E..L-1 only (unless `allow_unsafe`)."""
    for layer in sorted(layers):
        if layer < cfg.first_decoder_layer and not allow_unsafe:
            raise PlacementError(
                f"layers.{layer}.direft",
                f"layer {layer} is in the encoder (pass allow_unsafe_placement=True to force)",
            )
