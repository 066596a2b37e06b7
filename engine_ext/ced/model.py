"""The causal encoder-decoder (CED) model: chunked forward over a `CEDState`, and bounded replay.

Layers 0..E-1 are the encoder (their output is H19, exposed for routing), layers E..L-1 the
decoder. KV-source layers write one compressed latent per position from their normed input;
index layers pick the top-k visible latents for each query and later layers reuse the pick.
A source's latents become visible at the index layer that owns it and never to shallower layers,
so a one-pass prefill, a chunked prefill and token-by-token decoding compute the same function.

Bounded replay: under the placement rule everything up to layer-E attention is LoRA-independent,
so a switch keeps it and recomputes only layer-E FFN and the layers above over the last W
positions, starting from the stored residual after layer-E attention (the "anchor").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from engine_ext.ced.layers import CEDLayer, RMSNorm, Selection, rope_tables
from engine_ext.ced.state import CEDState
from engine_ext.config import EngineConfig
from engine_ext.reft import intervene


@dataclass
class ChunkOutput:
    """What one forward returns."""

    logits: torch.Tensor
    """[B, T, V]."""
    encoder_hidden: torch.Tensor
    """[B, T, D]: output of the last encoder layer (H19 in the reference layout)."""
    decoder_hidden: list[torch.Tensor] = field(default_factory=list)
    """Per decoder layer E..L-1, its output [B, T, D] (only when asked for)."""


class CEDBackbone(nn.Module):
    """Embeddings, layers and final norm (named like Llama's `model`)."""

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(CEDLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class CEDForCausalLM(nn.Module):
    """CED language model. All methods mutate the `CEDState` they are given."""

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = CEDBackbone(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def num_sources_upto(self, layer: int) -> int:
        """How many KV-source layers sit at or below `layer`."""
        return sum(1 for s in self.config.kv_source_layers if s <= layer)

    def forward_chunk(
        self, tokens: torch.Tensor, state: CEDState, *, collect_hidden: bool = False,
        encoder_only: bool = False,
    ) -> ChunkOutput:
        """Run tokens [B, T] at the next T positions, extending `state`.

        encoder_only: stop after layer E-1 (a routing pass needs H19 only; the decoder would
        double its work): the logits are empty [B, T, 0] and only the encoder's side of `state`
        is extended (the decoder sources' latents are left zero, as entries_for gives them to
        the encoder), so the state then serves further encoder_only chunks only.
        """
        cfg = self.config
        b, t = tokens.shape
        p0 = state.num_positions
        positions = torch.arange(p0, p0 + t)  # [T]
        rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        num_total = len(cfg.kv_source_layers)
        new_latents: list[torch.Tensor | None] = [None] * num_total

        def entries_for(num_sources: int) -> torch.Tensor:
            # Sources not yet written at this depth are zeros; the indexer never picks them.
            zero = tokens.new_zeros(b, t, cfg.d_latent, dtype=self.lm_head.weight.dtype)
            chunk = [new_latents[s] if s < num_sources else zero for s in range(num_total)]
            stacked = torch.stack(chunk, dim=2)  # [B, T, S, d_latent]
            if state.latents is not None:
                stacked = torch.cat([state.latents, stacked], dim=1)  # [B, P0+T, S, d_latent]
            return stacked.flatten(1, 2)  # [B, (P0+T)*S, d_latent]

        h = self.model.embed_tokens(tokens)  # [B, T, D]
        selection, out = None, ChunkOutput(logits=h, encoder_hidden=h)
        for layer_idx, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(h)
            attn = layer.self_attn
            if attn.is_source:
                new_latents[cfg.kv_source_layers.index(layer_idx)] = attn.compress(x)
            h, selection = self._attend(layer_idx, h, x, positions, rope, state, selection,
                                        entries_for)
            if layer_idx == cfg.first_decoder_layer:
                self._record_anchor(state, h, selection)
            h = intervene(layer, layer.ffn_block(h))
            if layer_idx == cfg.first_decoder_layer - 1:
                out.encoder_hidden = h
                if encoder_only:
                    break
            if collect_hidden and layer_idx >= cfg.first_decoder_layer:
                out.decoder_hidden.append(h)
        zero = tokens.new_zeros(b, t, cfg.d_latent, dtype=self.lm_head.weight.dtype)
        stacked = torch.stack([zero if x is None else x for x in new_latents], dim=2)  # [B,T,S,dL]
        state.latents = stacked if state.latents is None else torch.cat([state.latents, stacked], 1)
        state.num_positions = p0 + t
        out.logits = h.new_empty(b, t, 0) if encoder_only else self.lm_head(self.model.norm(h))
        return out

    def _attend(
        self,
        layer_idx: int,
        h: torch.Tensor,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        state: CEDState,
        selection: Selection | None,
        entries_for: Callable[[int], torch.Tensor],
    ) -> tuple[torch.Tensor, Selection | None]:
        """Attention half of one layer: h [B, T, D] residual, x its normed copy."""
        attn = self.model.layers[layer_idx].self_attn
        if attn.is_index:
            num_sources = self.num_sources_upto(layer_idx)
            selection = attn.select(x, entries_for(num_sources), positions, num_sources)
        attn_out, state.local_kv[layer_idx] = attn(
            x, positions, rope, state.local_kv[layer_idx], selection
        )
        return h + attn_out, selection

    def _record_anchor(self, state: CEDState, h: torch.Tensor, sel: Selection | None) -> None:
        """Keep the last W residuals after layer-E attention and their top-k picks."""
        assert sel is not None, "layer E is an index layer by config validation"
        w = self.config.window
        parts = [(state.anchor_hidden, h), (state.anchor_index, sel.index),
                 (state.anchor_valid, sel.valid)]
        merged = [new if old is None else torch.cat([old, new], dim=1) for old, new in parts]
        state.anchor_hidden, state.anchor_index, state.anchor_valid = (m[:, -w:] for m in merged)

    def replay(self, state: CEDState, *, collect_hidden: bool = False) -> ChunkOutput:
        """Bounded replay under the adapter of the current forward context.

        Drops the decoder local KV above layer E and recomputes the last W positions from the
        anchor through layer-E FFN and layers E+1..L-1. Returns logits [B, W, V] for them;
        `encoder_hidden` is the anchor itself (the encoder is not re-run).
        """
        cfg = self.config
        if state.anchor_hidden is None:
            raise ValueError("nothing to replay: the state holds no positions")
        num_replay = state.anchor_hidden.shape[1]
        positions = torch.arange(state.num_positions - num_replay, state.num_positions)  # [W]
        rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        entries = state.latents.flatten(1, 2)  # [B, P*S, d_latent], all written already
        selection = Selection(entries, state.anchor_index, state.anchor_valid)
        state.drop_decoder_kv(cfg)
        first = cfg.first_decoder_layer
        first_layer = self.model.layers[first]
        h = intervene(first_layer, first_layer.ffn_block(state.anchor_hidden))  # [B, W, D]
        out = ChunkOutput(logits=h, encoder_hidden=state.anchor_hidden)
        if collect_hidden:
            out.decoder_hidden.append(h)
        for layer_idx in range(first + 1, cfg.num_layers):
            layer = self.model.layers[layer_idx]
            x = layer.input_layernorm(h)
            h, selection = self._attend(layer_idx, h, x, positions, rope, state, selection,
                                        lambda _n: entries)
            h = intervene(layer, layer.ffn_block(h))
            if collect_hidden:
                out.decoder_hidden.append(h)
        out.logits = self.lm_head(self.model.norm(h))
        return out
