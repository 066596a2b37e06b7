"""The simulator's own validated input: everything `simulate` needs, already resolved.

`SimConfig` holds the model, GPU, engine limits, a sim-level strategy description, the cluster
layout, the cost coefficients and the bounds that keep a run from hanging. The planner builds it
from a Scenario (planner/predict/simulation.py); the simulator never sees the scenario schema.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.cost.cost_model import CostCoeffs
from sim.hardware.specs import GpuSpec, ModelArch
from sim.strategies.placement import KvLayout
from sim.strategies.registry import STRATEGIES, kv_layout

RouterPolicy = Literal["round_robin", "least_outstanding", "affinity"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class EngineLimits(_Frozen):
    """Serving-engine limits of one replica, named as vLLM names them."""

    max_num_seqs: int = Field(default=256, ge=1)
    """Sequences in one batch."""
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    """Tokens computed in one step."""
    block_size: int = Field(default=16, ge=1)
    """Tokens per paged-KV block."""
    enable_chunked_prefill: bool = True
    """Split long prompts across steps and mix them with decodes."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prefixes (keyed by adapter where KV depends on it)."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of GPU memory the engine may use."""
    max_loras: int = Field(default=4, ge=1)
    """Adapters resident on the GPU at once (and per step)."""
    max_cpu_loras: int = Field(default=16, ge=1)
    """Adapters cached in host memory."""
    preload_cpu_loras: bool = True
    """The host cache starts with the first max_cpu_loras adapters, as vLLM's server loads its
    registered adapters at start-up; False: every adapter's first load is cold (adapters
    loaded on first use, as an offline engine given LoRARequests does)."""
    max_lora_rank: int = Field(default=16, ge=1)
    """LoRA buffers are preallocated at this rank."""
    num_speculative_tokens: int = Field(default=0, ge=0)
    """Draft tokens verified per decode step (0: no speculative decoding)."""
    mean_accepted_tokens: float = Field(default=1.0, ge=1)
    """Tokens a decode step emits on average (rounded to whole tokens per step)."""
    num_kv_blocks: int | None = Field(default=None, ge=1)
    """KV blocks per replica; None resolves them from the memory model as vLLM would."""
    kv_cache_memory_bytes: float | None = Field(default=None, gt=0)
    """Explicit KV pool per GPU (vLLM's kv_cache_memory_bytes); None: what the budget leaves."""
    ced_encoder_window: Literal["recompute", "kept"] = "recompute"
    """CED models: how a request continues the encoder after a cached prefix. recompute (the
    CED write-up's turn): it incrementally encodes C[-W:] + U, re-encoding the last W cached
    positions because the encoder's window KV is not kept between requests; kept (engine_ext's
    way): the encoder's window KV stays with the conversation and only U is encoded."""

    @model_validator(mode="after")
    def _consistent(self) -> EngineLimits:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} is below "
                             f"max_num_seqs={self.max_num_seqs} (vLLM rejects this too)")
        if self.mean_accepted_tokens > self.num_speculative_tokens + 1:
            raise ValueError(f"mean_accepted_tokens={self.mean_accepted_tokens} exceeds "
                             f"num_speculative_tokens + 1 = {self.num_speculative_tokens + 1}")
        return self

    @property
    def num_tokens_per_decode_step(self) -> int:
        """Tokens a decode step appends to a sequence."""
        return max(1, round(self.mean_accepted_tokens))


class AdapterSpec(_Frozen):
    """One adapter as the simulator needs it."""

    name: str
    """Adapter (domain) name."""
    num_bytes_per_gpu: float = Field(ge=0)
    """Weights one GPU loads over PCIe when the adapter becomes resident."""


class StrategySpec(_Frozen):
    """A serving strategy reduced to the numbers the simulator uses."""

    kind: str
    """Which mechanism serves a turn: a kind in `sim.strategies.registry`."""
    label: str = ""
    """Name in reports."""
    kv_layout: KvLayout | None = None
    """Shared KV with bounded replay, per-adapter KV with re-prefill, one copy, or one model per
    domain: decided by where the adapters sit (`sim.strategies.placement.kv_layout`), never by
    `kind`. None: derived from the model and `adapter_placements` when the SimConfig is built."""
    adapters: tuple[AdapterSpec, ...] = ()
    """Domain adapters; workload domain d uses adapter d mod len(adapters)."""
    adapter_kind: Literal["lora", "direft", "none"] = "none"
    """Adapter arithmetic for the cost profile."""
    adapter_rank: int = Field(default=0, ge=0)
    """Rank used to price adapter compute."""
    adapter_placements: tuple[tuple[int, str], ...] = ()
    """(layer, module) pairs an adapter wraps."""
    is_decode_adapted: bool = True
    """False for PreFT: decode tokens run base weights."""
    router_adapter_index: int = Field(default=0, ge=0)
    """MoL: the adapter L0 that decodes the route label."""
    num_route_prompt_tokens: int = Field(default=1024, ge=1)
    """MoL: route prompt and option descriptions prefilled per decision."""
    num_route_decode_tokens: int = Field(default=40, ge=1)
    """MoL: label and reason decoded per decision."""
    max_summary_tokens: int = Field(default=192, ge=0)
    """MoL: summary hop length when the answering adapter is not L0."""
    num_option_description_tokens: int = Field(default=64, ge=1)
    """Contextual MoL: description tokens per option in the temporary routing pass."""
    routing: Literal["in_engine", "outside_engine"] = "in_engine"
    """MoL2: where the pointer head runs."""
    num_head_params: int = Field(default=0, ge=0)
    """Routing-head parameters (MoL2 pointer head, contextual MoL q/k head)."""
    routing_accuracy: float = Field(default=1.0, gt=0, le=1)
    """Share of routed turns sent to the right adapter; the rest go to another, drawn uniformly
    (turns whose client names the adapter are always right)."""
    output_length_scale: float = Field(default=1.0, gt=0)
    """Multiplier on the workload's reply lengths under this strategy."""
    measured_decision_time_s: float | None = Field(default=None, gt=0)
    """A measured decision time: the least time a routing pass before the answer takes (the
    pass itself still runs on the GPUs); in-engine MoL2's head takes at least this much GPU
    time inside the answer's prefill step."""
    replay_window_tokens: int = Field(default=0, ge=0)
    """CED strategies: bounded replay length on a switch."""
    num_handover_tokens: int | None = Field(default=None, ge=1)
    """Multi-agent: text handed to the next agent; None hands over the whole history."""

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        if kind not in STRATEGIES:
            raise ValueError(f"unknown strategy kind {kind!r}; registered: {sorted(STRATEGIES)}")
        return kind

    @property
    def num_domains(self) -> int:
        """Distinct adapters (1 for base)."""
        return max(1, len(self.adapters))


class DisaggregationSpec(_Frozen):
    """Prefill and decode on separate workers joined by a KV transfer."""

    num_prefill_workers: int = Field(default=1, ge=1)
    """Workers that run prefills."""
    num_decode_workers: int = Field(default=1, ge=1)
    """Workers that run decodes."""
    kv_transfer_bandwidth_bytes_per_s: float = Field(default=50e9, gt=0)
    """Link bandwidth for moving a request's KV."""


class ClusterSpec(_Frozen):
    """Replicas behind a request router."""

    num_replicas: int = Field(default=1, ge=1)
    """Engine replicas (ignored under disaggregation, which names its workers)."""
    router: RouterPolicy = "least_outstanding"
    """How a turn picks its replica."""
    num_router_replicas: int = Field(default=0, ge=0)
    """Replicas of the same shape that run only routing passes (a dedicated router pool, priced
    by the plan); 0: routing passes run on the serving replicas."""
    disaggregation: DisaggregationSpec | None = None
    """None runs prefill and decode on every replica."""


class SimBounds(_Frozen):
    """Where a run stops: at the end of a measurement window, or at a limit that stops a run
    that would not end (hitting a limit raises SimulationError)."""

    max_simulated_time_s: float = Field(default=30 * 86_400.0, gt=0)
    """Simulated seconds after which the run stops."""
    max_engine_steps: int = Field(default=200_000_000, ge=1)
    """Engine steps (summed over replicas) after which the run stops."""
    window_s: float | None = Field(default=None, gt=0)
    """Measurement window: the run stops at this simulated time and its tables and summary
    cover the turns finished before it, as a serving benchmark run for a fixed time reports;
    the rest is neither simulated nor an error. None: run until every turn finishes."""

    @model_validator(mode="after")
    def _window_inside_bound(self) -> SimBounds:
        if self.window_s is not None and self.window_s > self.max_simulated_time_s:
            raise ValueError(f"window_s={self.window_s} exceeds max_simulated_time_s="
                             f"{self.max_simulated_time_s}; allowed: window_s <= "
                             f"max_simulated_time_s")
        return self


class SimConfig(_Frozen):
    """Everything one simulation run needs, resolved."""

    arch: ModelArch
    """The served model."""
    gpu: GpuSpec
    """The GPU of every replica."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """Tensor-parallel degree of a replica."""
    engine: EngineLimits = EngineLimits()
    """Engine limits."""
    strategy: StrategySpec
    """The strategy served."""
    cluster: ClusterSpec = ClusterSpec()
    """Replicas and router."""
    coeffs: CostCoeffs = CostCoeffs()
    """Cost-model coefficients."""
    bounds: SimBounds = SimBounds()
    """Run limits."""
    seed: int = Field(default=0, ge=0)
    """Seed of the run's random generator."""
    mode: Literal["fast", "reference"] = "fast"
    """fast: decode runs skip to the next event; reference: one event per engine step."""
    check_invariants: bool = False
    """Check KV accounting after every step (tests)."""

    @model_validator(mode="before")
    @classmethod
    def _resolve_layout(cls, data):
        strategy, arch = (data.get("strategy"), data.get("arch")) if isinstance(data, dict) \
            else (None, None)
        if isinstance(strategy, StrategySpec) and strategy.kv_layout is None \
                and isinstance(arch, ModelArch):
            pairs = [list(strategy.adapter_placements)] if strategy.adapter_placements else []
            layout = kv_layout(arch, strategy.kind, pairs)
            data = {**data, "strategy": strategy.model_copy(update={"kv_layout": layout})}
        return data

    @model_validator(mode="after")
    def _layout_fits_model(self) -> SimConfig:
        if self.strategy.kv_layout is None:
            raise ValueError("strategy.kv_layout: unresolved; give it or the model and "
                             "adapter_placements it follows from")
        if self.strategy.kv_layout == "shared" and self.arch.ced is None:
            raise ValueError(f"strategy.kv_layout='shared' needs a causal encoder-decoder model; "
                             f"{self.arch.name!r} is decoder-only")
        return self
