"""Cost model on hand-computed cases: a tiny architecture and a GPU with round numbers.

Unit GPU: 1e12 FLOP/s, 1e10 B/s HBM (ridge point 100 FLOP/byte), NVLink 1e9 B/s, PCIe 1e8 B/s.
Unit coefficients: every efficiency 1, every fixed overhead 0, unless a test sets one.

Tiny dense model (2 layers, hidden 8, 2 heads of 4, 1 KV head, FFN 16, vocab 10, bf16):
  attention weights per layer = q 8*2*4 + k,v 2*8*1*4 + o 2*4*8 = 64 + 64 + 64 = 192
  dense FFN per layer         = 3*8*16 = 384          -> 576 weights per layer, 1152 bytes
  LM head                     = 10*8 = 80 weights, 160 bytes
  attention FLOPs per (query, key) pair per layer = 2 * heads * (qk 4 + v 4) = 32
  KV bytes per token per layer = 2 (K,V) * 1 head * 4 * 2 bytes = 16
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.cost.cost_model import (
    CostCoeffs,
    StepCost,
    create_step_batch,
    default_coeffs,
    predict_step,
)
from sim.cost.layer_costs import create_layer_costs
from sim.hardware.catalogue import get_gpu, get_model
from sim.hardware.specs import CedLayout, GpuSpec, ModelArch, MoeSpec
from sim.strategies.placement import adapter_placements

ASSUMED = {"*": "assumed: round numbers for hand arithmetic"}
GPU = GpuSpec(
    name="unit-gpu", bf16_dense_flops=1e12, hbm_bytes=1e9, hbm_bandwidth_bytes_per_s=1e10,
    nvlink_bandwidth_bytes_per_s=1e9, pcie_bandwidth_bytes_per_s=1e8, price_per_hour_usd=1.0,
    sources=ASSUMED,
)
GPU_NO_NVLINK = GPU.model_copy(update={"nvlink_bandwidth_bytes_per_s": 0.0})
DIMS = dict(
    hidden_size=8, num_attention_heads=2, num_kv_heads=1, head_dim=4, attention="gqa",
    intermediate_size=16, vocab_size=10, max_context_tokens=100_000, weight_dtype_bytes=2,
    kv_dtype_bytes=2, sources=ASSUMED,
)
ARCH = ModelArch(name="unit-dense", num_layers=2, **DIMS)
# Layer 0 dense, layer 1 MoE: 4 routed experts of width 4 (3*8*4 = 96 weights each), top-2,
# no shared expert; layer 1's non-expert weights: attention 192 + router gate 8*4 = 224.
MOE_ARCH = ModelArch(
    name="unit-moe", num_layers=2, **DIMS,
    moe=MoeSpec(num_routed_experts=4, num_experts_per_token=2, expert_intermediate_size=4,
                num_shared_experts=0, num_dense_layers=1),
)
# CED: encoder layers 0-1, decoder 2-3, W=4, 2 tokens per 10-byte global record, 5-byte index
# keys, top-3 records, index layers 1 and 3.
CED = CedLayout(
    num_encoder_layers=2, kv_source_layers=(1, 2), index_layers=(1, 3), sliding_window_tokens=4,
    global_kv_compression_ratio=2, global_kv_record_bytes=10, index_key_bytes=5, index_topk=3,
    routing_layer=1,
)
CED_ARCH = ModelArch(name="unit-ced", num_layers=4, **DIMS, ced=CED)
UNIT = CostCoeffs(
    gemm_flops_efficiency=1, attention_flops_efficiency=1, lora_flops_efficiency=1,
    memory_bandwidth_efficiency=1, lora_launch_overhead_s=0, lora_per_adapter_overhead_s=0,
    direft_flops_efficiency=1, direft_layer_overhead_s=0,
    routing_overhead_s=0, communication_efficiency=1, communication_latency_s=0,
    step_overhead_s=0, per_sequence_overhead_s=0,
)
TERMS = ("dense_gemm_s", "moe_gemm_s", "attention_s", "lora_s", "direft_s", "replay_s",
         "routing_s", "communication_s", "overhead_s")


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-18)


def step(arch, profile=None, coeffs=UNIT, **batch):
    profile = profile or create_layer_costs(arch, GPU)
    new, ctx = batch.pop("new"), batch.pop("ctx")
    return predict_step(coeffs, profile, create_step_batch(new, ctx, num_layers=arch.num_layers,
                                                           **batch))


def only(cost: StepCost, **expected):
    """Assert the named terms equal `expected` and every other term is 0."""
    for name in TERMS:
        assert getattr(cost, name) == approx(expected.get(name, 0.0)), name


# ---- dense GEMMs and attention on a decoder-only model -------------------------------------

def test_one_decode_token_is_memory_bound():
    # Dense per layer: 2*1*576 = 1152 FLOP -> 1.152e-9 s; 1152 bytes / 1e10 -> 1.152e-7 s (wins).
    # Two layers: 2.304e-7; LM head: 160 bytes -> 1.6e-8 (FLOPs 160 -> 1.6e-10). Sum 2.464e-7.
    # Attention, context 100: pairs 1*100 + 1*2/2 = 101 -> 3232 FLOP -> 3.232e-9 s;
    # KV read (100 + 1) * 16 = 1616 bytes -> 1.616e-7 s (wins); two layers 3.232e-7.
    cost = step(ARCH, new=[1], ctx=[100])
    only(cost, dense_gemm_s=2.464e-7, attention_s=3.232e-7)
    assert cost.total_s == approx(2.464e-7 + 3.232e-7)


def test_prefill_is_compute_bound():
    # 1000 tokens: dense per layer 2*1000*576 = 1.152e6 FLOP -> 1.152e-6 s > 1.152e-7 s bytes;
    # two layers 2.304e-6, plus one logit row (memory-bound 1.6e-8) = 2.32e-6.
    # Attention: pairs 1000*1001/2 = 500500 * 32 = 16,016,000 FLOP -> 1.6016e-5 s
    # vs 1000 * 16 bytes -> 1.6e-6 s; two layers 3.2032e-5.
    only(step(ARCH, new=[1000], ctx=[0]), dense_gemm_s=2.32e-6, attention_s=3.2032e-5)


def test_gemm_efficiency_scales_only_the_compute_bound_part():
    # Half the GEMM efficiency doubles the compute-bound layers (2 * 2.304e-6) but not the
    # memory-bound LM head row (1.6e-8).
    coeffs = UNIT.model_copy(update={"gemm_flops_efficiency": 0.5})
    cost = step(ARCH, coeffs=coeffs, new=[1000], ctx=[0])
    assert cost.dense_gemm_s == approx(4.608e-6 + 1.6e-8)


def test_prefill_chunk_over_existing_context_counts_n_c_plus_causal_pairs():
    # Chunk n=200 after c=300 cached tokens: pairs 200*300 + 200*201/2 = 60000 + 20100 = 80100;
    # 80100 * 32 = 2,563,200 FLOP -> 2.5632e-6 s vs (300+200)*16 = 8000 bytes -> 8e-7 s;
    # two layers 5.1264e-6.
    assert step(ARCH, new=[200], ctx=[300]).attention_s == approx(5.1264e-6)


def test_chunk_that_is_not_last_pays_no_lm_head():
    # 1000 tokens, not the last chunk: dense 2.304e-6 without the 1.6e-8 head row.
    cost = step(ARCH, new=[1000], ctx=[0], is_last_chunk=[False])
    assert cost.dense_gemm_s == approx(2.304e-6)


def test_batch_is_vectorised_over_items():
    # Three decode tokens (contexts 0, 100, 1000), numpy int32 input.
    # Dense: 3 tokens per layer, still memory-bound: 2.304e-7; 3 logit rows: 480 FLOP vs 160 bytes
    # -> 1.6e-8. Attention per item per layer, memory-bound: (1*16, 101*16, 1001*16) bytes
    # = 1.6e-9 + 1.616e-7 + 1.6016e-6 = 1.7648e-6; two layers 3.5296e-6.
    new = np.ones(3, dtype=np.int32)
    ctx = np.array([0, 100, 1000], dtype=np.int32)
    only(step(ARCH, new=new, ctx=ctx), dense_gemm_s=2.464e-7, attention_s=3.5296e-6)


# ---- mixture of experts --------------------------------------------------------------------

@pytest.mark.parametrize(
    ("num_tokens", "distinct_experts"),
    # Expected distinct experts: 4 * (1 - (1 - 2/4)**T): T=1 -> 2, T=2 -> 3, T=3 -> 3.5.
    [(1, 2.0), (2, 3.0), (3, 3.5)],
)
def test_moe_reads_expected_distinct_experts(num_tokens, distinct_experts):
    # Decode tokens are memory-bound: distinct * 96 weights * 2 bytes / 1e10 on layer 1 only.
    # (FLOPs 2*T*2*96 = 384*T are far below the ridge point.)
    cost = step(MOE_ARCH, new=[1] * num_tokens, ctx=[0] * num_tokens)
    assert cost.moe_gemm_s == approx(distinct_experts * 96 * 2 / 1e10)


def test_moe_dense_part_counts_attention_and_router_gate():
    # One token: layer 0 (576 weights) 1152 bytes -> 1.152e-7; layer 1 (192 + 32 = 224 weights)
    # 448 bytes -> 4.48e-8; head 1.6e-8. Sum 1.76e-7.
    assert step(MOE_ARCH, new=[1], ctx=[0]).dense_gemm_s == approx(1.76e-7)


def test_moe_many_tokens_is_compute_bound():
    # 10000 tokens: 2 * 10000 * 2 * 96 = 3.84e6 FLOP -> 3.84e-6 s vs <= 4*96*2 bytes -> 7.68e-8.
    cost = step(MOE_ARCH, new=[10_000], ctx=[0], is_last_chunk=[False])
    assert cost.moe_gemm_s == approx(3.84e-6)


# ---- CED attention -------------------------------------------------------------------------

def test_ced_decode_attention_by_layer_kind():
    # One decode token after 99 tokens: records = (99 + 1) / 2 = 50.
    # Encoder layers 0,1: pairs 1*(99/2) + 1 = 50.5 -> 1616 FLOP -> 1.616e-9 s;
    #   bytes 50 records * 10 + 1 * 16 = 516 -> 5.16e-8 s (wins); two layers 1.032e-7.
    # Decoder layers 2,3: window min(100, 4) = 4, selected min(50, 3) = 3, pairs 7 -> 224 FLOP;
    #   bytes min(50, 1*3) * 10 + 4 * 16 = 94 -> 9.4e-9 s; two layers 1.88e-8.
    # Index layers 1,3: 2*1*50*5 = 500 FLOP -> 5e-10 s; 50 * 5 = 250 bytes -> 2.5e-8; two 5e-8.
    cost = step(CED_ARCH, new=[1], ctx=[99])
    assert cost.attention_s == approx(1.032e-7 + 1.88e-8 + 5e-8)


def test_ced_decoder_only_item_skips_encoder_attention():
    # Same token run on layers 2-3 only: decoder 1.88e-8 plus index layer 3 2.5e-8.
    cost = step(CED_ARCH, new=[1], ctx=[99], first_layer=[2])
    assert cost.attention_s == approx(1.88e-8 + 2.5e-8)


# ---- LoRA, PreFT, DiReFT -------------------------------------------------------------------
# LoRA rank 4 on q_proj of layers 0 and 1 and v_proj of layer 1: q_proj (8 -> 8) has
# 8 + 8 = 16 weights per unit rank, v_proj (8 -> 4) 12: per layer [16, 28], 44 in all.

def lora_profile(kind="lora", placements=((0, "q_proj"), (1, "q_proj"), (1, "v_proj"))):
    return create_layer_costs(ARCH, GPU, adapter_kind=kind, adapter_rank=4,
                               adapter_placements=list(placements))


def test_lora_one_decode_token():
    # FLOPs 2*4*1*44 = 352 -> 3.52e-10 s; bytes 1 adapter * 4 * 44 * 2 = 352 -> 3.52e-8 s.
    cost = step(ARCH, lora_profile(), new=[1], ctx=[100], adapter_ids=[0])
    assert cost.lora_s == approx(3.52e-8)
    assert cost.direft_s == 0.0


def test_lora_grows_with_distinct_adapters():
    # Two tokens of one adapter read it once: 3.52e-8. Two adapters read twice: 7.04e-8.
    # With 1e-6 launch and 1e-7 per-adapter overheads: 7.04e-8 + 1e-6 + 2 * 1e-7.
    one = step(ARCH, lora_profile(), new=[1, 1], ctx=[10, 10], adapter_ids=[0, 0])
    two = step(ARCH, lora_profile(), new=[1, 1], ctx=[10, 10], adapter_ids=[0, 1])
    assert one.lora_s == approx(3.52e-8)
    assert two.lora_s == approx(7.04e-8)
    coeffs = UNIT.model_copy(update={"lora_launch_overhead_s": 1e-6,
                                     "lora_per_adapter_overhead_s": 1e-7})
    costly = step(ARCH, lora_profile(), coeffs, new=[1, 1], ctx=[10, 10], adapter_ids=[0, 1])
    assert costly.lora_s == approx(7.04e-8 + 1e-6 + 2e-7)


def test_lora_grows_with_tokens():
    # 1000 prefill tokens, one adapter: 2*4*1000*44 = 352,000 FLOP -> 3.52e-7 s > 3.52e-8 s read.
    cost = step(ARCH, lora_profile(), new=[1000], ctx=[0], adapter_ids=[3])
    assert cost.lora_s == approx(3.52e-7)


def test_lora_only_on_layers_the_item_runs():
    # Item on layer 1 only, 1000 tokens: 2*4*1000*28 = 224,000 FLOP -> 2.24e-7 s.
    cost = step(ARCH, lora_profile(), new=[1000], ctx=[0], adapter_ids=[0], first_layer=[1])
    assert cost.lora_s == approx(2.24e-7)


def test_preft_decode_tokens_pay_no_lora():
    # Eight decode tokens of eight adapters, is_adapted False: no LoRA term, no launch overhead,
    # and the step costs exactly what a base-model step costs.
    coeffs = UNIT.model_copy(update={"lora_launch_overhead_s": 1e-6,
                                     "lora_per_adapter_overhead_s": 1e-7})
    kwargs = dict(new=[1] * 8, ctx=[100] * 8)
    preft = step(ARCH, lora_profile(), coeffs, **kwargs, adapter_ids=list(range(8)),
                 is_adapted=[False] * 8)
    base = step(ARCH, lora_profile(), coeffs, **kwargs)
    assert preft.lora_s == 0.0
    assert preft.total_s == approx(base.total_s)


def test_preft_mixed_step_pays_lora_for_the_prompt_only():
    # Prompt of 10 tokens under adapter 1 (adapted) + decode tokens of adapters 0, 2, 3 (not):
    # one adapter read, 352 bytes -> 3.52e-8 s (FLOPs 2*4*10*44 = 3520 -> 3.52e-9 s).
    cost = step(ARCH, lora_profile(), new=[10, 1, 1, 1], ctx=[0, 50, 60, 70],
                adapter_ids=[1, 0, 2, 3], is_adapted=[True, False, False, False])
    assert cost.lora_s == approx(3.52e-8)


def test_direft_edits_the_residual_once_per_layer():
    # DiReFT rank 4 on layers 0 and 1 (layer 0 named twice): A and B are 4 x 8 each, 16 weights
    # per unit rank per layer, 32 in all. 1 token: 2*4*32 = 256 FLOP; bytes 4*32*2 = 256 -> 2.56e-8.
    profile = lora_profile("direft", ((0, "q_proj"), (0, "v_proj"), (1, "o_proj")))
    cost = step(ARCH, profile, new=[1], ctx=[5], adapter_ids=[0])
    assert cost.direft_s == approx(2.56e-8)
    assert cost.lora_s == 0.0


# ---- the engine's LoRA path (vLLM wraps every module of every layer) -----------------------
# Module shapes of the tiny model (in, out): q 8x8, k 8x4, v 8x4, o 8x8, gate 8x16, up 8x16,
# down 16x8: per layer 7 slices, in-features 64, out-features 64; 14 slices over 2 layers.

def test_lora_slice_launches_are_paid_per_wrapped_slice_and_layer():
    coeffs = UNIT.model_copy(update={"lora_slice_launch_s": 1e-6})
    cost = step(ARCH, lora_profile(), coeffs, new=[1], ctx=[100], adapter_ids=[0])
    assert cost.lora_s == approx(3.52e-8 + 14e-6)
    # A step through layer 1 only launches layer 1's 7 slices.
    upper = step(ARCH, lora_profile(), coeffs, new=[1], ctx=[100], adapter_ids=[0],
                 first_layer=[1])
    assert upper.lora_s == approx(3.52e-8 + 7e-6)  # the adapter is still read whole


def test_token_gather_prices_every_token_and_skips_the_shrink_without_adapted_tokens():
    coeffs = UNIT.model_copy(update={"lora_token_gather_share": 1.0})
    # LoRA_P decode-only step, 2 unadapted tokens: only the expand gathers, out-features
    # 64 x 2 layers x 2 tokens x rank 4 x 2 bytes = 2048 bytes -> 2.048e-7 s.
    decode = step(ARCH, lora_profile(), coeffs, new=[1, 1], ctx=[5, 5], adapter_ids=[0, 1],
                  is_adapted=[False, False])
    assert decode.lora_s == approx(2.048e-7)
    # One adapted token makes the shrink run too: in + out = 128 per layer -> 4096 bytes, plus
    # the adapted token's own roofline read (3.52e-8).
    mixed = step(ARCH, lora_profile(), coeffs, new=[1, 1], ctx=[5, 5], adapter_ids=[0, 1],
                 is_adapted=[True, False])
    assert mixed.lora_s == approx(4.096e-7 + 3.52e-8)
    # A base-model profile has no LoRA path at all.
    base = step(ARCH, None, coeffs, new=[1, 1], ctx=[5, 5])
    assert base.lora_s == 0.0


def test_an_adapter_kind_read_from_a_file_prices_like_the_literal():
    # A scenario's adapter kind is a string built at run time (YAML, JSON), not the interned
    # literal: pricing compares it by value, so DiReFT read from a file is still DiReFT.
    kind = "".join(["dir", "eft"])
    assert kind == "direft" and kind is not "direft"  # noqa: F632 (the point of the test)
    profile = lora_profile(kind, ((0, "q_proj"), (0, "v_proj"), (1, "o_proj")))
    cost = step(ARCH, profile, new=[1], ctx=[5], adapter_ids=[0])
    assert cost.direft_s == approx(2.56e-8)


def test_direft_is_priced_by_edited_layers_positions_and_adapters_not_as_lora():
    coeffs = UNIT.model_copy(update={"direft_layer_overhead_s": 1e-6,
                                     "lora_launch_overhead_s": 1.0,
                                     "lora_slice_launch_s": 1.0})
    profile = lora_profile("direft", ((0, "q_proj"), (1, "o_proj")))
    one = step(ARCH, profile, coeffs, new=[1], ctx=[5], adapter_ids=[0])
    assert one.direft_s == approx(2.56e-8 + 2 * 1e-6)  # 2 edited layers, 1 adapter
    assert one.lora_s == 0.0  # none of LoRA's launches or gathers
    two = step(ARCH, profile, coeffs, new=[1, 1], ctx=[5, 5], adapter_ids=[0, 1])
    assert two.direft_s == approx(2 * 2.56e-8 + 4 * 1e-6)
    # DiReFT_P decode positions are not edited: nothing to pay.
    decode = step(ARCH, profile, coeffs, new=[1], ctx=[5], adapter_ids=[0], is_adapted=[False])
    assert decode.direft_s == 0.0
    only_layer0 = lora_profile("direft", ((0, "q_proj"),))
    assert step(ARCH, only_layer0, coeffs, new=[1], ctx=[5], adapter_ids=[0]).direft_s == approx(
        1.28e-8 + 1e-6)


def test_direft_edits_run_at_their_own_flops_efficiency_not_loras():
    # The plugin computes DiReFT's edits as plain matmuls, not through vLLM's LoRA kernels.
    profile = lora_profile("direft", ((0, "q_proj"), (1, "o_proj")))
    slow_lora = UNIT.model_copy(update={"lora_flops_efficiency": 0.001})
    assert step(ARCH, profile, slow_lora, new=[1], ctx=[5], adapter_ids=[0]).direft_s == approx(
        2.56e-8)
    slow = UNIT.model_copy(update={"direft_flops_efficiency": 0.001})
    # 256 FLOP at 0.1% of 1e12 FLOP/s: 2.56e-7 s, above the 2.56e-8 s read.
    assert step(ARCH, profile, slow, new=[1], ctx=[5], adapter_ids=[0]).direft_s == approx(
        2.56e-7)


# ---- replay, routing, communication, overhead ----------------------------------------------

def test_replay_alone_is_priced_in_the_replay_term():
    # W=16 replay tokens on layer 1 only after 84 tokens, no sampling.
    # Dense layer 1: 2*16*576 = 18432 FLOP -> 1.8432e-8 vs 1152 bytes -> 1.152e-7 (wins).
    # Attention layer 1: pairs 16*84 + 16*17/2 = 1480 -> 47360 FLOP -> 4.736e-8 vs
    # (84 + 16) * 16 = 1600 bytes -> 1.6e-7 (wins). Replay 2.752e-7; the step overhead (1e-3)
    # is overhead, and a replay is no sequence (no per-sequence overhead).
    coeffs = UNIT.model_copy(update={"step_overhead_s": 1e-3, "per_sequence_overhead_s": 1e-5})
    cost = step(ARCH, coeffs=coeffs, new=[16], ctx=[84], first_layer=[1], is_replay=[True],
                is_last_chunk=[False])
    only(cost, replay_s=2.752e-7, overhead_s=1e-3)


def test_replay_is_the_marginal_cost_over_the_rest_of_the_step():
    # Alongside a decode token (ctx 100) the weights of layer 1 are streamed anyway: 17 tokens
    # are still memory-bound, so the marginal dense cost is 0 and the replay costs only its own
    # attention, 1.6e-7. The decode token keeps its own terms (2.464e-7 + 3.232e-7).
    cost = step(ARCH, new=[1, 16], ctx=[100, 84], first_layer=[0, 1], is_replay=[False, True],
                is_last_chunk=[True, False])
    only(cost, dense_gemm_s=2.464e-7, attention_s=3.232e-7, replay_s=1.6e-7)


def test_routing_decisions():
    # Head of 1000 weights, 3 decisions: 2*1000*3 = 6000 FLOP -> 6e-9 s; 2000 bytes -> 2e-7 s;
    # plus 3 * 1e-4 fixed. A routing-only step still pays the step overhead (1e-3).
    profile = create_layer_costs(ARCH, GPU, num_head_params=1000)
    coeffs = UNIT.model_copy(update={"routing_overhead_s": 1e-4, "step_overhead_s": 1e-3})
    batch = create_step_batch([], [], num_layers=2, num_routing_decisions=3)
    only(predict_step(coeffs, profile, batch), routing_s=2e-7 + 3e-4, overhead_s=1e-3)
    assert step(ARCH, profile, coeffs, new=[1], ctx=[0]).routing_s == 0.0


def test_tensor_parallel_shards_weights_and_adds_all_reduces():
    # TP=2, decode token at ctx 100. Weight bytes per GPU halve: per layer 1152/2 = 576 bytes
    # -> 5.76e-8 s, two layers 1.152e-7, LM head 160/2 = 80 bytes -> 8e-9: 1.232e-7.
    # The single KV head is replicated: attention unchanged at 3.232e-7.
    # All-reduce: 1 token * 8 * 2 = 16 bytes; 2*(2-1)/2 * 16 / 1e9 = 1.6e-8 s, two per layer
    # with 1e-6 latency each: 2 * (1.6e-8 + 1e-6) = 2.032e-6 per layer, 4.064e-6 for two.
    coeffs = UNIT.model_copy(update={"communication_latency_s": 1e-6})
    cost = step(ARCH, create_layer_costs(ARCH, GPU, 2), coeffs, new=[1], ctx=[100])
    only(cost, dense_gemm_s=1.232e-7, attention_s=3.232e-7, communication_s=4.064e-6)
    # Without NVLink the all-reduce goes over PCIe (1e8 B/s): 2 * (1.6e-7 + 1e-6) * 2 = 4.64e-6.
    pcie = step(ARCH, create_layer_costs(ARCH, GPU_NO_NVLINK, 2), coeffs, new=[1], ctx=[100])
    assert pcie.communication_s == approx(4.64e-6)


def test_overhead_per_step_and_per_sequence():
    # Two sequences and a replay: 1e-3 + 2 * 1e-5; an empty step costs nothing.
    coeffs = UNIT.model_copy(update={"step_overhead_s": 1e-3, "per_sequence_overhead_s": 1e-5})
    cost = step(ARCH, coeffs=coeffs, new=[1, 1, 4], ctx=[5, 5, 5], is_replay=[False, False, True],
                is_last_chunk=[True, True, False])
    assert cost.overhead_s == approx(1.02e-3)
    assert step(ARCH, coeffs=coeffs, new=[], ctx=[]).total_s == 0.0


def test_a_step_with_a_prompt_chunk_pays_the_prompt_step_overhead_once():
    # 1e-3 per step, 1e-5 per sequence, 2e-4 when any item is a prompt chunk: a decode step of
    # two pays 1.02e-3; the same step with a 4-token prompt beside them 1.23e-3; two prompts
    # still one 2e-4; a replay (no prompt) none; a 1-token prompt chunk marked as one pays it.
    coeffs = UNIT.model_copy(update={"step_overhead_s": 1e-3, "per_sequence_overhead_s": 1e-5,
                                     "prompt_step_overhead_s": 2e-4})
    assert step(ARCH, coeffs=coeffs, new=[1, 1], ctx=[5, 5]).overhead_s == approx(1.02e-3)
    assert step(ARCH, coeffs=coeffs, new=[1, 1, 4], ctx=[5, 5, 0]).overhead_s == approx(1.23e-3)
    assert step(ARCH, coeffs=coeffs, new=[4, 8], ctx=[0, 0]).overhead_s == approx(1.22e-3)
    replay = step(ARCH, coeffs=coeffs, new=[1, 4], ctx=[5, 5], is_replay=[False, True],
                  is_last_chunk=[True, False])
    assert replay.overhead_s == approx(1.01e-3)
    cached = step(ARCH, coeffs=coeffs, new=[1], ctx=[31], is_prompt=[True])
    assert cached.overhead_s == approx(1.21e-3)


def test_terms_sum_to_total_on_a_mixed_step():
    profile = create_layer_costs(MOE_ARCH, GPU, 2, adapter_kind="lora", adapter_rank=8,
                                  adapter_placements=[(0, "q_proj"), (1, "o_proj")],
                                  num_head_params=5000)
    batch = create_step_batch(
        [300, 1, 1, 16], [0, 40, 900, 200], num_layers=2, adapter_ids=[0, 1, -1, 1],
        is_replay=[False, False, False, True], first_layer=[0, 0, 0, 1],
        is_last_chunk=[False, True, True, False], num_routing_decisions=2)
    cost = predict_step(default_coeffs(GPU), profile, batch)
    d = cost.as_dict()
    assert set(d) == {*TERMS, "total_s"}
    assert d["total_s"] == approx(sum(d[t] for t in TERMS))
    assert all(d[t] > 0 for t in TERMS if t != "direft_s")


# ---- properties on catalogue models --------------------------------------------------------

CASES = [("llama-3.1-8b", "H100-SXM", 1), ("llama-3.1-70b", "H200", 4), ("moe-78", "H20", 8),
         ("ced-40", "H20", 8)]


@pytest.mark.parametrize(("model", "gpu", "tp"), CASES)
def test_cost_non_decreasing_in_context_and_tokens(model, gpu, tp):
    arch, spec = get_model(model), get_gpu(gpu)
    profile = create_layer_costs(arch, spec, tp)
    coeffs = default_coeffs(spec)
    grid = [0, 1, 7, 64, 127, 128, 129, 1000, 4096, 8191, 8192, 30_000, 100_000]
    decode = [step(arch, profile, coeffs, new=[1], ctx=[c]).total_s for c in grid]
    assert decode == sorted(decode)
    assert decode[-1] > decode[0]
    prefill = [step(arch, profile, coeffs, new=[n], ctx=[500]).total_s for n in grid[1:]]
    assert prefill == sorted(prefill)
    assert prefill[-1] > prefill[0]


def replay_cost(arch, profile, ctx, coeffs=UNIT):
    w = arch.ced.sliding_window_tokens
    return step(arch, profile, coeffs, new=[w], ctx=[ctx],
                adapter_ids=[0], first_layer=[arch.ced.num_encoder_layers], is_replay=[True],
                is_last_chunk=[False]).replay_s


def test_replay_independent_of_context_once_window_and_top_k_are_full():
    # Unit CED with its index layer moved into the encoder: a W=4 replay on layers 2-3 reads a
    # window of min(ctx+4, 4) = 4 tokens and min(records, 4*3) records; from ctx = 20
    # (records = 12) on, nothing it touches grows with the context.
    arch = CED_ARCH.model_copy(update={"ced": CED.model_copy(update={"index_layers": (1,)})})
    profile = create_layer_costs(arch, GPU)
    costs = [replay_cost(arch, profile, c) for c in (20, 21, 100, 5000, 90_000)]
    assert costs[0] > 0
    assert costs == [approx(costs[0])] * len(costs)


def test_replay_grows_only_by_the_index_scan_on_decoder_index_layers():
    # With index layer 3 in the decoder, the replay scores every record there:
    # 2*4*records*5 FLOP (4e-11 s/record) vs 5 bytes/record (5e-10 s, wins). From ctx 20
    # (records 12) to ctx 5000 (records 2502): 5e-10 * 2490 = 1.245e-6 s more, nothing else.
    profile = create_layer_costs(CED_ARCH, GPU)
    extra = replay_cost(CED_ARCH, profile, 5000) - replay_cost(CED_ARCH, profile, 20)
    assert extra == approx(1.245e-6)


def test_ced40_replay_is_bounded_while_reprefill_grows_with_context():
    # ced-40 on 8xH20 with all-layer decoder LoRA: past the top-k horizon (2048 records of 4
    # tokens = 8192 tokens) replay grows only through the indexer scan; re-prefilling the
    # context grows with it (the O(128) vs O(|P|) contrast of the CED write-up).
    arch, gpu = get_model("ced-40"), get_gpu("H20")
    placements = adapter_placements(arch, None, ("q_proj", "v_proj"))
    profile = create_layer_costs(arch, gpu, 8, adapter_kind="lora", adapter_rank=16,
                                  adapter_placements=placements)
    coeffs = default_coeffs(gpu)
    near = replay_cost(arch, profile, 8192, coeffs)
    far = replay_cost(arch, profile, 130_000, coeffs)
    assert near <= far <= 1.05 * near
    reprefill = [step(arch, profile, coeffs, new=[c], ctx=[0], adapter_ids=[0]).total_s
                 for c in (8192, 130_000)]
    assert reprefill[1] > 10 * reprefill[0]
    assert far < reprefill[0]


def test_layer_overhead_is_paid_per_layer_the_step_runs():
    # A full step runs 2 layers; a replay from layer 1 alone runs 1: what the replay saves.
    coeffs = UNIT.model_copy(update={"layer_overhead_s": 1e-4})
    full = step(ARCH, coeffs=coeffs, new=[1], ctx=[5])
    assert full.overhead_s == approx(UNIT.step_overhead_s + UNIT.per_sequence_overhead_s + 2e-4)
    replay = step(ARCH, coeffs=coeffs, new=[4], ctx=[5], first_layer=[1], is_replay=[True],
                  is_last_chunk=[False])
    assert replay.overhead_s == approx(UNIT.step_overhead_s + 1e-4)


def test_direft_on_a_lora_engine_pays_the_lora_wrapper_but_no_lora_shrink():
    # DiReFT_P served by a LoRA-enabled vLLM: the wrapper launches its 14 slices and gathers
    # the expand side for every token; no token is LoRA-adapted, so no shrink and no
    # per-step LoRA launch.
    coeffs = UNIT.model_copy(update={"lora_slice_launch_s": 1e-6, "lora_token_gather_share": 1.0,
                                     "lora_launch_overhead_s": 1.0})
    wrapped = [(i, m) for i in range(2) for m in
               ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    profile = create_layer_costs(ARCH, GPU, adapter_kind="direft", adapter_rank=4,
                                  adapter_placements=[(0, "q_proj"), (1, "o_proj")],
                                  lora_wrapped_placements=wrapped)
    cost = step(ARCH, profile, coeffs, new=[1], ctx=[5], adapter_ids=[0])
    # expand gather: out-features 64 x 2 layers x 1 token x rank 4 x 2 bytes = 1024 bytes.
    assert cost.lora_s == approx(14e-6 + 1.024e-7)
    assert cost.direft_s > 0
    plain = lora_profile("direft", ((0, "q_proj"), (1, "o_proj")))
    assert step(ARCH, plain, coeffs, new=[1], ctx=[5], adapter_ids=[0]).lora_s == 0.0


def test_adapter_load_is_a_fixed_cost_plus_bytes_over_the_achieved_bandwidth():
    from sim.cost.cost_model import adapter_load_s

    coeffs = CostCoeffs(adapter_load_overhead_s=1e-3, adapter_load_bandwidth_efficiency=0.5)
    # 1e9 bytes over half of GPU's PCIe bandwidth.
    assert adapter_load_s(coeffs, GPU, 1e9) == approx(
        1e-3 + 1e9 / (0.5 * GPU.pcie_bandwidth_bytes_per_s))
    assert adapter_load_s(CostCoeffs(), GPU, 1e9) == approx(1e9 / GPU.pcie_bandwidth_bytes_per_s)


# ---- rules a mutation run found unguarded ----------------------------------------------------


def test_many_routing_decisions_are_compute_bound():
    # Head of 1000 weights, 1000 decisions: 2*1000*1000 = 2e6 FLOP -> 2e-6 s, above the 2000
    # bytes' 2e-7 s: the head's FLOPs, not its weights, set the time.
    profile = create_layer_costs(ARCH, GPU, num_head_params=1000)
    batch = create_step_batch([], [], num_layers=2, num_routing_decisions=1000)
    only(predict_step(UNIT, profile, batch), routing_s=2e-6)


def test_all_reduces_run_at_the_communication_efficiency():
    # As the TP test above at half the link's bandwidth: 2 * (3.2e-8 + 1e-6) per layer, two
    # layers.
    coeffs = UNIT.model_copy(update={"communication_latency_s": 1e-6,
                                     "communication_efficiency": 0.5})
    cost = step(ARCH, create_layer_costs(ARCH, GPU, 2), coeffs, new=[1], ctx=[100])
    assert cost.communication_s == approx(2 * 2 * (3.2e-8 + 1e-6))


def test_layer_overhead_counts_the_span_from_the_first_layer_any_item_runs():
    # Eight layers; a step whose items run layers [2, 6) and [3, 8) spans 6 layers: 2..7.
    arch = ModelArch(name="unit-dense-8", num_layers=8, **DIMS)
    coeffs = UNIT.model_copy(update={"layer_overhead_s": 1e-4})
    cost = step(arch, coeffs=coeffs, new=[1, 1], ctx=[5, 5], first_layer=[2, 3],
                last_layer=[6, 8])
    assert cost.overhead_s == approx(6e-4)


def test_a_batch_built_without_adapter_ids_has_no_adapter_on_any_item():
    # No adapter is -1, as in the engine's sequences: the default must be that, not any other
    # negative number.
    batch = create_step_batch([4, 1], [0, 9], num_layers=2)
    assert batch.adapter_ids.tolist() == [-1, -1] and not batch.is_adapted.any()
