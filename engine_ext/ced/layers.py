"""Building blocks of the CED model: RMSNorm, RoPE, gated FFN, and local+global attention.

Every layer attends jointly (one softmax) to its own local KV over a sliding window of W positions
and, from the first index layer on, to the top-k global-KV entries the latest index layer picked.
Global latents carry no position; they are up-projected to keys and values by each reading layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine_ext.ced.state import KV
from engine_ext.config import EngineConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> KV:
    """cos, sin [T, head_dim] for absolute `positions` [T]."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [hd/2]
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, hd/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, hd]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, hd] by the tables [T, hd] (half-split convention, as in Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class GatedMLP(nn.Module):
    """SiLU-gated FFN; module names follow Llama so PEFT target names carry over."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class Selection:
    """Top-k global entries per query, chosen by the latest index layer."""

    entries: torch.Tensor
    """[B, N, d_latent]: all global latents, flattened position-major (id = p * S + s)."""
    index: torch.Tensor
    """[B, T, k] long: picked entry ids per query."""
    valid: torch.Tensor
    """[B, T, k] bool: False for padding picks (fewer than k visible entries)."""


class CEDAttention(nn.Module):
    """Sliding-window local attention plus sparse attention over the shared global KV."""

    def __init__(self, cfg: EngineConfig, layer_idx: int) -> None:
        super().__init__()
        d, self.cfg = cfg.d_model, cfg
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.is_source = layer_idx in cfg.kv_source_layers
        self.is_index = layer_idx in cfg.index_layers
        self.reads_global = layer_idx >= cfg.index_layers[0]
        if self.is_source:
            self.compress = nn.Linear(d, cfg.d_latent, bias=False)
        if self.is_index:
            self.index_q = nn.Linear(d, cfg.num_index_heads * cfg.d_index, bias=False)
            self.index_k = nn.Linear(cfg.d_latent, cfg.d_index, bias=False)
        if self.reads_global:
            self.global_k = nn.Linear(cfg.d_latent, d, bias=False)
            self.global_v = nn.Linear(cfg.d_latent, d, bias=False)

    def select(
        self, x: torch.Tensor, entries: torch.Tensor, positions: torch.Tensor, num_sources: int
    ) -> Selection:
        """Indexer: score every visible entry for each query x [B, T, D] and keep the top-k.

        entries: [B, N, d_latent] with N = P * S; entry n sits at position n // S, source n % S,
        and is visible to the query at position t when its position <= t and its source is
        among the first `num_sources` (the ones already written at this depth).
        """
        cfg = self.cfg
        b, t, _ = x.shape
        num_total = len(cfg.kv_source_layers)
        # The heads' scores are summed, so their queries can be summed first: one product.
        q = self.index_q(x).view(b, t, cfg.num_index_heads, cfg.d_index).sum(2)  # [B, T, dI]
        keys = self.index_k(entries)  # [B, N, dI]; O(N), cheap next to the scores
        scores = (q * cfg.d_index**-0.5) @ keys.transpose(1, 2)  # [B, T, N]
        # Masks touch only what can be invisible, never a fresh [T, N] tensor: the sources not
        # yet written at this depth (a strided fill) and the positions after the chunk's first
        # query (the causal tail, at most T positions); older entries are visible to all.
        by_pos = scores.view(b, t, -1, num_total)  # [B, T, P, S]
        if num_sources < num_total:
            by_pos[..., num_sources:] = float("-inf")
        first = int(positions[0]) + 1
        tail_pos = torch.arange(first, by_pos.shape[2])  # [P - first]
        future = tail_pos[None, :] > positions[:, None]  # [T, P - first]
        by_pos[:, :, first:].masked_fill_(future[None, :, :, None], float("-inf"))
        if scores.shape[-1] < cfg.index_topk:  # pad so k is constant whatever the context
            scores = F.pad(scores, (0, cfg.index_topk - scores.shape[-1]), value=float("-inf"))
        top, index = scores.topk(cfg.index_topk, dim=-1)  # [B, T, k]
        valid = torch.isfinite(top)
        return Selection(entries, index.clamp(max=entries.shape[1] - 1), valid)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: KV,
        past: KV | None,
        selection: Selection | None,
    ) -> tuple[torch.Tensor, KV]:
        """x: [B, T, D] normed input; returns attention output [B, T, D] and the new local KV."""
        cfg = self.cfg
        b, t, d = x.shape
        h, hd = cfg.num_heads, cfg.head_dim
        q_raw = self.q_proj(x).view(b, t, h, hd).transpose(1, 2)  # [B, H, T, hd]
        q = apply_rope(q_raw, *rope)
        k = apply_rope(self.k_proj(x).view(b, t, h, hd).transpose(1, 2), *rope)  # [B, H, T, hd]
        v = self.v_proj(x).view(b, t, h, hd).transpose(1, 2)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # [B, H, Pk, hd]
        key_pos = torch.arange(positions[-1] + 1 - k.shape[2], positions[-1] + 1)  # [Pk]
        delta = positions[:, None] - key_pos[None, :]  # [T, Pk]
        local_mask = (delta >= 0) & (delta < cfg.window)
        scores = (q @ k.transpose(-1, -2)) * hd**-0.5  # [B, H, T, Pk]
        scores = scores.masked_fill(~local_mask, float("-inf"))
        if selection is None:
            out = torch.softmax(scores, dim=-1) @ v  # [B, H, T, hd]
        else:
            out = self._with_global(q_raw, scores, v, selection)
        out = self.o_proj(out.transpose(1, 2).reshape(b, t, d))  # [B, T, D]
        return out, (k[:, :, -cfg.window :], v[:, :, -cfg.window :])

    def _with_global(
        self, q_raw: torch.Tensor, local_scores: torch.Tensor, v: torch.Tensor, sel: Selection
    ) -> torch.Tensor:
        """One softmax over local keys and the picked global entries; returns [B, H, T, hd]."""
        b, h, t, hd = q_raw.shape
        batch_ids = torch.arange(b)[:, None, None]  # [B, 1, 1]
        picked = sel.entries[batch_ids, sel.index]  # [B, T, k, d_latent]
        k = sel.index.shape[-1]
        gk = self.global_k(picked).view(b, t, k, h, hd)  # [B, T, k, H, hd]
        gv = self.global_v(picked).view(b, t, k, h, hd)
        g_scores = torch.einsum("bhtd,btkhd->bhtk", q_raw, gk) * hd**-0.5  # [B, H, T, k]
        g_scores = g_scores.masked_fill(~sel.valid[:, None], float("-inf"))
        probs = torch.softmax(torch.cat([local_scores, g_scores], dim=-1), dim=-1)
        num_local = local_scores.shape[-1]
        out = probs[..., :num_local] @ v  # [B, H, T, hd]
        return out + torch.einsum("bhtk,btkhd->bhtd", probs[..., num_local:], gv)


class CEDLayer(nn.Module):
    """Pre-norm transformer layer; names mirror Llama (`self_attn`, `mlp`, two norms)."""

    def __init__(self, cfg: EngineConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = CEDAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = GatedMLP(cfg.d_model, cfg.d_ff)

    def ffn_block(self, h: torch.Tensor) -> torch.Tensor:
        """Residual FFN half of the layer; h: [B, T, D]."""
        return h + self.mlp(self.post_attention_layernorm(h))
