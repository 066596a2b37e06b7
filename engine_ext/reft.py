"""DiReFT: a low-rank edit of the residual stream, h + B^T (A h + b), at chosen layers.

`apply_direft(model, spec)` attaches a `DiReFT` module as `layer.direft` on the chosen layers; the
model runners call `intervene(layer, h)` on each layer's output. Like `LoRALinear`, a `DiReFT`
holds several adapter slots and edits each token with the slot its forward context names, so the
prefill-only variant (DiReFT_P) is the same module with prefill-only token slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from engine_ext.forward_context import get_forward_context


class ReftSpec(BaseModel):
    """Where a DiReFT adapter edits the residual stream."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=1)
    """Rank r of the edit."""
    layers: tuple[int, ...]
    """Layers whose output is edited."""
    prefill_only: bool = True
    """DiReFT_P: edit prompt positions only (the form PreFT serves)."""
    first_positions: int | None = Field(default=None, ge=0)
    """Edit only the first f prompt positions (with `last_positions`: ReFT's "f+l" window)."""
    last_positions: int | None = Field(default=None, ge=0)
    """Edit only the last l prompt positions (and, unless prefill_only, every generated one)."""

    @model_validator(mode="after")
    def _layers_distinct(self) -> ReftSpec:
        if len(set(self.layers)) != len(self.layers) or any(x < 0 for x in self.layers):
            raise ValueError(f"DiReFT layers must be distinct and >= 0, got {self.layers}")
        return self

    @property
    def window(self) -> tuple[int, int] | None:
        """(first, last) positions edited, or None when every position is."""
        if self.first_positions is None and self.last_positions is None:
            return None
        return self.first_positions or 0, self.last_positions or 0


def in_window(window: tuple[int, int] | None, positions: torch.Tensor,
              prompt_lens: torch.Tensor) -> torch.Tensor:
    """Bool [N]: which tokens a DiReFT window edits. positions, prompt_lens: [N] per token.

    A window (f, l) keeps prompt positions < f and positions >= prompt_len - l; the
    prefill-only rule (no generated token) is applied separately, by the token's adapter slot.
    """
    if window is None:
        return torch.ones_like(positions, dtype=torch.bool)
    first, last = window
    return (positions < first) | (positions >= prompt_lens - last)


def direft_delta(h: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 bias: torch.Tensor) -> torch.Tensor:
    """The DiReFT edit B^T (A h + b) of rows h [n, D]; a, b [r, D], bias [r] -> [n, D]."""
    return (h @ a.T + bias) @ b


class DiReFT(nn.Module):
    """Residual edit with `max_loras` slots: A [r, D], B [r, D], b [r] per slot."""

    def __init__(self, d_model: int, max_loras: int, max_rank: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.proj_a = nn.Parameter(torch.zeros(max_loras, max_rank, d_model))
        self.proj_b = nn.Parameter(torch.zeros(max_loras, max_rank, d_model))
        self.bias = nn.Parameter(torch.zeros(max_loras, max_rank))
        self.ranks = [0] * max_loras
        self.windows: list[tuple[int, int] | None] = [None] * max_loras

    def set_slot(self, slot: int, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor,
                 window: tuple[int, int] | None = None) -> None:
        """Write one adapter: a, b [r, D], bias [r]; window: see `in_window`."""
        rank = a.shape[0]
        with torch.no_grad():
            for param in (self.proj_a, self.proj_b, self.bias):
                param[slot].zero_()
            self.proj_a[slot, :rank] = a
            self.proj_b[slot, :rank] = b
            self.bias[slot, :rank] = bias
        self.ranks[slot] = rank
        self.windows[slot] = window

    def clear_slot(self, slot: int) -> None:
        """Empty `slot`."""
        self.set_slot(slot, torch.zeros(0, self.d_model), torch.zeros(0, self.d_model),
                      torch.zeros(0))

    def slot_weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """a [r, D], b [r, D], bias [r] of `slot` (detached copies)."""
        r = self.ranks[slot]
        return (self.proj_a[slot, :r].detach().clone(), self.proj_b[slot, :r].detach().clone(),
                self.bias[slot, :r].detach().clone())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [..., D] residual stream; returns it edited per token."""
        ctx = get_forward_context()
        if ctx is None or not any(self.ranks):
            return h
        flat = h.reshape(-1, self.d_model)  # [N, D]
        slots = [s for s in ctx.active_slots() if self.ranks[s]]
        if not slots:
            return h
        out = torch.zeros_like(flat)
        for slot in slots:
            chosen = ctx.token_slots == slot  # [N]
            if self.windows[slot] is not None:
                if ctx.positions is None:
                    raise ValueError("a windowed DiReFT needs positions in the forward context")
                chosen &= in_window(self.windows[slot], ctx.positions, ctx.prompt_lens)
            rows = chosen.nonzero().squeeze(1)  # [n_s]
            r = self.ranks[slot]
            delta = direft_delta(flat[rows], self.proj_a[slot, :r], self.proj_b[slot, :r],
                                 self.bias[slot, :r])  # [n_s, D]
            out = out.index_add(0, rows, delta)
        return h + out.view(h.shape)


def intervene(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Apply the layer's DiReFT edit to its output h, if it has one."""
    direft = getattr(layer, "direft", None)
    return h if direft is None else direft(h)


def apply_direft(
    layers: nn.ModuleList, spec: ReftSpec, *, d_model: int, max_loras: int = 4, max_rank: int = 16
) -> list[int]:
    """Attach a `DiReFT` to each layer `spec` names (idempotent); returns those layer indices."""
    if spec.rank > max_rank:
        raise ValueError(f"DiReFT rank {spec.rank} exceeds max_rank={max_rank}")
    for idx in spec.layers:
        if idx >= len(layers):
            raise ValueError(f"DiReFT layer {idx} outside 0..{len(layers) - 1}")
        if getattr(layers[idx], "direft", None) is None:
            layers[idx].direft = DiReFT(d_model, max_loras, max_rank)
    return list(spec.layers)


@dataclass
class ReftWeights:
    """One DiReFT adapter in memory: spec and (a, b, bias) per layer."""

    spec: ReftSpec
    tensors: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def random_reft(spec: ReftSpec, d_model: int, generator: torch.Generator) -> ReftWeights:
    """Random DiReFT weights (tests, benchmarks)."""
    scale = d_model**-0.5
    tensors = {
        layer: (torch.randn(spec.rank, d_model, generator=generator) * scale,
                torch.randn(spec.rank, d_model, generator=generator) * scale,
                torch.randn(spec.rank, generator=generator) * 0.1)
        for layer in spec.layers
    }
    return ReftWeights(spec=spec, tensors=tensors)
