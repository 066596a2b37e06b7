"""Per-forward metadata read by adapter layers: which adapter slot each token uses.

One `ForwardContext` is set around a model forward (as vLLM does with its forward context), so
LoRA linears and DiReFT interventions stay drop-in modules with unchanged call signatures. The
prefill-only rule is folded into `token_slots` here, outside the layers: a token of a prefill-only
adapter that is not a prompt token gets slot -1 (base weights). Computing it from positions and
prompt lengths, not from "is this the first chunk", keeps it correct under chunked prefill.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

NO_ADAPTER = -1

_CURRENT: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "engine_ext_forward_context", default=None
)


@dataclass(frozen=True)
class ForwardContext:
    """Adapter slot per token of the current forward, flattened in row-major token order."""

    token_slots: torch.Tensor
    """[N] long: adapter slot of each token, NO_ADAPTER (-1) for base weights."""
    positions: torch.Tensor | None = None
    """[N] long: absolute position of each token (position-windowed DiReFT reads it)."""
    prompt_lens: torch.Tensor | None = None
    """[N] long: prompt length of each token's request."""

    @property
    def num_tokens(self) -> int:
        """Number of tokens N the context describes."""
        return int(self.token_slots.numel())

    def active_slots(self) -> list[int]:
        """Distinct adapter slots present in this forward, sorted (base excluded)."""
        return [s for s in torch.unique(self.token_slots).tolist() if s != NO_ADAPTER]


def get_forward_context() -> ForwardContext | None:
    """The context of the forward now running, or None outside `forward_context`."""
    return _CURRENT.get()


@contextlib.contextmanager
def forward_context(ctx: ForwardContext | None) -> Iterator[ForwardContext | None]:
    """Make `ctx` visible to adapter layers for the duration of a forward."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def build_token_slots(
    request_slots: Sequence[int],
    positions: torch.Tensor,
    prompt_lens: Sequence[int],
    prefill_only: Sequence[bool],
) -> torch.Tensor:
    """Slot per token for a batch of equal-length chunks.

    request_slots: adapter slot per request (-1: none). positions: [B, T] absolute positions of
    the chunk's tokens. prompt_lens: prompt length per request; a position below it is a prompt
    (prefill) token. prefill_only: per slot, whether that adapter is applied to prompt tokens only.
    Returns [B*T] long.
    """
    slots = torch.tensor(list(request_slots), dtype=torch.long)  # [B]
    lens = torch.tensor(list(prompt_lens), dtype=torch.long)  # [B]
    is_prompt = positions < lens[:, None]  # [B, T]
    flags = torch.tensor([False, *prefill_only], dtype=torch.bool)  # index 0 = NO_ADAPTER
    is_prefill_only = flags[slots + 1]  # [B]
    token_slots = slots[:, None].expand_as(positions).clone()  # [B, T]
    drop = is_prefill_only[:, None] & ~is_prompt  # [B, T]
    token_slots[drop] = NO_ADAPTER
    return token_slots.reshape(-1)


def uniform_context(slot: int, num_tokens: int) -> ForwardContext:
    """Every token on one slot (or on the base weights with slot -1)."""
    return ForwardContext(token_slots=torch.full((num_tokens,), slot, dtype=torch.long))
