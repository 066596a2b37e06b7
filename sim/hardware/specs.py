"""Spec types for the catalogue: GPUs and model architectures, each number with its source.

Every numeric field of a sourced spec has a key in its `sources` mapping (or the blanket key "*").
A value starting with "assumed" means no public source gives it; a scenario may override it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LoraModule = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class _Sourced(BaseModel):
    """Base for catalogue entries: every number must carry a source or an assumption."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    sources: dict[str, str] = Field(default_factory=dict)
    """Field name -> citation, or a text starting with "assumed" when no public source gives it."""

    @model_validator(mode="after")
    def _every_number_sourced(self) -> _Sourced:
        missing = [
            name
            for name, value in self
            if isinstance(value, (int, float, BaseModel)) and not isinstance(value, bool)
            and name not in self.sources
        ]
        if missing and self.sources.get("*") is None:
            raise ValueError(f"numbers without a source or 'assumed' mark: {missing}")
        empty = sorted(name for name, text in self.sources.items() if not text.strip())
        if empty:
            raise ValueError(f"empty source texts for {empty}; cite a source or say 'assumed: ...'")
        return self


class GpuSpec(_Sourced):
    """One accelerator (or the CPU) as the cost model sees it."""

    name: str
    """Catalogue key, e.g. "H100-SXM"."""
    bf16_dense_flops: float = Field(gt=0)
    """Peak dense bf16 tensor throughput, FLOP/s (no sparsity)."""
    hbm_bytes: float = Field(gt=0)
    """Device memory size as sold, bytes (decimal: an "80 GB" GPU is 80e9)."""
    reported_memory_bytes: float | None = Field(default=None, gt=0)
    """Total memory the device reports to torch (binary sizes: an 80 GB H100 shows about
    79.1 GiB); vLLM sizes its budget from this. None uses hbm_bytes."""
    non_torch_memory_bytes: float | None = Field(default=None, ge=0)
    """Per-GPU memory outside torch's allocator that vLLM subtracts (CUDA context, cuBLAS,
    NCCL); None: none."""
    cuda_graph_memory_bytes: float | None = Field(default=None, ge=0)
    """Per-GPU CUDA-graph memory vLLM estimates and subtracts before sizing KV; None: none."""
    hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    """Device memory bandwidth, bytes/s."""
    nvlink_bandwidth_bytes_per_s: float = Field(ge=0)
    """Per-GPU NVLink bandwidth (one direction), bytes/s; 0 when there is none."""
    pcie_bandwidth_bytes_per_s: float = Field(gt=0)
    """Host-to-device bandwidth used for adapter loads, bytes/s."""
    price_per_hour_usd: float = Field(ge=0)
    """Default on-demand rental price per GPU-hour, USD; scenarios override it."""

    @property
    def memory_bytes(self) -> float:
        """The memory an engine budgets from: what the device reports, else the sold size."""
        return self.reported_memory_bytes or self.hbm_bytes


class MoeSpec(BaseModel):
    """Mixture-of-experts feed-forward layout."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    num_routed_experts: int = Field(ge=1)
    """Routed experts per MoE layer."""
    num_experts_per_token: int = Field(ge=1)
    """Routed experts each token activates (top-k)."""
    expert_intermediate_size: int = Field(ge=1)
    """Intermediate width of one expert's gated FFN."""
    num_shared_experts: int = Field(ge=0)
    """Always-active shared experts per MoE layer."""
    num_dense_layers: int = Field(ge=0)
    """Leading layers that use a dense FFN instead of experts."""


class CedLayout(BaseModel):
    """Causal encoder-decoder layout: encoder, compressed global KV, sliding-window decoder."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    num_encoder_layers: int = Field(ge=1)
    """Layers 0..num_encoder_layers-1 form the encoder; LoRA is not allowed there."""
    kv_source_layers: tuple[int, ...]
    """Layers whose attention writes the compressed global KV that every decoder layer reads."""
    index_layers: tuple[int, ...]
    """Layers writing indexer keys used to select top-k global-KV entries."""
    sliding_window_tokens: int = Field(ge=1)
    """Decoder local attention window W; also the bounded replay length."""
    global_kv_compression_ratio: int = Field(ge=1)
    """Tokens folded into one compressed global-KV record."""
    global_kv_record_bytes: int = Field(ge=1)
    """Bytes of one compressed global-KV record of one source layer."""
    index_key_bytes: int = Field(ge=1)
    """Bytes of one indexer key (per compressed record, per index layer)."""
    index_topk: int = Field(ge=1)
    """Global-KV records each decoder query attends to after top-k selection."""
    routing_layer: int = Field(ge=0)
    """Layer whose output (H19 on the reference model) feeds the routing heads."""


class ModelArch(_Sourced):
    """Transformer architecture as the cost and memory models need it."""

    name: str
    """Catalogue key."""
    num_layers: int = Field(ge=1)
    """Transformer layers."""
    hidden_size: int = Field(ge=1)
    """Residual stream width."""
    num_attention_heads: int = Field(ge=1)
    """Query heads."""
    num_kv_heads: int = Field(ge=1)
    """Key/value heads (GQA); 1 for a single latent KV head."""
    head_dim: int = Field(ge=1)
    """Width of one attention head."""
    attention: Literal["gqa", "mla"]
    """gqa: separate K and V per KV head; mla: one shared latent of kv_lora_rank + rope dims."""
    kv_lora_rank: int = Field(default=0, ge=0)
    """MLA latent width (0 for gqa)."""
    qk_rope_head_dim: int = Field(default=0, ge=0)
    """MLA decoupled rotary key width (0 for gqa)."""
    intermediate_size: int = Field(ge=1)
    """Dense FFN intermediate width (used by dense layers)."""
    moe: MoeSpec | None = None
    """Mixture-of-experts layout; None for a dense model."""
    vocab_size: int = Field(ge=1)
    """Vocabulary size."""
    max_context_tokens: int = Field(ge=1)
    """Longest context the model supports."""
    weight_dtype_bytes: float = Field(gt=0)
    """Bytes per weight (2 for bf16, 1 for fp8)."""
    embedding_dtype_bytes: float | None = Field(default=None, gt=0)
    """Bytes per weight of the embedding and LM head where a quantized checkpoint keeps them
    wider (FP8 checkpoints keep them in bf16: 2); None: weight_dtype_bytes."""
    kv_dtype_bytes: float = Field(gt=0)
    """Bytes per stored KV value."""
    tie_word_embeddings: bool = False
    """Whether the output head shares the embedding matrix."""
    ced: CedLayout | None = None
    """Causal encoder-decoder layout; None for a decoder-only model."""

    @model_validator(mode="after")
    def _consistent(self) -> ModelArch:
        if self.attention == "mla" and self.kv_lora_rank == 0:
            raise ValueError("attention='mla' needs kv_lora_rank > 0")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.ced is not None:
            layers = (*self.ced.kv_source_layers, *self.ced.index_layers, self.ced.routing_layer)
            if max(layers) >= self.num_layers or self.ced.num_encoder_layers >= self.num_layers:
                raise ValueError(f"CED layer indices must lie below num_layers={self.num_layers}")
        return self

    @property
    def is_ced(self) -> bool:
        """True for a causal encoder-decoder model."""
        return self.ced is not None
