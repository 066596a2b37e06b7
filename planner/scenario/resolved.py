"""A scenario resolved once, at load, into everything its points read: `ResolvedScenario`.

Loading validates the text; resolving then fixes what the numbers depend on beyond the text:
the coefficients that price each GPU kind the search may choose (`resolve_pricing`, called
here and nowhere else), each strategy's adapter pricing (`adapter_pricing`, one rule for the
analysis and the simulation), the bytes each adapter loads, the KV layout its placements imply,
and the files the points read with the digest of their content (part of a point's key).

The object is frozen and pickles, so worker processes and Ray tasks receive it whole and
re-validate and re-read nothing. Public planner functions take either a `Scenario` (resolved
on the spot, as the dashboard and tests call them) or a `ResolvedScenario` (`as_resolved`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.scenario.input_files import input_files, input_files_digest
from planner.scenario.pricing import (
    AdapterPricing,
    PricingSource,
    StrategyCosting,
    adapter_pricing,
    gpu_default_pricing,
    resolve_pricing,
)
from planner.scenario.schema import Scenario
from sim.cost.cost_model import CostCoeffs
from sim.cost.layer_costs import LayerCosts, create_layer_costs
from sim.cost.memory_model import LORA_DTYPE_BYTES
from sim.cost.model_shapes import lora_weights_per_rank
from sim.hardware.catalogue import GPUS
from sim.hardware.specs import GpuSpec, ModelArch
from sim.strategies.placement import KvLayout
from sim.strategies.registry import get_strategy, kv_layout


@dataclass(frozen=True)
class ResolvedStrategy:
    """What one strategy's steps and adapter loads are priced with."""

    arch: ModelArch
    adapters: AdapterPricing
    kv_layout: KvLayout
    adapter_load_bytes: tuple[int | float, ...]
    """Each adapter's weights at its own rank on one GPU; a TP group loads this / TP per GPU
    (0 for every adapter when the strategy prices none)."""


@dataclass(frozen=True)
class ResolvedScenario:
    """A validated scenario and everything resolved from it (see the module's docstring)."""

    scenario: Scenario
    folder: Path | None
    """The scenario file's folder, against which relative paths resolved (None: none given)."""
    pricing: dict[str, PricingSource]
    """GPU kind -> what prices it: the scenario's own GPU and every kind in `search.gpus`."""
    strategies: tuple[ResolvedStrategy, ...]
    inputs: tuple[tuple[str, str], ...]
    """(absolute path, content digest) of every file the points read besides the scenario."""

    def source(self, gpu_name: str) -> PricingSource:
        """What prices steps on `gpu_name`; a kind the scenario never runs on is an error."""
        try:
            return self.pricing[gpu_name]
        except KeyError:
            raise ValueError(f"GPU {gpu_name!r} is neither the scenario's hardware.gpu nor in "
                             f"its search.gpus; resolved: {sorted(self.pricing)}") from None

    def coeffs(self, gpu_name: str) -> CostCoeffs:
        """The coefficients that price steps on `gpu_name`."""
        return self.source(gpu_name).coeffs

    @property
    def input_digests(self) -> list[str]:
        """Content digests of the files the points read, in order (a part of a point's key)."""
        return [digest for _, digest in self.inputs]

    def at(self, point: Scenario) -> ResolvedScenario:
        """The resolution of a search point of this scenario: the same strategies, model and
        profile, another deployment or rate (`planner.search.strategy_plan.with_deployment`,
        `with_rate`), which change nothing resolved here."""
        same = point.strategies is self.scenario.strategies or \
            point.strategies == self.scenario.strategies
        if not same or point.engine.max_lora_rank != self.scenario.engine.max_lora_rank:
            raise ValueError("a search point changes only the deployment and the rate; "
                             "resolve a scenario with other strategies anew")
        self.source(point.hardware.gpu_spec.name)
        return replace(self, scenario=point)


def _strategy(scenario: Scenario, index: int) -> ResolvedStrategy:
    strategy = scenario.strategies[index]
    arch = scenario.strategy_arch(index)
    pricing = adapter_pricing(strategy, arch, scenario.engine.max_lora_rank)
    layout = kv_layout(arch, strategy.kind, [list(p) for p in pricing.each])
    adapters = getattr(strategy, "adapters", ())
    if pricing.kind == "none":
        return ResolvedStrategy(arch, pricing, layout, tuple(0 for _ in adapters))
    loads = []
    for a, pairs in zip(adapters, pricing.each, strict=True):
        # The bytes loaded are the adapter's own, at its own rank.
        per_rank = (2 * arch.hidden_size * len({layer for layer, _ in pairs})
                    if pricing.kind == "direft" else lora_weights_per_rank(arch, list(pairs)))
        loads.append(a.rank * per_rank * LORA_DTYPE_BYTES)
    return ResolvedStrategy(arch, pricing, layout, tuple(loads))


def _gpu_kinds(scenario: Scenario) -> dict[str, GpuSpec]:
    own = scenario.hardware.gpu_spec
    specs = {**GPUS, own.name: own}
    return {name: specs[name] for name in (own.name, *(scenario.search.gpus or ()))
            if name in specs}


def resolve_scenario(scenario: Scenario, folder: str | Path | None = None, *,
                     strict: bool = False) -> ResolvedScenario:
    """Resolve a validated scenario (see the module's docstring). `strict` (loading a file):
    a named profile measured on another GPU kind is an error, not a fallback."""
    folder = Path(folder) if folder is not None else None
    own = scenario.hardware.gpu_spec.name
    pricing = {name: (resolve_pricing(scenario, folder, strict=strict) if name == own
                      else gpu_default_pricing(gpu))
               for name, gpu in _gpu_kinds(scenario).items()}
    files = input_files(scenario)
    return ResolvedScenario(
        scenario=scenario, folder=folder, pricing=pricing,
        strategies=tuple(_strategy(scenario, i) for i in range(len(scenario.strategies))),
        inputs=tuple(zip((str(f.resolve()) for f in files), input_files_digest(scenario),
                         strict=True)))


def as_resolved(scenario: Scenario | ResolvedScenario,
                folder: str | Path | None = None) -> ResolvedScenario:
    """`scenario` itself when already resolved, else its resolution against `folder`."""
    if isinstance(scenario, ResolvedScenario):
        return scenario
    return resolve_scenario(scenario, folder)


_LAYER_COSTS: dict[tuple, tuple[ModelArch, GpuSpec, LayerCosts]] = {}
"""create_layer_costs by (id of the arch, id of the GPU, the other arguments), holding the arch
and GPU so their ids stay their own: a sweep or a capacity search prices the same strategies
on the same few GPUs at every point (a 200-point sweep built them 3,600 times, a third of its
time). The arch and GPU are the catalogue's shared objects; the layer costs are read-only."""
MAX_LAYER_COSTS = 512


def _layer_costs(arch: ModelArch, gpu: GpuSpec, tp: int, kind: str, rank: int,
                 placements: tuple, num_head_params: int, max_loras: int,
                 run_unadapted: bool) -> LayerCosts:
    key = (id(arch), id(gpu), tp, kind, rank, placements, num_head_params, max_loras,
           run_unadapted)
    hit = _LAYER_COSTS.get(key)
    if hit is not None:
        return hit[2]
    if len(_LAYER_COSTS) >= MAX_LAYER_COSTS:
        _LAYER_COSTS.clear()
    costs = create_layer_costs(
        arch, gpu, tp, adapter_kind=kind, adapter_rank=rank, adapter_placements=list(placements),
        num_head_params=num_head_params, max_loras=max_loras,
        lora_kernels_run_unadapted=run_unadapted)
    _LAYER_COSTS[key] = (arch, gpu, costs)
    return costs


def create_strategy_costing(
    scenario: Scenario | ResolvedScenario, index: int, *, gpu: GpuSpec | None = None,
    tensor_parallel_size: int | None = None,
) -> StrategyCosting:
    """Cost profile of strategy `index` on `gpu` (default the scenario's), its adapters priced
    as the simulation prices them (the resolved `adapter_pricing`)."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    strategy, own = scenario.strategies[index], resolved.strategies[index]
    gpu = gpu or scenario.hardware.gpu_spec
    tp = tensor_parallel_size or scenario.hardware.tensor_parallel_size
    adapters = own.adapters
    profile = _layer_costs(
        own.arch, gpu, tp, adapters.kind, adapters.rank, tuple(adapters.placements),
        getattr(strategy, "num_head_params", 0),
        scenario.engine.max_loras if adapters.kind == "lora" else 0,
        get_strategy(strategy.kind).is_decode_adapted,
    )
    window = getattr(strategy, "replay_window_tokens", None) or profile.window_tokens
    return StrategyCosting(strategy.label, strategy.kind, own.arch, gpu, tp, profile,
                           resolved.coeffs(gpu.name), window, own.kv_layout)


def pricing_sources(scenario: Scenario | ResolvedScenario,
                    base_dir: Path | None = None) -> dict[str, str]:
    """Strategy label -> the line saying which profile (or assumed default) prices it."""
    resolved = as_resolved(scenario, base_dir)
    source = resolved.source(resolved.scenario.hardware.gpu_spec.name).describe()
    return {strategy.label: source for strategy in resolved.scenario.strategies}


def gpu_pricing_source(scenario: Scenario | ResolvedScenario, gpu_name: str,
                       base_dir: Path | None = None) -> str:
    """The line saying which profile prices deployments on `gpu_name`: as resolved for a GPU
    kind the scenario may run on, another catalogue GPU by its shipped default, anything else
    as the scenario's own GPU."""
    resolved = as_resolved(scenario, base_dir)
    if gpu_name in resolved.pricing:
        return resolved.pricing[gpu_name].describe()
    if gpu_name in GPUS:
        return gpu_default_pricing(GPUS[gpu_name]).describe()
    return resolved.source(resolved.scenario.hardware.gpu_spec.name).describe()
