"""Routing heads over H19 (the last encoder layer's output), callable from the engine or a plugin.

* `PointerHead` (MoL2): the query is the mean-pooled H19 of the user turn (standardised per
  feature with statistics fitted on training states, `FeatureScale`); each option is a
  description whose token embeddings go through a deeper option side (MLP blocks and
  self-attention within the option), computed once and cached by `encode_options`. A light query
  projection, one cross-attention layer from the query to all option tokens, then a q.k pointer
  score per option. No temporary model state.
* `ContextualHead`: a q/k scoring head between the pooled H19 of the query and the pooled H19 of
  each option description encoded after the query (on a temporary branch of the model state).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over positions: hidden [B, T, D], mask [B, T] (True = keep) -> [B, D]."""
    if mask is None:
        return hidden.mean(dim=1)
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # [B, T, 1]
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class _Block(nn.Module):
    """Pre-norm residual MLP block."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class FeatureScale(nn.Module):
    """Per-feature standardisation with fixed statistics, saved with the head (buffers).

    A decoder's residual stream has a few massive-activation dimensions (on SmolLM2's layer 25
    one is ~1000x the typical magnitude); without this they drown the other features of a
    pooled state. `fit` sets the statistics from training states; the defaults (0, 1) are the
    identity.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))

    @torch.no_grad()
    def fit(self, x: torch.Tensor) -> None:
        """x [N, dim] (or [..., dim]): training states."""
        flat = x.reshape(-1, x.shape[-1])
        self.mean.copy_(flat.mean(0))
        self.std.copy_(flat.std(0).clamp(min=1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


@dataclass(frozen=True)
class OptionCache:
    """Option side of the pointer head, computed once per option set."""

    tokens: torch.Tensor
    """[O, L, d_head]: contextualised option token states."""
    mask: torch.Tensor
    """[O, L] bool: real (non-padding) option tokens."""
    keys: torch.Tensor
    """[O, d_head]: pointer keys, one per option."""


class PointerHead(nn.Module):
    """MoL2 pointer head: query [B, d_query] against cached options -> logits [B, O]."""

    def __init__(self, d_query: int, d_option: int, *, d_head: int = 64, num_heads: int = 4,
                 option_depth: int = 2) -> None:
        super().__init__()
        self.option_in = nn.Linear(d_option, d_head)
        self.option_blocks = nn.ModuleList(_Block(d_head) for _ in range(option_depth))
        self.option_attn = nn.MultiheadAttention(d_head, num_heads, batch_first=True)
        self.option_norm = nn.LayerNorm(d_head)
        self.key_proj = nn.Linear(d_head, d_head)
        self.query_scale = FeatureScale(d_query)
        self.query_proj = nn.Linear(d_query, d_head)  # the light query side
        self.cross_attn = nn.MultiheadAttention(d_head, num_heads, batch_first=True)
        self.query_norm = nn.LayerNorm(d_head)
        self.pointer_q = nn.Linear(d_head, d_head)
        self.scale = d_head**-0.5

    def encode_options(self, embeds: torch.Tensor, mask: torch.Tensor) -> OptionCache:
        """embeds [O, L, d_option] (token embeddings of each description), mask [O, L]."""
        x = self.option_in(embeds)  # [O, L, d_head]
        for block in self.option_blocks:
            x = block(x)
        attended, _ = self.option_attn(x, x, x, key_padding_mask=~mask)  # within each option
        x = self.option_norm(x + attended)
        keys = self.key_proj(mean_pool(x, mask))  # [O, d_head]
        return OptionCache(tokens=x, mask=mask, keys=keys)

    def forward(self, query: torch.Tensor, options: OptionCache) -> torch.Tensor:
        """query [B, d_query] (mean-pooled H19) -> pointer logits [B, O]."""
        q = self.query_proj(self.query_scale(query)).unsqueeze(1)  # [B, 1, d_head]
        flat = options.tokens[options.mask]  # [M, d_head]: every real option token
        memory = flat.unsqueeze(0).expand(q.shape[0], -1, -1)  # [B, M, d_head]
        ctx, _ = self.cross_attn(q, memory, memory)  # [B, 1, d_head]
        q = self.pointer_q(self.query_norm(q + ctx)).squeeze(1)  # [B, d_head]
        return (q @ options.keys.T) * self.scale  # [B, O]


class ContextualHead(nn.Module):
    """q/k scoring head: pooled query H19 [B, D] vs pooled option H19 [B, O, D] -> [B, O]."""

    def __init__(self, d_model: int, d_head: int = 64, d_option: int | None = None,
                 num_options: int | None = None) -> None:
        """d_option: width of the option states when it differs from the query's (a query
        read through a feature set, several layers side by side); each side then has its
        own standardisation. num_options: add a query-only term, a linear map of the
        standardised query to one logit per option (zero at the start), beside the q/k
        score; the head is then tied to that option set in that order."""
        super().__init__()
        self.feature_scale = FeatureScale(d_model)
        self.option_scale = None if d_option is None else FeatureScale(d_option)
        self.q = nn.Linear(d_model, d_head)
        self.k = nn.Linear(d_model if d_option is None else d_option, d_head)
        self.scale = d_head**-0.5
        self.query_logits = None if num_options is None else nn.Linear(d_model, num_options)
        if self.query_logits is not None:
            nn.init.zeros_(self.query_logits.weight)
            nn.init.zeros_(self.query_logits.bias)

    def fit_scales(self, queries: torch.Tensor, options: torch.Tensor) -> None:
        """Standardisation statistics from training states: queries [N, D], options
        [N, O, D_option] (one shared scale when the widths are the same)."""
        if self.option_scale is None:
            self.feature_scale.fit(torch.cat([queries, options.flatten(0, 1)]))
        else:
            self.feature_scale.fit(queries)
            self.option_scale.fit(options)

    def forward(self, query: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        x = self.feature_scale(query)
        q = self.q(x)  # [B, d_head]
        k = self.k((self.option_scale or self.feature_scale)(options))  # [B, O, d_head]
        logits = torch.einsum("bd,bod->bo", q, k) * self.scale  # [B, O]
        return logits if self.query_logits is None else logits + self.query_logits(x)


def pad_token_lists(token_lists: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, ...]:
    """Right-pad token id lists -> ids [O, L] long and mask [O, L] bool."""
    length = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(token_lists), length, dtype=torch.bool)
    for i, toks in enumerate(token_lists):
        ids[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        mask[i, : len(toks)] = True
    return ids, mask


@dataclass
class Router:
    """A pointer head plus the cached options it chooses between, named by adapter."""

    head: PointerHead
    options: OptionCache
    adapter_names: list[str | None]

    @classmethod
    def create(cls, head: PointerHead, embedding: nn.Embedding,
               descriptions: list[list[int]], adapter_names: list[str | None]) -> Router:
        """Embed and encode option descriptions once (start-up)."""
        ids, mask = pad_token_lists(descriptions)
        with torch.no_grad():
            options = head.encode_options(embedding(ids), mask)
        return cls(head=head, options=options, adapter_names=adapter_names)

    @torch.no_grad()
    def route(self, h19: torch.Tensor, mask: torch.Tensor | None = None) -> list[str | None]:
        """h19 [B, T, D] of each request's user turn -> chosen adapter per request."""
        logits = self.head(mean_pool(h19, mask), self.options)  # [B, O]
        return [self.adapter_names[i] for i in logits.argmax(-1).tolist()]
