"""Validated configuration of the causal encoder-decoder (CED) model, with named presets.

The layout follows the 40-layer CED model of the domain brief (encoder 0-19, global-KV sources
2/8/14/20, index layers 2/8/14/20/24/28/32/36, sliding window W=128), scaled down by config.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineConfig(BaseModel):
    """Shape and layout of one CED model. Frozen: derive variants with `model_copy(update=...)`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vocab_size: int = Field(ge=2)
    """Token vocabulary size (the trained model uses bytes plus a few specials)."""
    d_model: int = Field(ge=8)
    """Width of the residual stream."""
    num_heads: int = Field(ge=1)
    """Attention heads per layer (local and global attention share them)."""
    d_ff: int = Field(ge=8)
    """Hidden width of the gated FFN."""
    num_layers: int = Field(ge=2)
    """Total layers, encoder plus decoder."""
    num_encoder_layers: int = Field(ge=1)
    """Layers 0..num_encoder_layers-1 form the encoder; H19 is the output of the last of them."""
    kv_source_layers: tuple[int, ...]
    """Layers whose attention writes one compressed global-KV latent per position."""
    index_layers: tuple[int, ...]
    """Layers that score global-KV entries and pick the top-k; later layers reuse the pick."""
    window: int = Field(default=128, ge=1)
    """Local sliding-window length W (also the bounded-replay length)."""
    d_latent: int = Field(ge=1)
    """Width of one compressed global-KV latent."""
    d_index: int = Field(ge=1)
    """Width of the indexer keys and of each indexer query head."""
    num_index_heads: int = Field(default=2, ge=1)
    """Indexer query heads (their scores are summed)."""
    index_topk: int = Field(ge=1)
    """Global-KV entries each query reads."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base for the local attention (global latents carry no position)."""
    norm_eps: float = Field(default=1e-5, gt=0)
    """RMSNorm epsilon."""

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.num_heads

    @property
    def first_decoder_layer(self) -> int:
        """Layer 20 in the reference layout: its attention is shared, its FFN may carry LoRA."""
        return self.num_encoder_layers

    @model_validator(mode="after")
    def _check_layout(self) -> EngineConfig:
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} not divisible by num_heads={self.num_heads}")
        if self.num_encoder_layers >= self.num_layers:
            raise ValueError(
                f"num_encoder_layers={self.num_encoder_layers} leaves no decoder layer "
                f"(num_layers={self.num_layers})"
            )
        for name in ("kv_source_layers", "index_layers"):
            layers = getattr(self, name)
            if list(layers) != sorted(set(layers)) or not layers:
                raise ValueError(f"{name}={layers} must be non-empty, sorted and unique")
            if layers[-1] >= self.num_layers or layers[0] < 0:
                raise ValueError(f"{name}={layers} outside 0..{self.num_layers - 1}")
        # Sources must be index layers: a source becomes readable at the index layer that
        # picks over it, which keeps one-pass prefill identical to token-by-token decoding.
        if not set(self.kv_source_layers) <= set(self.index_layers):
            raise ValueError(
                f"kv_source_layers={self.kv_source_layers} must be a subset of "
                f"index_layers={self.index_layers}"
            )
        if self.first_decoder_layer not in self.kv_source_layers:
            raise ValueError(
                f"layer {self.first_decoder_layer} (first decoder layer) must be a KV source"
            )
        if self.kv_source_layers[-1] != self.first_decoder_layer:
            raise ValueError(
                f"no KV source may sit above layer {self.first_decoder_layer}: "
                f"{self.kv_source_layers} (the global KV must stay LoRA-independent)"
            )
        return self


PRESETS: dict[str, EngineConfig] = {
    # Property tests: small enough that a forward takes milliseconds.
    "tiny": EngineConfig(
        vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=6, num_encoder_layers=3,
        kv_source_layers=(1, 3), index_layers=(1, 3, 5), window=8, d_latent=16, d_index=8,
        index_topk=6,
    ),
    # The model `engine_ext.train` trains on real text (byte-level vocabulary).
    "small": EngineConfig(
        vocab_size=260, d_model=96, num_heads=4, d_ff=256, num_layers=8, num_encoder_layers=4,
        kv_source_layers=(1, 3, 4), index_layers=(1, 3, 4, 6), window=32, d_latent=32,
        d_index=16, index_topk=16,
    ),
    # The reference 40-layer layout with narrow widths: benchmarks at long context.
    "ced40_scaled": EngineConfig(
        vocab_size=260, d_model=64, num_heads=4, d_ff=128, num_layers=40, num_encoder_layers=20,
        kv_source_layers=(2, 8, 14, 20), index_layers=(2, 8, 14, 20, 24, 28, 32, 36),
        window=128, d_latent=32, d_index=16, num_index_heads=1, index_topk=64,
    ),
    # SmolLM2-135M-Instruct's shape (its config: 30 layers, d_model 576, 9 query heads, d_ff
    # 1536, rope_theta 100000, rms_norm_eps 1e-5 as float32), its layers 0..8 the encoder:
    # `engine_ext.ced.from_smollm2` loads its weights (3 KV heads repeated per group, exact).
    # The first index layer is 9, so no encoder layer reads global KV: the encoder is SmolLM2's
    # causal attention cut to the window W = 128 (the reference W; the routing texts are at
    # most 48 tokens). Layer 9 compresses to 128-wide latents, indexed by 2 x 64-wide heads.
    "smollm2_ced": EngineConfig(
        vocab_size=49152, d_model=576, num_heads=9, d_ff=1536, num_layers=30,
        num_encoder_layers=9, kv_source_layers=(9,), index_layers=(9, 14, 19, 24), window=128,
        d_latent=128, d_index=64, num_index_heads=2, index_topk=64, rope_theta=100000.0,
        norm_eps=1e-5,
    ),
}


def get_preset(name: str) -> EngineConfig:
    """Return a named preset; the error lists the known names."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]
