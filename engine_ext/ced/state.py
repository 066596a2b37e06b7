"""Per-batch cache of the CED model: what is shared by every adapter and what is not.

Shared (LoRA-independent under the placement rule): encoder local KV, layer-E local KV, the global
latents, and the replay anchor (residual after layer-E attention and its top-k pick for the last W
positions). Adapter-dependent: the local KV of the decoder layers above E, over the last W
positions; bounded replay drops and recomputes exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine_ext.config import EngineConfig

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class CEDState:
    """Mutable cache of `batch_size` sequences that advance in lock-step."""

    batch_size: int
    num_positions: int = 0
    local_kv: list[KV | None] = field(default_factory=list)
    """Per layer: keys and values [B, H, <=W, head_dim] of the last W positions (RoPE applied)."""
    latents: torch.Tensor | None = None
    """[B, P, S, d_latent]: one global latent per position and KV-source layer."""
    anchor_hidden: torch.Tensor | None = None
    """[B, <=W, D]: residual stream after layer-E attention, last W positions."""
    anchor_index: torch.Tensor | None = None
    """[B, <=W, k] long: global entries (p * S + s) that layer E picked for those positions."""
    anchor_valid: torch.Tensor | None = None
    """[B, <=W, k] bool: whether each pick is a real (causally visible) entry."""

    @classmethod
    def empty(cls, cfg: EngineConfig, batch_size: int) -> CEDState:
        """State of `batch_size` sequences before any token."""
        return cls(batch_size=batch_size, local_kv=[None] * cfg.num_layers)

    def drop_decoder_kv(self, cfg: EngineConfig) -> None:
        """Forget the adapter-dependent local KV (layers above the first decoder layer)."""
        for layer in range(cfg.first_decoder_layer + 1, cfg.num_layers):
            self.local_kv[layer] = None

    def clone(self) -> CEDState:
        """Independent copy (tensors cloned), e.g. to branch one history into two switches."""

        def cp(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.clone()

        return CEDState(
            batch_size=self.batch_size,
            num_positions=self.num_positions,
            local_kv=[None if kv is None else (kv[0].clone(), kv[1].clone())
                      for kv in self.local_kv],
            latents=cp(self.latents),
            anchor_hidden=cp(self.anchor_hidden),
            anchor_index=cp(self.anchor_index),
            anchor_valid=cp(self.anchor_valid),
        )

    def shared_tensors(self, cfg: EngineConfig) -> dict[str, torch.Tensor]:
        """The LoRA-independent part, by name (tests compare it across adapters)."""
        out: dict[str, torch.Tensor] = {}
        for layer in range(cfg.first_decoder_layer + 1):
            kv = self.local_kv[layer]
            if kv is not None:
                out[f"local_k.{layer}"], out[f"local_v.{layer}"] = kv
        for name in ("latents", "anchor_hidden", "anchor_index", "anchor_valid"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out
