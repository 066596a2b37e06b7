"""Thin converter from a resolved scenario to the simulator: `simulate_strategy`.

Builds the sim-level `SimConfig` (model, GPU, engine limits, strategy numbers, cluster) and the
workload arrays for one strategy of the scenario, then calls `sim.simulate`. The coefficients,
adapter numbers and KV layout are read from the scenario's resolution
(`planner.scenario.resolved`); a plain `Scenario` is resolved on the spot.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from planner.scenario.resolved import ResolvedScenario, ResolvedStrategy, as_resolved
from planner.scenario.schema import Scenario
from planner.scenario.workloads import (
    ConversationWorkload,
    OutputLengths,
    PunicaWorkload,
    TraceWorkload,
)
from sim.config import (
    AdapterSpec,
    ClusterSpec,
    DisaggregationSpec,
    EngineLimits,
    RouterPolicy,
    SimBounds,
    SimConfig,
    StrategySpec,
)
from sim.simulate import SimResult, simulate
from sim.strategies.registry import get_strategy
from sim.workload.generate import (
    Workload,
    conversation_workload,
    draw_lengths,
    punica_workload,
    with_named_share,
)
from sim.workload.traces import (
    TRACES_DIR,
    TraceError,
    read_trace_rows,
    servegen_popularity,
    trace_workload,
)


def _adapter_fields(strategy, resolved: ResolvedStrategy, tp: int) -> dict:
    """The resolved adapter pricing and KV layout, each adapter's load bytes per GPU of `tp`."""
    adapters = getattr(strategy, "adapters", ())
    pricing = resolved.adapters
    if pricing.kind == "none":
        return dict(adapter_kind="none", kv_layout=resolved.kv_layout,
                    adapters=tuple(AdapterSpec(name=a.name, num_bytes_per_gpu=0.0)
                                   for a in adapters))
    specs = tuple(AdapterSpec(name=a.name, num_bytes_per_gpu=load / tp)
                  for a, load in zip(adapters, resolved.adapter_load_bytes, strict=True))
    return dict(adapter_kind=pricing.kind, adapters=specs, adapter_rank=pricing.rank,
                adapter_placements=pricing.placements, kv_layout=resolved.kv_layout)


def strategy_spec(scenario: Scenario | ResolvedScenario, index: int) -> StrategySpec:
    """The sim-level description of strategy `index`."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    st = scenario.strategies[index]
    arch = resolved.strategies[index].arch
    fields = dict(kind=st.kind, label=st.label, output_length_scale=st.output_length_scale,
                  **_adapter_fields(st, resolved.strategies[index],
                                    scenario.hardware.tensor_parallel_size))
    fields.update(st.sim_fields([a.name for a in getattr(st, "adapters", ())]))
    if fields["kv_layout"] == "shared":
        fields["replay_window_tokens"] = (getattr(st, "replay_window_tokens", None)
                                          or arch.ced.sliding_window_tokens)
    return StrategySpec(**fields)


def engine_limits(scenario: Scenario) -> EngineLimits:
    """Engine limits of the scenario in simulator terms."""
    e = scenario.engine
    spec = e.speculative
    return EngineLimits(
        max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
        block_size=e.block_size, enable_chunked_prefill=e.enable_chunked_prefill,
        enable_prefix_caching=e.enable_prefix_caching,
        gpu_memory_utilization=e.gpu_memory_utilization, max_loras=e.max_loras,
        kv_cache_memory_bytes=e.kv_cache_memory_bytes,
        max_cpu_loras=e.max_cpu_loras, max_lora_rank=e.max_lora_rank,
        ced_encoder_window=e.ced_encoder_window,
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        mean_accepted_tokens=spec.mean_accepted_tokens if spec else 1.0)


def create_workload(scenario: Scenario, num_domains: int, rng: np.random.Generator,
                    scenario_dir: Path | None = None) -> Workload:
    """The scenario's workload as simulator arrays."""
    w = scenario.workload
    arrays = _workload_arrays(w, num_domains, rng, scenario_dir)
    lengths = getattr(w, "output_lengths", None)
    if lengths is not None and lengths.distribution != "fixed":
        median = w.num_output_tokens if isinstance(w, PunicaWorkload) else w.num_reply_tokens
        samples = (_trace_output_lengths(lengths, scenario_dir)
                   if lengths.distribution == "trace" else None)
        arrays = replace(arrays, turn_reply_tokens=draw_lengths(
            rng, arrays.num_turns, distribution=lengths.distribution, median=median,
            sigma=lengths.lognormal_sigma, samples=samples, max_tokens=lengths.max_tokens))
    return with_named_share(rng, arrays, w.named_adapter_share)


def _trace_output_lengths(lengths: OutputLengths, scenario_dir: Path | None) -> np.ndarray:
    path = Path(lengths.trace_path)
    if not path.is_absolute():
        near = (scenario_dir or Path.cwd()) / path
        path = near if near.exists() else TRACES_DIR / path
    rows = read_trace_rows(path, lengths.trace_format, None)
    if lengths.trace_column not in rows[0][1]:
        raise TraceError(f"{rows[0][0]}: no column {lengths.trace_column!r} "
                         f"(output_lengths.trace_column); columns: {sorted(rows[0][1])}")
    return np.array([max(1, int(float(row[lengths.trace_column]))) for _, row in rows])


def _workload_arrays(w, num_domains: int, rng: np.random.Generator,
                     scenario_dir: Path | None) -> Workload:
    own = {"kind", "named_adapter_share", "output_lengths"}
    if isinstance(w, PunicaWorkload):
        return punica_workload(rng, **w.model_dump(exclude=own))
    if isinstance(w, ConversationWorkload):
        return conversation_workload(rng, num_domains=num_domains,
                                     **w.model_dump(exclude=own))
    assert isinstance(w, TraceWorkload)
    path = Path(w.path)  # load_scenario makes a file's relative path absolute
    if not path.is_absolute():
        path = (scenario_dir or Path.cwd()) / path
    c = w.columns
    weights = servegen_popularity(num_domains) if w.popularity == "servegen" else None
    return trace_workload(
        rng, path, num_domains=num_domains, fmt=w.format, arrival_column=c.arrival_time,
        input_column=c.num_input_tokens, output_column=c.num_output_tokens,
        hash_ids_column=c.hash_ids, adapter_column=c.adapter, time_unit=w.time_unit,
        hash_block_tokens=w.hash_block_tokens, rate_scale=w.rate_scale,
        length_scale=w.length_scale, max_requests=w.max_requests, domain_weights=weights)


def _slo_targets(scenario: Scenario) -> dict:
    s = scenario.slo
    return dict(ttft_slo_s=s.ttft_p99_s or s.ttft_p50_s, tpot_slo_s=s.tpot_p99_s or s.tpot_p50_s,
                e2e_slo_s=s.e2e_p99_s or s.e2e_p50_s)


def num_router_replicas(scenario: Scenario, index: int) -> int:
    """Replicas of strategy `index`'s dedicated router pool (0 when routing runs on the
    serving GPUs)."""
    st = scenario.strategies[index]
    return st.num_router_replicas if getattr(st, "router_pool", "serving") == "dedicated" else 0


def create_sim_config(
    scenario: Scenario | ResolvedScenario, strategy_index: int, *,
    num_replicas: int | None = None, router: RouterPolicy | None = None, mode: str = "fast",
    seed: int | None = None, scenario_dir: Path | None = None, bounds: SimBounds | None = None,
) -> SimConfig:
    """The simulator's config of strategy `strategy_index` (replicas, router and bounds default
    to the scenario's; a strategy with a model per domain gets at least one replica each)."""
    resolved = as_resolved(scenario, scenario_dir)
    scenario = resolved.scenario
    strategy = strategy_spec(resolved, strategy_index)
    hw, e = scenario.hardware, scenario.engine
    replicas = max(num_replicas or hw.num_replicas,
                   get_strategy(strategy.kind).num_replica_groups(strategy))
    disagg = None
    if e.disaggregation is not None:
        d = e.disaggregation
        disagg = DisaggregationSpec(
            num_prefill_workers=d.num_prefill_workers, num_decode_workers=d.num_decode_workers,
            kv_transfer_bandwidth_bytes_per_s=d.kv_transfer_bandwidth_bytes_per_s)
    return SimConfig(
        arch=resolved.strategies[strategy_index].arch, gpu=hw.gpu_spec,
        tensor_parallel_size=hw.tensor_parallel_size, engine=engine_limits(scenario),
        strategy=strategy, coeffs=resolved.coeffs(hw.gpu_spec.name),
        cluster=ClusterSpec(num_replicas=replicas, router=router or hw.router,
                            disaggregation=disagg,
                            num_router_replicas=num_router_replicas(scenario, strategy_index)),
        bounds=bounds or SimBounds(**scenario.simulation.model_dump()),
        seed=scenario.seed if seed is None else seed, mode=mode)


def simulate_strategy(
    scenario: Scenario | ResolvedScenario, strategy_index: int, *,
    num_replicas: int | None = None, router: RouterPolicy | None = None, mode: str = "fast",
    seed: int | None = None, workload: Workload | None = None,
    scenario_dir: Path | None = None, bounds: SimBounds | None = None,
    timeseries_interval_s: float = 1.0,
) -> SimResult:
    """Simulate strategy `strategy_index` of `scenario` (see `create_sim_config`). Pass
    `workload` to reuse one across strategies."""
    resolved = as_resolved(scenario, scenario_dir)
    config = create_sim_config(resolved, strategy_index, num_replicas=num_replicas,
                               router=router, mode=mode, seed=seed, bounds=bounds)
    scenario = resolved.scenario
    if workload is None:
        workload = create_workload(scenario, config.strategy.num_domains,
                                   np.random.default_rng(config.seed), scenario_dir)
    return simulate(config, workload, timeseries_interval_s=timeseries_interval_s,
                    slo=_slo_targets(scenario))
