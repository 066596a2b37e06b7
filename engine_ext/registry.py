"""Adapter slots of one model: names to slots, validated loading, per-forward contexts.

An adapter may carry LoRA weights, DiReFT weights or both; all its parts share one slot index, so
one `ForwardContext` drives every adapter module. Loading validates everything first and writes
only after, so a bad adapter leaves the model and the registry as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from engine_ext.forward_context import NO_ADAPTER, ForwardContext, build_token_slots
from engine_ext.lora import LoraWeights, apply_lora, lora_modules
from engine_ext.placement import PlacementError
from engine_ext.reft import ReftWeights, apply_direft


class AdapterLoadError(ValueError):
    """An adapter (or adapter file) cannot be loaded; names the source and the tensor."""

    def __init__(self, source: str, tensor: str, reason: str) -> None:
        super().__init__(f"{source}: tensor {tensor!r}: {reason}")
        self.source, self.tensor, self.reason = source, tensor, reason


def _model_linears(model: nn.Module) -> dict[str, nn.Module]:
    # A wrapped LoRALinear is reported under the wrapped linear's name.
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and not name.endswith(".base"):
            out[name] = module
        elif hasattr(module, "lora_a"):
            out[name] = module
    return out


def validate_lora(model: nn.Module, weights: LoraWeights, source: str, max_rank: int) -> None:
    """Check every tensor against the model's shapes and the spec's rank; raise on the first."""
    linears = _model_linears(model)
    if weights.spec.rank > max_rank:
        raise AdapterLoadError(source, "*", f"rank {weights.spec.rank} > max_lora_rank {max_rank}")
    if not weights.tensors:
        raise AdapterLoadError(source, "*", "no LoRA tensors")
    for name, (a, b) in sorted(weights.tensors.items()):
        if name not in linears:
            raise AdapterLoadError(source, name, "no such linear module in the base model")
        lin = linears[name]
        want_a = (weights.spec.rank, lin.in_features)
        want_b = (lin.out_features, weights.spec.rank)
        if tuple(a.shape) != want_a:
            raise AdapterLoadError(source, f"{name}.lora_A", f"shape {tuple(a.shape)} != {want_a}")
        if tuple(b.shape) != want_b:
            raise AdapterLoadError(source, f"{name}.lora_B", f"shape {tuple(b.shape)} != {want_b}")


class AdapterRegistry:
    """Slots 0..max_loras-1 of one model, each holding one named adapter."""

    def __init__(
        self,
        model: nn.Module,
        layers: nn.ModuleList,
        *,
        d_model: int,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        lora_check: Callable[[list[str]], None] | None = None,
        reft_check: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.model, self.layers, self.d_model = model, layers, d_model
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.lora_check, self.reft_check = lora_check, reft_check
        self.slots: dict[str, int] = {}
        self.prefill_only: list[bool] = [False] * max_loras

    def add(
        self,
        name: str,
        lora: LoraWeights | None = None,
        reft: ReftWeights | None = None,
        *,
        source: str | None = None,
    ) -> int:
        """Validate then load an adapter into a free slot; returns the slot."""
        source = source or name
        if name in self.slots:
            raise AdapterLoadError(source, "*", f"adapter {name!r} already loaded")
        free = [s for s in range(self.max_loras) if s not in self.slots.values()]
        if not free:
            raise AdapterLoadError(source, "*", f"all {self.max_loras} slots are taken")
        if lora is None and reft is None:
            raise AdapterLoadError(source, "*", "adapter has neither LoRA nor DiReFT weights")
        self._validate(source, lora, reft)
        slot = free[0]
        self._write(slot, lora, reft)
        self.slots[name] = slot
        parts = [p.spec for p in (lora, reft) if p is not None]
        self.prefill_only[slot] = any(spec.prefill_only for spec in parts)
        return slot

    def _validate(self, source: str, lora: LoraWeights | None, reft: ReftWeights | None) -> None:
        try:
            if lora is not None:
                validate_lora(self.model, lora, source, self.max_lora_rank)
                if self.lora_check is not None:
                    self.lora_check(sorted(lora.tensors))
            if reft is not None and self.reft_check is not None:
                self.reft_check(sorted(reft.tensors))
        except PlacementError as err:
            raise AdapterLoadError(source, err.module, err.reason) from err

    def _write(self, slot: int, lora: LoraWeights | None, reft: ReftWeights | None) -> None:
        if lora is not None:
            apply_lora(self.model, lora.spec, max_loras=self.max_loras,
                       max_lora_rank=self.max_lora_rank)
            modules = lora_modules(self.model)
            for module_name, (a, b) in lora.tensors.items():
                modules[module_name].set_slot(slot, a, b, lora.spec.scaling)
        if reft is not None:
            apply_direft(self.layers, reft.spec, d_model=self.d_model, max_loras=self.max_loras,
                         max_rank=self.max_lora_rank)
            for layer, (a, b, bias) in reft.tensors.items():
                self.layers[layer].direft.set_slot(slot, a, b, bias, reft.spec.window)

    def remove(self, name: str) -> None:
        """Empty the slot of adapter `name`."""
        slot = self.slots.pop(name)
        for module in lora_modules(self.model).values():
            module.clear_slot(slot)
        for layer in self.layers:
            if getattr(layer, "direft", None) is not None:
                layer.direft.clear_slot(slot)
        self.prefill_only[slot] = False

    def slot_of(self, name: str | None) -> int:
        """Slot of adapter `name`; None means the base model (-1)."""
        return NO_ADAPTER if name is None else self.slots[name]

    def context(
        self,
        adapters: Sequence[str | None],
        positions: torch.Tensor,
        prompt_lens: Sequence[int],
    ) -> ForwardContext:
        """Context for a batch chunk: adapter per request, positions [B, T], prompt lengths."""
        slots = [self.slot_of(a) for a in adapters]
        lens = torch.tensor(list(prompt_lens), dtype=torch.long)[:, None].expand_as(positions)
        return ForwardContext(build_token_slots(slots, positions, prompt_lens, self.prefill_only),
                              positions=positions.reshape(-1), prompt_lens=lens.reshape(-1))
