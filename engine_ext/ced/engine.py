"""Session-level operations on the CED model: prefill, decode, switch by bounded replay, oracle.

The engine owns the adapter registry (with the placement rule of the shared-KV strategy) and
builds the per-forward context from each request's adapter, positions and prompt length.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch

from engine_ext.ced.model import CEDForCausalLM, ChunkOutput
from engine_ext.ced.state import CEDState
from engine_ext.forward_context import forward_context
from engine_ext.lora import LoraWeights
from engine_ext.placement import check_lora_placement, check_reft_placement
from engine_ext.reft import ReftWeights
from engine_ext.registry import AdapterRegistry

Adapters = Sequence[str | None] | str | None


class CEDEngine:
    """A CED model plus its adapter slots."""

    def __init__(
        self,
        model: CEDForCausalLM,
        *,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        allow_unsafe_placement: bool = False,
    ) -> None:
        self.model = model
        self.config = model.config
        self.registry = AdapterRegistry(
            model, model.model.layers, d_model=model.config.d_model, max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            lora_check=partial(check_lora_placement, model.config,
                               allow_unsafe=allow_unsafe_placement),
            reft_check=partial(check_reft_placement, model.config,
                               allow_unsafe=allow_unsafe_placement),
        )

    def add_adapter(
        self, name: str, lora: LoraWeights | None = None, reft: ReftWeights | None = None
    ) -> int:
        """Load an adapter (placement-checked); returns its slot."""
        return self.registry.add(name, lora, reft)

    def new_state(self, batch_size: int = 1) -> CEDState:
        """Empty cache for `batch_size` lock-step sequences."""
        return CEDState.empty(self.config, batch_size)

    def _adapters(self, adapters: Adapters, batch_size: int) -> list[str | None]:
        if adapters is None or isinstance(adapters, str):
            return [adapters] * batch_size
        if len(adapters) != batch_size:
            raise ValueError(f"{len(adapters)} adapters for a batch of {batch_size}")
        return list(adapters)

    def forward(
        self,
        state: CEDState,
        tokens: torch.Tensor,
        adapters: Adapters,
        *,
        prompt_len: int | None = None,
        collect_hidden: bool = False,
        encoder_only: bool = False,
    ) -> ChunkOutput:
        """One chunk tokens [B, T]; positions below `prompt_len` (default: all) are prompt.
        encoder_only: see `CEDForCausalLM.forward_chunk`."""
        b, t = tokens.shape
        positions = torch.arange(state.num_positions, state.num_positions + t)
        lens = [state.num_positions + t if prompt_len is None else prompt_len] * b
        ctx = self.registry.context(self._adapters(adapters, b), positions.expand(b, t), lens)
        with forward_context(ctx):
            return self.model.forward_chunk(tokens, state, collect_hidden=collect_hidden,
                                            encoder_only=encoder_only)

    def prefill(
        self,
        state: CEDState,
        tokens: torch.Tensor,
        adapters: Adapters,
        *,
        chunk_size: int | None = None,
        collect_hidden: bool = False,
    ) -> ChunkOutput:
        """Prefill tokens [B, T] in chunks of `chunk_size` (default one chunk); logits [B, T, V]."""
        step = chunk_size or tokens.shape[1]
        outs = [self.forward(state, tokens[:, i : i + step], adapters,
                             collect_hidden=collect_hidden)
                for i in range(0, tokens.shape[1], step)]
        per_layer = zip(*(o.decoder_hidden for o in outs), strict=True)
        return ChunkOutput(
            logits=torch.cat([o.logits for o in outs], dim=1),
            encoder_hidden=torch.cat([o.encoder_hidden for o in outs], dim=1),
            decoder_hidden=[torch.cat(hs, dim=1) for hs in per_layer],
        )

    def feed_tokens(
        self, state: CEDState, tokens: torch.Tensor, adapters: Adapters,
        *, collect_hidden: bool = False,
    ) -> ChunkOutput:
        """Token-by-token (decode-style) processing of tokens [B, T]; logits [B, T, V]."""
        return self.prefill(state, tokens, adapters, chunk_size=1, collect_hidden=collect_hidden)

    def decode_step(self, state: CEDState, token: torch.Tensor, adapters: Adapters,
                    *, prompt_len: int) -> torch.Tensor:
        """One decode token [B, 1] (a position >= prompt_len: prefill-only adapters are off)."""
        return self.forward(state, token, adapters, prompt_len=prompt_len).logits[:, -1]

    def switch(self, state: CEDState, adapters: Adapters, *,
               collect_hidden: bool = False) -> ChunkOutput:
        """Bounded replay of the last W positions under `adapters` (they count as prompt)."""
        b = state.batch_size
        num = state.anchor_hidden.shape[1]
        positions = torch.arange(state.num_positions - num, state.num_positions)
        ctx = self.registry.context(self._adapters(adapters, b), positions.expand(b, num),
                                    [state.num_positions] * b)
        with forward_context(ctx):
            return self.model.replay(state, collect_hidden=collect_hidden)

    def oracle(self, tokens: torch.Tensor, adapters: Adapters, *,
               chunk_size: int | None = None) -> tuple[CEDState, ChunkOutput]:
        """Full recompute of tokens [B, T] under `adapters` from an empty state."""
        state = self.new_state(tokens.shape[0])
        return state, self.prefill(state, tokens, adapters, chunk_size=chunk_size)

    def encode_on_branch(self, state: CEDState, tokens: torch.Tensor) -> torch.Tensor:
        """Contextual MoL: H19 [B, T, D] of tokens [B, T] encoded after the history.

        Runs the encoder only, on a temporary copy of the state (the "global-KV branch"),
        dropped on return, so the session's own state is untouched.
        """
        branch = state.clone()
        return self.forward(branch, tokens, None, encoder_only=True).encoder_hidden

    def encode(self, tokens: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        """H19 [B, T, D] of tokens [B, T] from an empty state, the encoder only, in chunks of
        `chunk_size` (default one chunk; chunks keep the local attention's work linear in T).
        A routing pass: nothing is kept."""
        state, step = self.new_state(tokens.shape[0]), chunk_size or tokens.shape[1]
        return torch.cat([self.forward(state, tokens[:, i : i + step], None,
                                       encoder_only=True).encoder_hidden
                          for i in range(0, tokens.shape[1], step)], dim=1)
