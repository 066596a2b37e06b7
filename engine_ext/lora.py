"""LoRA as a transformation: `apply_lora` swaps chosen `nn.Linear`s for a drop-in `LoRALinear`.

A `LoRALinear` holds `max_loras` adapter slots (padded to `max_lora_rank`) and applies, per token,
the slot named by the current `ForwardContext`: batched heterogeneous LoRA, as Punica's kernels do.
Two equivalent paths: "sgmv" groups tokens by slot (one small matmul pair per distinct adapter, so
its cost grows with the number of distinct adapters), "bgmv" gathers each token's A and B.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from engine_ext.forward_context import NO_ADAPTER, get_forward_context

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class LoraSpec(BaseModel):
    """Which modules an adapter touches and how it is scaled."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=1)
    """LoRA rank r."""
    alpha: float = Field(gt=0)
    """Scaling numerator: the update is (alpha / rank) * B @ A."""
    target_modules: tuple[str, ...]
    """Leaf module names, e.g. ("q_proj", "down_proj")."""
    layers: tuple[int, ...] | None = None
    """Layer indices to adapt; None adapts every layer that has a target module."""
    prefill_only: bool = False
    """LoRA_P: apply to prompt tokens only, decode on base weights."""
    base_model: str = ""
    """Name of the base model the adapter was trained on (checked on load when both are set)."""

    @field_validator("target_modules")
    @classmethod
    def _canonical_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Sorted and unique, so a spec read back from a file compares equal to the original.
        return tuple(sorted(set(value)))

    @property
    def scaling(self) -> float:
        """alpha / rank."""
        return self.alpha / self.rank


def layer_index(module_name: str) -> int | None:
    """Layer number inside a dotted module name (`model.layers.7.mlp.up_proj` -> 7)."""
    match = _LAYER_RE.search(module_name)
    return int(match.group(1)) if match else None


def spec_matches(spec: LoraSpec, module_name: str) -> bool:
    """Whether `spec` targets the module called `module_name`."""
    if module_name.rsplit(".", 1)[-1] not in spec.target_modules:
        return False
    if spec.layers is None:
        return True
    return layer_index(module_name) in spec.layers


class LoRALinear(nn.Module):
    """Drop-in `nn.Linear` with `max_loras` LoRA slots, picked per token by the forward context."""

    def __init__(self, base: nn.Linear, max_loras: int, max_lora_rank: int) -> None:
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        like = dict(dtype=base.weight.dtype, device=base.weight.device)
        self.lora_a = nn.Parameter(torch.zeros(max_loras, max_lora_rank, self.in_features, **like))
        self.lora_b = nn.Parameter(torch.zeros(max_loras, self.out_features, max_lora_rank, **like))
        self.register_buffer("scaling", torch.zeros(max_loras, **like))
        self.ranks = [0] * max_loras  # 0 = slot empty for this module
        self.mode: Literal["sgmv", "bgmv"] = "sgmv"

    @property
    def weight(self) -> torch.Tensor:
        """The base weight, so code that reads `.weight` keeps working."""
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        """The base bias."""
        return self.base.bias

    def set_slot(self, slot: int, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
        """Write one adapter's A [r, in] and B [out, r] into `slot` (rank padded with zeros)."""
        rank = a.shape[0]
        with torch.no_grad():
            self.lora_a[slot].zero_()
            self.lora_b[slot].zero_()
            self.lora_a[slot, :rank] = a
            self.lora_b[slot, :, :rank] = b
            self.scaling[slot] = scaling
        self.ranks[slot] = rank

    def clear_slot(self, slot: int) -> None:
        """Empty `slot`: tokens on it then run the base weights in this module."""
        with torch.no_grad():
            self.lora_a[slot].zero_()
            self.lora_b[slot].zero_()
            self.scaling[slot] = 0
        self.ranks[slot] = 0

    def slot_weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A [r, in] and B [out, r] of `slot`, unpadded (detached copies)."""
        rank = self.ranks[slot]
        a = self.lora_a[slot, :rank].detach().clone()
        return a, self.lora_b[slot, :, :rank].detach().clone()

    def delta_weight(self, slot: int) -> torch.Tensor:
        """scaling * B @ A of `slot`: [out, in], the update merging folds into the base weight."""
        a, b = self.lora_a[slot, : self.ranks[slot]], self.lora_b[slot, :, : self.ranks[slot]]
        return self.scaling[slot] * (b @ a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [..., out]
        ctx = get_forward_context()
        if ctx is None or not any(self.ranks):
            return y
        flat = x.reshape(-1, self.in_features)  # [N, in]
        if flat.shape[0] != ctx.num_tokens:
            raise RuntimeError(
                f"forward context describes {ctx.num_tokens} tokens, LoRA input has {flat.shape[0]}"
            )
        slots = [s for s in ctx.active_slots() if self.ranks[s]]
        if not slots:
            return y
        if self.mode == "bgmv":
            delta = self._bgmv(flat, ctx.token_slots)
        else:
            delta = self._sgmv(flat, ctx.token_slots, slots)
        return y + delta.view(y.shape)

    def _sgmv(self, x: torch.Tensor, token_slots: torch.Tensor, slots: list[int]) -> torch.Tensor:
        # Grouped by adapter: one (x_s @ A_s^T) @ B_s^T per distinct slot in the batch.
        out = x.new_zeros(x.shape[0], self.out_features)  # [N, out]
        for slot in slots:
            rows = (token_slots == slot).nonzero().squeeze(1)  # [n_s]
            rank = self.ranks[slot]
            shrunk = x[rows] @ self.lora_a[slot, :rank].T  # [n_s, r]
            expanded = (shrunk @ self.lora_b[slot, :, :rank].T) * self.scaling[slot]  # [n_s, out]
            out = out.index_add(0, rows, expanded)
        return out

    def _bgmv(self, x: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
        # Gathered per token: every token reads its own slot's A and B (padded rank).
        safe = token_slots.clamp(min=0)  # [N]
        a = self.lora_a[safe]  # [N, R, in]
        b = self.lora_b[safe]  # [N, out, R]
        shrunk = torch.einsum("ni,nri->nr", x, a)  # [N, R]
        out = torch.einsum("nr,nor->no", shrunk, b) * self.scaling[safe][:, None]  # [N, out]
        return out * (token_slots != NO_ADAPTER)[:, None].to(out.dtype)


def apply_lora(
    model: nn.Module, spec: LoraSpec, *, max_loras: int = 4, max_lora_rank: int = 16
) -> list[str]:
    """Wrap every `nn.Linear` that `spec` targets in a `LoRALinear`; return their names.

    Idempotent: a module already wrapped (by an earlier spec) is kept as it is.
    """
    if spec.rank > max_lora_rank:
        raise ValueError(f"rank {spec.rank} exceeds max_lora_rank={max_lora_rank}")
    wrapped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear) or not isinstance(module, nn.Linear):
            continue
        if not spec_matches(spec, name):
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, LoRALinear(module, max_loras, max_lora_rank))
        wrapped.append(name)
    already = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    return sorted(set(wrapped) | {n for n in already if spec_matches(spec, n)})


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """Every `LoRALinear` in `model`, by module name (the name of the wrapped linear)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def set_lora_mode(model: nn.Module, mode: Literal["sgmv", "bgmv"]) -> None:
    """Choose the grouped or gathered batched path in every LoRA linear."""
    for module in lora_modules(model).values():
        module.mode = mode


@dataclass
class LoraWeights:
    """One adapter in memory: its spec and A [r, in], B [out, r] per module name."""

    spec: LoraSpec
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor]]


def extract_slot(model: nn.Module, spec: LoraSpec, slot: int) -> LoraWeights:
    """Copy the weights in `slot` of every module `spec` targets (e.g. after training)."""
    tensors = {
        name: module.slot_weights(slot)
        for name, module in lora_modules(model).items()
        if spec_matches(spec, name) and module.ranks[slot]
    }
    return LoraWeights(spec=spec, tensors=tensors)


def init_slot(model: nn.Module, spec: LoraSpec, slot: int, generator: torch.Generator) -> None:
    """Fresh trainable adapter in `slot`: A small random, B zero (so it starts as the base)."""
    for name, module in lora_modules(model).items():
        if spec_matches(spec, name):
            a = torch.randn(spec.rank, module.in_features, generator=generator)
            a = a * module.in_features**-0.5
            b = torch.zeros(module.out_features, spec.rank)
            module.set_slot(slot, a, b, spec.scaling)


def merge_slot(model: nn.Module, slot: int, names: Iterable[str] | None = None) -> None:
    """Fold `slot` into the base weights in place (reference for the batched path)."""
    modules = lora_modules(model)
    with torch.no_grad():
        for name in names if names is not None else modules:
            module = modules[name]
            if module.ranks[slot]:
                module.base.weight += module.delta_weight(slot)


def random_lora(
    model: nn.Module, spec: LoraSpec, generator: torch.Generator, *, std: float = 0.5
) -> LoraWeights:
    """Random A and non-zero B for every linear `spec` targets (tests, benchmarks)."""
    tensors = {}
    for name, module in model.named_modules():
        if name.endswith(".base") or not isinstance(module, (nn.Linear, LoRALinear)):
            continue
        if spec_matches(spec, name):
            a = torch.randn(spec.rank, module.in_features, generator=generator)
            b = torch.randn(module.out_features, spec.rank, generator=generator)
            tensors[name] = (a * module.in_features**-0.5, b * std * spec.rank**-0.5)
    return LoraWeights(spec=spec, tensors=tensors)
