"""Where an adapter's LoRA sits, and the CED placement rule that keeps the KV shared.

Under a shared-KV strategy the encoder state and the global KV must not depend on the adapter:
no LoRA on encoder layers and none on the attention of a decoder layer that writes global KV or
indexer keys (layer 20 on the reference model). Its FFN and the later decoder layers are allowed.
"""

from __future__ import annotations

from typing import Literal

from sim.hardware.specs import ModelArch

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def kv_writing_decoder_layers(arch: ModelArch) -> set[int]:
    """Decoder layers whose attention writes global KV or indexer keys read by other layers."""
    if arch.ced is None:
        return set()
    ced = arch.ced
    first_decoder = ced.num_encoder_layers
    return {layer for layer in ced.kv_source_layers if layer >= first_decoder}


SharedKvRule = tuple[int, frozenset[int]] | None
"""A CED model's (first decoder layer, KV-writing decoder layers); None on a decoder-only model."""


def shared_kv_rule(arch: ModelArch) -> SharedKvRule:
    """The placement rule of `arch`, computed once for checking many (layer, module) pairs."""
    if arch.ced is None:
        return None
    return arch.ced.num_encoder_layers, frozenset(kv_writing_decoder_layers(arch))


def _allowed(rule: SharedKvRule, layer: int, module: str) -> bool:
    if rule is None:
        return True
    first_decoder, kv_layers = rule
    if layer < first_decoder:
        return False
    return not (layer in kv_layers and module in ATTENTION_MODULES)


def is_allowed_under_shared_kv(arch: ModelArch, layer: int, module: str) -> bool:
    """Whether LoRA on (layer, module) leaves the shared KV adapter-independent."""
    return _allowed(shared_kv_rule(arch), layer, module)


def placement_violations(
    arch: ModelArch, layers: tuple[int, ...] | None, modules: tuple[str, ...]
) -> list[tuple[int, str]]:
    """(layer, module) pairs that break KV sharing; explicit layers only (None is resolved)."""
    if layers is None:
        return []
    rule = shared_kv_rule(arch)
    return [(layer, m) for layer in layers for m in modules if not _allowed(rule, layer, m)]


def adapter_placements(
    arch: ModelArch, layers: tuple[int, ...] | None, modules: tuple[str, ...]
) -> list[tuple[int, str]]:
    """(layer, module) pairs an adapter wraps.

    layers=None means every layer of a decoder-only model, and on a CED model every
    (layer, module) the placement rule allows, whatever the strategy: CED adapters are trained
    on the decoder side so that they share the KV.
    """
    chosen = range(arch.num_layers) if layers is None else layers
    pairs = [(layer, module) for layer in chosen for module in modules]
    if layers is None:
        rule = shared_kv_rule(arch)
        pairs = [(la, m) for la, m in pairs if _allowed(rule, la, m)]
    return pairs


def layers_out_of_range(arch: ModelArch, layers: tuple[int, ...] | None) -> list[int]:
    """Layer indices that the model does not have."""
    return [] if layers is None else [x for x in layers if not 0 <= x < arch.num_layers]


KvLayout = Literal["one_copy", "shared", "per_adapter", "per_model"]
"""How a conversation's KV relates to its adapters.

one_copy: no adapter touches KV (the base model). shared: a CED model whose adapters all obey
the placement rule: one encoder state and global KV for every adapter, and a switch replays the
last W positions through the decoder. per_adapter: KV depends on the adapter (a decoder-only
model, or CED adapters that break the rule): a switch re-prefills under the target unless that
adapter's prefix cache still holds the context. per_model: one full model per domain."""


def kv_layout_of_placements(arch: ModelArch,
                            placements: list[list[tuple[int, str]]]) -> KvLayout:
    """The KV layout adapters imply from where they sit (a strategy may override it:
    `sim.strategies.registry.kv_layout`).

    `placements` holds each adapter's (layer, module) pairs, already resolved.
    """
    if not any(placements):
        return "one_copy"
    rule = shared_kv_rule(arch)
    if rule is not None and all(_allowed(rule, layer, module)
                                for pairs in placements for layer, module in pairs):
        return "shared"
    return "per_adapter"
