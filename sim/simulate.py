"""`simulate(config, workload) -> SimResult`: build replicas, router and conversations, run, and
return the metric tables. Writes no files; all randomness was spent building the workload.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from sim.config import SimConfig, StrategySpec
from sim.cost.cost_model import adapter_disk_load_s, adapter_load_s, routing_decision_s
from sim.cost.layer_costs import LayerCosts, create_layer_costs
from sim.cost.memory_model import memory_breakdown
from sim.engine.cluster import Router, replica_groups
from sim.engine.disaggregation import Disaggregation
from sim.engine.replica import Replica, SimulationError, StepCounter
from sim.engine.scheduler import Engine
from sim.engine.step_pricer import StepPricer
from sim.metrics import MetricsRecorder, summarize
from sim.strategies.registry import get_strategy
from sim.strategies.turns import TurnDriver
from sim.workload.generate import Workload, with_reply_scale


class SimInputError(ValueError):
    """The configuration or workload cannot be simulated; one line per problem, field first."""


@dataclass(frozen=True, eq=False)
class SimResult:
    """Tables and summary of one run."""

    requests: pd.DataFrame
    """One row per engine sequence (each hop of each turn)."""
    turns: pd.DataFrame
    """One row per user turn: arrival, TTFT, TPOT, end-to-end, hop breakdown, recompute."""
    timeseries: pd.DataFrame
    """Per replica over time: running, waiting, batch, KV blocks, resident adapters, loads."""
    kv_by_namespace: pd.DataFrame
    """KV blocks held per namespace (adapter id; -1 shared) per replica over time."""
    summary: dict
    """Throughput, percentiles, goodput."""
    stats: dict = field(default_factory=dict)
    """How the run went: engine steps, events, wall seconds, KV blocks per replica."""

    def summary_frame(self) -> pd.DataFrame:
        """The summary as a one-row DataFrame."""
        return pd.DataFrame([self.summary])


def resolve_num_kv_blocks(config: SimConfig) -> int:
    """KV blocks per replica: the override, or what vLLM would allocate."""
    if config.engine.num_kv_blocks is not None:
        return config.engine.num_kv_blocks
    e = config.engine
    mem = memory_breakdown(
        config.arch, config.gpu, tensor_parallel_size=config.tensor_parallel_size,
        gpu_memory_utilization=e.gpu_memory_utilization, max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens, block_size=e.block_size,
        max_loras=e.max_loras, max_lora_rank=e.max_lora_rank,
        uses_lora=config.strategy.adapter_kind != "none",
        kv_cache_memory_bytes=e.kv_cache_memory_bytes)
    return mem.num_kv_blocks


def in_engine_decision_floor_s(s: StrategySpec) -> float:
    """A measured decision time of a head that runs inside the answer's prefill step (MoL2 in
    the engine): the head's GPU time in that step is at least this. Routers with a pass of their
    own wait it out instead (`sim.strategies.turns`)."""
    in_engine = get_strategy(s.kind).head_rides_answer(s)
    return (s.measured_decision_time_s or 0.0) if in_engine else 0.0


def create_profile(config: SimConfig) -> LayerCosts:
    """The cost profile of the strategy's model and adapter shape."""
    s = config.strategy
    return create_layer_costs(
        config.arch, config.gpu, config.tensor_parallel_size, adapter_kind=s.adapter_kind,
        adapter_rank=s.adapter_rank, adapter_placements=list(s.adapter_placements),
        num_head_params=s.num_head_params, min_decision_s=in_engine_decision_floor_s(s),
        max_loras=config.engine.max_loras if s.adapter_kind == "lora" else 0,
        lora_kernels_run_unadapted=get_strategy(s.kind).is_decode_adapted)


def pricing_identity(config: SimConfig) -> str:
    """Everything a step's price depends on besides the step: coefficients and the profile's
    inputs (see `create_profile`)."""
    s = config.strategy
    return "|".join((config.coeffs.model_dump_json(), config.arch.model_dump_json(),
                     config.gpu.model_dump_json(), str(config.tensor_parallel_size),
                     s.adapter_kind, str(s.adapter_rank), repr(s.adapter_placements),
                     str(s.num_head_params), str(in_engine_decision_floor_s(s)),
                     str(config.engine.max_loras), s.kind))


def agent_loads(workload: Workload, num_agents: int) -> list[float]:
    """Each agent's share of the work: the tokens of the turns of its domain."""
    tokens = workload.turn_user_tokens + workload.turn_reply_tokens
    return np.bincount(workload.turn_domain % num_agents, weights=tokens,
                       minlength=num_agents).tolist()


def _longest_sequence_tokens(config: SimConfig, workload: Workload) -> int:
    s = config.strategy
    return workload.max_context_tokens() + get_strategy(s.kind).extra_sequence_tokens(s)


def validate_inputs(config: SimConfig, workload: Workload, num_kv_blocks: int) -> None:
    """Raise SimInputError naming every reason the run cannot go ahead."""
    problems = []
    if workload.num_turns == 0:
        problems.append("workload: no requests to simulate")
    elif (workload.turn_domain < 0).any():
        problems.append("workload.turn_domain: negative domain index")
    if num_kv_blocks < 1:
        problems.append(f"engine: model {config.arch.name!r} leaves no KV block on "
                        f"{config.gpu.name} at tensor_parallel_size="
                        f"{config.tensor_parallel_size}")
    if problems:
        raise SimInputError("\n".join(problems))
    longest = _longest_sequence_tokens(config, workload)
    capacity = num_kv_blocks * config.engine.block_size
    if longest > capacity:
        problems.append(f"workload: a request reaches {longest} tokens of context but the KV "
                        f"pool holds {capacity} tokens ({num_kv_blocks} blocks); allowed: "
                        f"<= {capacity}")
    if workload.max_context_tokens() > config.arch.max_context_tokens:
        problems.append(f"workload: a conversation reaches {workload.max_context_tokens()} "
                        f"tokens, longer than {config.arch.name!r} allows "
                        f"({config.arch.max_context_tokens})")
    if not config.engine.enable_chunked_prefill and longest > config.engine.max_num_batched_tokens:
        problems.append(f"engine.enable_chunked_prefill: off, but a prompt of {longest} tokens "
                        f"exceeds max_num_batched_tokens={config.engine.max_num_batched_tokens}")
    if problems:
        raise SimInputError("\n".join(problems))


def _adapter_load_s(config: SimConfig) -> list[float]:
    return [adapter_load_s(config.coeffs, config.gpu, a.num_bytes_per_gpu)
            for a in config.strategy.adapters] or [0.0]


def _adapter_disk_load_s(config: SimConfig) -> list[float] | None:
    """Cold-load seconds per adapter; None where the profile prices no host-cache load."""
    c = config.coeffs
    if not (c.adapter_disk_load_overhead_s or c.adapter_disk_read_s_per_gib):
        return None
    return [adapter_disk_load_s(c, a.num_bytes_per_gpu) for a in config.strategy.adapters] or [0.0]


def _build_replicas(env, config: SimConfig, pricer: StepPricer, num_kv_blocks: int,
                    counter: StepCounter, recorder: MetricsRecorder, num: int) -> list[Replica]:
    return [Replica(env, i, Engine(config.engine, num_kv_blocks, _adapter_load_s(config),
                                   config.check_invariants, _adapter_disk_load_s(config)),
                    pricer, counter, recorder.on_sample) for i in range(num)]


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector: a run holds millions of live objects, and repeated
    full collections over them cost more than the little cyclic garbage a run leaves."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _routing_gpu_seconds(config: SimConfig, profile: LayerCosts, turns: pd.DataFrame,
                         summary: dict) -> dict:
    """GPU-seconds the router costs: its passes' share of the steps they ran in, plus an
    in-engine head's time inside the answer prefill, times the GPUs of a replica."""
    s = config.strategy
    replica_s = float(turns["routing_busy_s"].sum())
    if get_strategy(s.kind).head_rides_answer(s):
        replica_s += summary["num_routed_turns"] * routing_decision_s(config.coeffs, profile, 1)
    served_s = float(turns[[c for c in turns if c.endswith("_busy_s")]].sum().sum())
    gpus = config.tensor_parallel_size
    return {"routing_gpu_s": replica_s * gpus, "serving_gpu_s": served_s * gpus,
            "routing_gpu_share": replica_s / served_s if served_s else 0.0}


def _summary(config: SimConfig, profile: LayerCosts, frames: dict, replicas: list[Replica],
             slo: dict, num_unfinished: int) -> dict:
    """The run's summary. Every turn has finished, or the run stopped at its window and the
    summary covers the turns finished inside it (its rates over the window)."""
    window_s, bounds = config.bounds.window_s, config.bounds
    if num_unfinished and window_s is None:
        raise SimulationError(
            f"simulation.max_simulated_time_s={bounds.max_simulated_time_s} reached with "
            f"{num_unfinished} of {num_unfinished + len(frames['turns'])} turns unfinished; "
            f"the deployment is overloaded or the bound is too short")
    if frames["turns"].empty:
        raise SimulationError(f"simulation.window_s={window_s}: no turn finished inside the "
                              f"window; lengthen it")
    summary = summarize(frames["turns"], frames["requests"], **slo, duration_s=window_s)
    if window_s is not None:
        summary.update(window_s=window_s, num_turns_unfinished_in_window=num_unfinished)
    summary.update(_routing_gpu_seconds(config, profile, frames["turns"], summary))
    busy = sum(r.busy_s for r in replicas)
    summary["mean_replica_utilization"] = busy / (len(replicas) * max(summary["duration_s"],
                                                                      1e-12))
    return summary


def simulate(config: SimConfig, workload: Workload, *, timeseries_interval_s: float = 1.0,
             slo: dict | None = None) -> SimResult:
    """Simulate `workload` served under `config`; `slo` holds ttft/tpot/e2e_slo_s for goodput."""
    wall_start = time.perf_counter()
    workload = with_reply_scale(workload, config.strategy.output_length_scale)
    num_kv_blocks = resolve_num_kv_blocks(config)
    validate_inputs(config, workload, num_kv_blocks)
    profile = create_profile(config)
    ced = config.arch.ced
    pricer = StepPricer(
        config.coeffs, profile, replay_first_layer=ced.num_encoder_layers if ced else 0,
        num_decode_compute_tokens=1 + config.engine.num_speculative_tokens,
        num_tokens_per_decode_step=config.engine.num_tokens_per_decode_step,
        is_fast=config.mode == "fast", shared_key=pricing_identity(config))
    env = simpy.Environment()
    counter = StepCounter(config.bounds.max_engine_steps)
    recorder = MetricsRecorder(timeseries_interval_s)
    cluster, disaggregation = config.cluster, None
    if cluster.disaggregation is None:
        replicas = _build_replicas(env, config, pricer, num_kv_blocks, counter, recorder,
                                   cluster.num_replicas)
        num_groups = get_strategy(config.strategy.kind).num_replica_groups(config.strategy)
        if len(replicas) < num_groups:
            raise SimInputError(f"cluster.num_replicas: multi_agent needs one replica per agent "
                                f"({num_groups}), got {len(replicas)}")
        weights = agent_loads(workload, num_groups) if num_groups > 1 else None
        router = Router(cluster.router, replicas,
                        replica_groups(len(replicas), num_groups, weights))
    else:
        d = cluster.disaggregation
        prefill = _build_replicas(env, config, pricer, num_kv_blocks, counter, recorder,
                                  d.num_prefill_workers)
        decode = _build_replicas(env, config, pricer, num_kv_blocks, counter, recorder,
                                 d.num_decode_workers)
        for i, replica in enumerate(decode):
            replica.index = len(prefill) + i
        router = Router(cluster.router, prefill, [list(range(len(prefill)))])
        disaggregation = Disaggregation(config, d, Router(cluster.router, decode,
                                                          [list(range(len(decode)))]))
        replicas = prefill + decode
    router_pool = None
    if cluster.num_router_replicas:
        pool = _build_replicas(env, config, pricer, num_kv_blocks, counter, recorder,
                               cluster.num_router_replicas)
        for i, replica in enumerate(pool):
            replica.index = len(replicas) + i
        router_pool = Router(cluster.router, pool, [list(range(len(pool)))])
        replicas = replicas + pool
    driver = TurnDriver(env, config, workload, router, recorder, disaggregation, router_pool)
    env.process(driver.arrivals())
    window_s = config.bounds.window_s
    with _gc_paused():
        env.run(until=window_s or config.bounds.max_simulated_time_s)
    num_unfinished = workload.num_turns - len(recorder.turns)
    frames = recorder.frames()
    summary = _summary(config, profile, frames, replicas, slo or {}, num_unfinished)
    stats = dict(num_engine_steps=counter.num_steps, num_engine_events=counter.num_events,
                 num_predict_calls=pricer.num_predict_calls, num_kv_blocks=num_kv_blocks,
                 num_replicas=len(replicas), wall_s=time.perf_counter() - wall_start,
                 kv_blocks_in_use_at_end=sum(r.engine.kv.num_used for r in replicas),
                 num_sequences_left=sum(r.engine.num_outstanding for r in replicas))
    if config.bounds.window_s is not None:
        stats["stopped_at_window_s"] = config.bounds.window_s
    return SimResult(frames["requests"], frames["turns"], frames["timeseries"],
                     frames["kv_by_namespace"], summary, stats)
