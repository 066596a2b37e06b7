"""Memory model on hand-computed cases: weights, KV per token, CED state, LoRA slots, KV blocks."""

from __future__ import annotations

import pytest

from sim.cost.memory_model import (
    adapter_slot_bytes_per_gpu,
    conversation_kv,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    kv_replication,
    memory_breakdown,
    weight_bytes_per_gpu,
    window_state_bytes_per_seq,
)
from sim.hardware.catalogue import get_gpu, get_model
from sim.hardware.specs import CedLayout, GpuSpec, ModelArch

ASSUMED = {"*": "assumed: round numbers for hand arithmetic"}
# 2 layers, hidden 8, 2 heads of 4, 1 KV head, FFN 16, vocab 10, untied, bf16.
# Weights: per layer attention 64+32+32+64 = 192 + FFN 3*8*16 = 384 -> 576; two layers 1152;
# embedding + LM head 2*10*8 = 160: 1312 weights, 2624 bytes.
ARCH = ModelArch(
    name="unit-dense", num_layers=2, hidden_size=8, num_attention_heads=2, num_kv_heads=1,
    head_dim=4, attention="gqa", intermediate_size=16, vocab_size=10, max_context_tokens=1000,
    weight_dtype_bytes=2, kv_dtype_bytes=2, sources=ASSUMED,
)
# 4 layers (encoder 0-1), W=4, global KV from layers 1 and 2 (10-byte records of 2 tokens),
# 5-byte index keys on layers 1 and 3.
CED_ARCH = ARCH.model_copy(update={
    "name": "unit-ced", "num_layers": 4,
    "ced": CedLayout(num_encoder_layers=2, kv_source_layers=(1, 2), index_layers=(1, 3),
                     sliding_window_tokens=4, global_kv_compression_ratio=2,
                     global_kv_record_bytes=10, index_key_bytes=5, index_topk=3,
                     routing_layer=1),
})
GPU = GpuSpec(
    name="unit-gpu", bf16_dense_flops=1e12, hbm_bytes=1e6, hbm_bandwidth_bytes_per_s=1e10,
    nvlink_bandwidth_bytes_per_s=1e9, pcie_bandwidth_bytes_per_s=1e8, price_per_hour_usd=1.0,
    sources=ASSUMED,
)


def test_weight_bytes_per_gpu():
    assert weight_bytes_per_gpu(ARCH, 1) == 2624
    assert weight_bytes_per_gpu(ARCH, 2) == 1312


def test_a_quantized_checkpoint_keeps_its_embedding_and_head_in_their_own_dtype():
    # Unit model: 1152 layer weights in fp8 (1 byte) + 160 embedding and head weights in bf16.
    fp8 = ARCH.model_copy(update={"weight_dtype_bytes": 1, "embedding_dtype_bytes": 2})
    assert weight_bytes_per_gpu(fp8, 1) == 1152 + 2 * 160
    assert weight_bytes_per_gpu(ARCH.model_copy(update={"weight_dtype_bytes": 1}), 1) == 1312


def test_the_sampler_run_sets_the_activation_peak_at_large_batches_whatever_the_tp():
    from sim.cost.memory_model import activation_reserve_bytes
    llama = get_model("llama-3.1-8b")
    # 1024 sequences x 128256 logits x 38.4 bytes over 8192 x 4096 bf16 hidden states.
    expected = 1024 * 128256 * 38.4 + 8192 * 4096 * 2
    for tp in (1, 2, 8):
        assert activation_reserve_bytes(llama, 8192, 1024, tp) == pytest.approx(expected)
    # A long prefill with few sequences: the forward's buffers are the peak.
    assert activation_reserve_bytes(llama, 65536, 8, 1) == 65536 * (4 * 4096 + 2 * 14336) * 2


def test_weights_of_llama_8b_in_bf16():
    # 8.03e9 weights * 2 bytes / 4 GPUs ~ 4.015e9 bytes per GPU.
    assert weight_bytes_per_gpu(get_model("llama-3.1-8b"), 4) == pytest.approx(4.015e9, rel=0.01)


def test_gqa_kv_bytes_per_token():
    # Unit model: 2 (K, V) * 1 head * 4 * 2 bytes = 16 per layer, 32 for two layers.
    assert kv_bytes_per_token_per_layer(ARCH) == 16
    assert kv_bytes_per_token(ARCH) == 32
    # Llama-3.1-8B: 2 * 8 KV heads * 128 * 2 bytes * 32 layers = 131072 bytes per token.
    assert kv_bytes_per_token(get_model("llama-3.1-8b")) == 131072
    # Llama-3.1-70B: 2 * 8 * 128 * 2 * 80 = 327680.
    assert kv_bytes_per_token(get_model("llama-3.1-70b")) == 327680
    # Qwen2.5-0.5B: 2 * 2 * 64 * 2 * 24 = 12288.
    assert kv_bytes_per_token(get_model("qwen2.5-0.5b")) == 12288


def test_mla_kv_bytes_per_token():
    # MLA stores one latent of kv_lora_rank + rope dims: moe-78 (512 + 64) * 2 bytes = 1152 per
    # layer, * 78 layers = 89856.
    moe = get_model("moe-78")
    assert kv_bytes_per_token_per_layer(moe) == 1152
    assert kv_bytes_per_token(moe) == 89856


def test_kv_replication_under_tensor_parallelism():
    # 8 KV heads over TP=4: 2 heads per rank -> 1/4; over TP=16: 1 head per rank -> 1/8.
    llama = get_model("llama-3.1-8b")
    assert kv_replication(llama, 4) == 0.25
    assert kv_replication(llama, 16) == 0.125
    # A single latent (MLA) is replicated on every rank.
    assert kv_replication(get_model("moe-78"), 8) == 1.0


def test_ced_kv_per_token_counts_only_the_compressed_global_kv():
    # Unit CED: per record 2 source layers * 10 + 2 index layers * 5 = 30 bytes per 2 tokens = 15.
    assert kv_bytes_per_token(CED_ARCH) == 15
    # ced-40: (4 sources * 1152 + 8 index layers * 132) / 4 tokens = (4608 + 1056) / 4 = 1416.
    assert kv_bytes_per_token(get_model("ced-40")) == 1416


def test_ced_window_state_bytes_per_sequence():
    # Unit CED: 4 layers * W=4 * 16 bytes = 256.
    assert window_state_bytes_per_seq(CED_ARCH) == 256
    # ced-40: 40 layers * 128 * (512 + 64) * 2 bytes = 5,898,240.
    assert window_state_bytes_per_seq(get_model("ced-40")) == 5_898_240
    assert window_state_bytes_per_seq(ARCH) == 0


def test_adapter_slot_bytes_every_module_preallocated():
    # Unit model, per layer A+B per unit rank: q 8+8, k 8+4, v 8+4, o 8+8, gate 8+16, up 8+16,
    # down 16+8 = 16+12+12+16+24+24+24 = 128; two layers 256.
    # max_loras 2 * max_lora_rank 8 * 256 * 2 bytes = 8192; TP=2 halves it.
    assert adapter_slot_bytes_per_gpu(ARCH, 2, 8, 1) == 8192
    assert adapter_slot_bytes_per_gpu(ARCH, 2, 8, 2) == 4096


def test_adapter_slot_bytes_llama_8b():
    # Per layer: q 4096+4096, k 4096+1024, v 4096+1024, o 4096+4096, gate/up 4096+14336 each,
    # down 14336+4096: 8192+5120+5120+8192+3*18432 = 81920; * 32 layers = 2,621,440.
    # 4 slots * rank 16 * 2 bytes: 335,544,320 bytes (320 MiB).
    assert adapter_slot_bytes_per_gpu(get_model("llama-3.1-8b"), 4, 16, 1) == 335_544_320


def test_block_count_by_hand():
    # Budget 1e6 * 0.5 = 500000. Weights 2624, LoRA slots 8192 (above).
    # Activations: the larger of the forward, 10 batched tokens * (4*8 + 2*16) * 2 = 1280, and
    # the sampler run, 4 seqs * 10 vocab * 38.4 = 1536 over the hidden states 10 * 8 * 2 = 160.
    # Pool 500000 - 2624 - 8192 - 1696 = 487488; a block of 16 tokens * 32 bytes = 512 bytes:
    # 487488 / 512 = 952.1 -> 952 blocks, 15232 tokens.
    mem = memory_breakdown(ARCH, GPU, tensor_parallel_size=1, gpu_memory_utilization=0.5,
                           max_num_seqs=4, max_num_batched_tokens=10, block_size=16, max_loras=2,
                           max_lora_rank=8, uses_lora=True)
    assert (mem.budget_bytes, mem.weight_bytes, mem.adapter_slot_bytes) == (500000, 2624, 8192)
    assert mem.activation_bytes == pytest.approx(1696)
    assert mem.kv_pool_bytes == pytest.approx(487488)
    assert mem.num_kv_blocks == 952
    assert mem.num_kv_tokens == 15232
    # Without LoRA the 8192 slot bytes are free: (500000 - 2624 - 1696) / 512 = 968.1 -> 968.
    base = memory_breakdown(ARCH, GPU, tensor_parallel_size=1, gpu_memory_utilization=0.5,
                            max_num_seqs=4, max_num_batched_tokens=10, block_size=16,
                            max_loras=2, max_lora_rank=8, uses_lora=False)
    assert base.num_kv_blocks == 968


def test_ced_block_count_reserves_window_state_per_sequence():
    # Unit CED: weights 4 * 576 + 160 = 2464 weights, 4928 bytes; no LoRA; activations 1696;
    # window 4 seqs * 256 = 1024. Pool 500000 - 4928 - 1696 - 1024 = 492352; a block of 16 tokens
    # * 15 bytes = 240: 2051.5 -> 2051 blocks.
    mem = memory_breakdown(CED_ARCH, GPU, tensor_parallel_size=1, gpu_memory_utilization=0.5,
                           max_num_seqs=4, max_num_batched_tokens=10, block_size=16,
                           max_loras=2, max_lora_rank=8, uses_lora=False)
    assert mem.window_state_bytes == 1024
    assert mem.num_kv_blocks == 2051


def test_model_that_does_not_fit_has_no_blocks():
    tiny_gpu = GPU.model_copy(update={"hbm_bytes": 5000.0})
    mem = memory_breakdown(ARCH, tiny_gpu, tensor_parallel_size=1, gpu_memory_utilization=0.5,
                           max_num_seqs=4, max_num_batched_tokens=10, block_size=16,
                           max_loras=2, max_lora_rank=8, uses_lora=False)
    assert mem.kv_pool_bytes < 0
    assert mem.num_kv_blocks == 0


# ---- KV per conversation -------------------------------------------------------------------
# Unit model, context 100 tokens in blocks of 16: ceil(100/16) = 7 blocks = 112 tokens * 32 bytes
# = 3584 bytes per copy.

@pytest.mark.parametrize("layout", ["per_adapter", "per_model"])
@pytest.mark.parametrize("visited", [1, 2, 5])
def test_per_adapter_kv_keeps_one_copy_per_adapter_visited(layout, visited):
    kv = conversation_kv(ARCH, layout, 100, visited, block_size=16)
    assert kv.per_adapter_bytes == 3584 * visited
    assert kv.total_bytes == 3584 * visited


def test_no_adapter_keeps_one_copy():
    for visited in (1, 4):
        assert conversation_kv(ARCH, "one_copy", 100, visited, block_size=16).total_bytes == 3584


def test_shared_kv_keeps_one_shared_copy_plus_window():
    # Unit CED: 112 tokens * 15 bytes = 1680 shared, window 256, whatever the adapters visited.
    for visited in (1, 3, 8):
        kv = conversation_kv(CED_ARCH, "shared", 100, visited, block_size=16)
        assert (kv.shared_bytes, kv.per_adapter_bytes, kv.window_bytes) == (1680, 0, 256)
        assert kv.total_bytes == 1936


def test_ced_adapters_that_break_the_rule_keep_a_copy_and_window_per_adapter():
    kv = conversation_kv(CED_ARCH, "per_adapter", 100, 3, block_size=16)
    assert (kv.shared_bytes, kv.per_adapter_bytes, kv.window_bytes) == (0, 3 * 1936, 0)


def test_contextual_mol_holds_a_temporary_branch_while_routing():
    # 40 option-description tokens of temporary global KV: 40 * 15 = 600 bytes on top.
    kv = conversation_kv(CED_ARCH, "shared", 100, 2, block_size=16, num_temporary_tokens=40)
    assert kv.temporary_bytes == 600
    assert kv.total_bytes == 1936 + 600


def test_llama_8b_mol_conversation_by_hand():
    # 4096 tokens (256 blocks of 16) * 131072 bytes = 512 MiB per copy; 3 adapters -> 1.5 GiB.
    kv = conversation_kv(get_model("llama-3.1-8b"), "per_adapter", 4096, 3, block_size=16)
    assert kv.total_bytes == 3 * 512 * 2**20


# ---- KV layout follows where the adapters sit ---------------------------------------------

def test_kv_layout_follows_placement_not_strategy_kind():
    from sim.strategies.placement import adapter_placements
    from sim.strategies.registry import kv_layout
    ced, llama = get_model("ced-40"), get_model("llama-3.1-8b")
    decoder_side = adapter_placements(ced, None, ("q_proj", "v_proj"))
    on_encoder = adapter_placements(ced, (5, 30), ("q_proj",))
    on_layer20_attention = adapter_placements(ced, (20,), ("o_proj",))
    on_layer20_ffn = adapter_placements(ced, (20,), ("down_proj",))
    for kind in ("multi_lora", "preft", "mol", "mol2", "contextual_mol"):
        assert kv_layout(ced, kind, [decoder_side, on_layer20_ffn]) == "shared"
        assert kv_layout(ced, kind, [decoder_side, on_encoder]) == "per_adapter"
        assert kv_layout(ced, kind, [on_layer20_attention]) == "per_adapter"
        assert kv_layout(llama, kind, [adapter_placements(llama, None, ("q_proj",))]) \
            == "per_adapter"
    assert kv_layout(ced, "multi_agent", []) == "per_model"
    assert kv_layout(llama, "base", []) == "one_copy"


# ---- KV capacity as the engine resolves it -----------------------------------------------

def test_budget_is_the_binary_size_the_device_reports_less_what_vllm_subtracts():
    h100 = get_gpu("H100-SXM")
    assert h100.hbm_bytes == 80e9 and h100.memory_bytes == 79.11 * 2**30
    mem = memory_breakdown(get_model("llama-3.1-8b"), h100, tensor_parallel_size=1,
                           gpu_memory_utilization=0.9, max_num_seqs=256,
                           max_num_batched_tokens=8192, block_size=16, max_loras=4,
                           max_lora_rank=16, uses_lora=False)
    assert mem.budget_bytes == 0.9 * 79.11 * 2**30
    assert (mem.non_torch_bytes, mem.cuda_graph_bytes) == (0.25 * 2**30, 0.5 * 2**30)
    left = (mem.budget_bytes - mem.weight_bytes - mem.activation_bytes - mem.non_torch_bytes
            - mem.cuda_graph_bytes)
    assert mem.kv_pool_bytes == left
    assert mem.num_kv_blocks == int(left // (16 * 131072))


def test_a_tight_fit_keeps_the_kv_the_reported_memory_leaves():
    # Llama-3.1-70B on two 80 GB GPUs: counting 80e9 bytes instead of the 79.11 GiB the device
    # reports (84.9e9) leaves less than half the KV pool (at 0.9 utilization, none).
    arch, h100 = get_model("llama-3.1-70b"), get_gpu("H100-SXM")
    sold = h100.model_copy(update={"reported_memory_bytes": None})
    kw = dict(tensor_parallel_size=2, gpu_memory_utilization=0.95, max_num_seqs=256,
              max_num_batched_tokens=8192, block_size=16, max_loras=4, max_lora_rank=16,
              uses_lora=False)
    reported = memory_breakdown(arch, h100, **kw).num_kv_blocks
    decimal = memory_breakdown(arch, sold, **kw).num_kv_blocks
    assert reported > 2 * decimal > 0


def test_an_explicit_kv_size_is_the_pool():
    mem = memory_breakdown(ARCH, GPU, tensor_parallel_size=1, gpu_memory_utilization=0.5,
                           max_num_seqs=4, max_num_batched_tokens=10, block_size=16,
                           max_loras=2, max_lora_rank=8, uses_lora=False,
                           kv_cache_memory_bytes=32 * 16 * 10)
    assert mem.num_kv_blocks == 10  # 32 bytes a token, 16-token blocks


def test_a_sim_config_derives_the_kv_layout_from_the_model_and_placements():
    from sim.config import SimConfig, StrategySpec
    from sim.strategies.placement import adapter_placements
    ced, llama, h200 = get_model("ced-40"), get_model("llama-3.1-8b"), get_gpu("H200")
    decoder_side = tuple(adapter_placements(ced, None, ("q_proj",)))
    everywhere = tuple(adapter_placements(ced, tuple(range(40)), ("q_proj",)))
    layout = {name: SimConfig(arch=arch, gpu=h200, strategy=StrategySpec(
        kind="multi_lora", adapter_placements=pairs)).strategy.kv_layout
        for name, arch, pairs in (("ced", ced, decoder_side), ("ced_all", ced, everywhere),
                                  ("llama", llama, tuple(adapter_placements(llama, None,
                                                                            ("q_proj",)))))}
    assert layout == {"ced": "shared", "ced_all": "per_adapter", "llama": "per_adapter"}
    assert SimConfig(arch=llama, gpu=h200, strategy=StrategySpec(kind="base")) \
        .strategy.kv_layout == "one_copy"
