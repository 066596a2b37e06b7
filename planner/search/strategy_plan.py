"""Capacity planning of a scenario's strategies: the simulator as `evaluate`, pruned analytically.

Each strategy gets its own `search` over the scenario's search space. The simulator runs only
near the boundary: candidates whose model does not fit are dropped by the memory model, and the
rate bisection starts just above an analytical bound on what one replica can serve.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from planner.predict.simulation import create_workload, num_router_replicas, simulate_strategy
from planner.scenario.resolved import ResolvedScenario, as_resolved, create_strategy_costing
from planner.scenario.schema import Scenario
from planner.scenario.workloads import ConversationWorkload, PunicaWorkload
from planner.search.slo_search import Deployment, Plan, SearchSpace, search
from sim.cost.phase_costs import decode_step, prefill_s
from sim.hardware.catalogue import GPUS
from sim.hardware.specs import GpuSpec
from sim.simulate import agent_loads
from sim.strategies.registry import get_strategy

BOUND_SLACK = 1.25
"""Bisection starts this far above the analytical bound, which uses mean lengths and may
underestimate; a replica that passes there is credited with that rate (conservative, never an
unverified plan: the scaled-out deployment is always simulated at the target rate)."""


@dataclass(frozen=True)
class WorkloadShape:
    """Means of the scenario's workload, in the unit its arrival rate is given in."""

    rate_per_s: float
    """The workload's own arrival rate (conversations/s, requests/s, or the trace's)."""
    turns_per_arrival: float
    mean_prompt_tokens: float
    mean_reply_tokens: float
    mean_context_tokens: float
    max_context_tokens: int


def workload_shape(scenario: Scenario) -> WorkloadShape:
    """Measure the generated workload once (seeded), so every workload kind is handled alike."""
    strategy = scenario.strategies[0]
    num_domains = max(1, len(getattr(strategy, "adapters", ())))
    w = create_workload(scenario, num_domains, np.random.default_rng(scenario.seed))
    arrivals = w.conv_arrival_s
    span = float(arrivals[-1] - arrivals[0]) if arrivals.size > 1 else 0.0
    rate = (arrivals.size - 1) / span if span > 0 else math.inf
    per_turn = w.turn_user_tokens + w.turn_reply_tokens
    return WorkloadShape(
        rate_per_s=rate, turns_per_arrival=w.num_turns / w.num_conversations,
        mean_prompt_tokens=float(w.turn_user_tokens.mean()),
        mean_reply_tokens=float(w.turn_reply_tokens.mean()),
        mean_context_tokens=float(w.conv_initial_tokens.mean() + per_turn.mean()
                                  * (w.num_turns / w.num_conversations) / 2),
        max_context_tokens=w.max_context_tokens())


def agent_shares(scenario: Scenario, num_agents: int) -> tuple[float, ...]:
    """Each agent's share of the work in the scenario's workload (seeded, as the simulator
    measures it to deal the replicas)."""
    w = create_workload(scenario, num_agents, np.random.default_rng(scenario.seed))
    loads = agent_loads(w, num_agents)
    return tuple(x / sum(loads) for x in loads) if sum(loads) else ()


def with_rate(scenario: Scenario, rate_per_s: float, shape: WorkloadShape) -> Scenario:
    """The scenario at another arrival rate, with its workload cut for a search point."""
    w = scenario.workload
    cap = scenario.search.max_turns_per_evaluation
    if isinstance(w, ConversationWorkload):
        count = max(1, min(w.num_conversations, round(cap / w.num_turns)))
        new = w.model_copy(update=dict(arrival_rate_per_s=rate_per_s, num_conversations=count))
    elif isinstance(w, PunicaWorkload):
        new = w.model_copy(update=dict(arrival_rate_per_s=rate_per_s,
                                       num_requests=min(w.num_requests, cap)))
    else:
        scale = w.rate_scale * rate_per_s / shape.rate_per_s
        new = w.model_copy(update=dict(rate_scale=scale,
                                       max_requests=min(w.max_requests or cap, cap)))
    return scenario.model_copy(update=dict(workload=new))


def with_deployment(scenario: Scenario, d: Deployment) -> Scenario:
    """The scenario on deployment `d` (one replica spans its TP group)."""
    own = scenario.hardware
    # The scenario's own GPU keeps its spec: a custom one is in no catalogue to look up by name.
    gpu = own.gpu if d.gpu == own.gpu_spec.name else d.gpu
    hw = own.model_copy(update=dict(
        gpu=gpu, tensor_parallel_size=d.tensor_parallel_size,
        num_gpus_per_replica=d.tensor_parallel_size, num_replicas=d.num_replicas))
    engine = scenario.engine.model_copy(update=dict(max_num_seqs=d.max_num_seqs,
                                                    max_loras=d.max_loras))
    return scenario.model_copy(update=dict(hardware=hw, engine=engine))


def fitting_candidates(scenario: Scenario, index: int,
                       shape: WorkloadShape) -> tuple[list[Deployment], list[str]]:
    """Candidates whose KV pool holds the workload's longest context, and why others dropped."""
    s, e, arch = scenario.search, scenario.engine, scenario.strategy_arch(index)
    strategy = scenario.strategies[index]
    kind = get_strategy(strategy.kind)
    copies = len(strategy.adapters) if kind.is_model_per_domain else 1
    shares = agent_shares(scenario, copies) if copies > 1 else ()
    specs = gpu_specs(scenario)
    kept, dropped = [], []
    for gpu, tp, seqs, loras in itertools.product(
        s.gpus or (scenario.hardware.gpu_spec.name,),
        s.tensor_parallel_sizes or (scenario.hardware.tensor_parallel_size,),
        s.max_num_seqs or (e.max_num_seqs,), s.max_loras or (e.max_loras,),
    ):
        mem = e.memory(arch, specs[gpu], tp, uses_lora=kind.uses_adapters,
                       max_num_seqs=seqs, max_loras=loras)
        if mem.num_kv_tokens < shape.max_context_tokens:
            dropped.append(f"{gpu} TP={tp}: {arch.name} leaves KV for {mem.num_kv_tokens} "
                           f"tokens, the workload needs {shape.max_context_tokens}")
        else:
            kept.append(Deployment(gpu, tp, copies, seqs, loras, num_model_copies=copies,
                                   traffic_shares=shares,
                                   num_router_replicas=num_router_replicas(scenario, index)))
    return kept, dropped


def replica_rate_bound(scenario: Scenario | ResolvedScenario, index: int, d: Deployment,
                       shape: WorkloadShape) -> float:
    """Analytical upper bound on arrivals/s one replica serves: decode- or prefill-bound."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    # Priced on the candidate's own engine limits: vLLM's LoRA kernel grid spans its
    # max_loras + 1 slots, so a candidate with fewer slots than the scenario's is cheaper.
    costing = create_strategy_costing(resolved.at(with_deployment(scenario, d)), index,
                                      gpu=gpu_specs(scenario)[d.gpu],
                                      tensor_parallel_size=d.tensor_parallel_size)
    c, p = costing.coeffs, costing.profile
    ctx = int(shape.mean_context_tokens)
    step = decode_step(c, p, batch_size=d.max_num_seqs, num_context_tokens=ctx,
                       num_distinct_adapters=min(d.max_loras, d.max_num_seqs)).total_s
    decode_tokens_per_s = d.max_num_seqs / step
    chunk = scenario.engine.max_num_batched_tokens
    prefill_tokens_per_s = chunk / prefill_s(c, p, chunk, num_context_tokens=ctx,
                                             max_chunk_tokens=chunk)
    turns_per_s = min(decode_tokens_per_s / max(shape.mean_reply_tokens, 1),
                      prefill_tokens_per_s / max(shape.mean_prompt_tokens, 1))
    return turns_per_s / shape.turns_per_arrival


def smallest_rate_bound(scenario: Scenario | ResolvedScenario, index: int, d: Deployment,
                        shape: WorkloadShape) -> float:
    """Analytical bound on what the smallest deployment of `d` serves: one replica per model,
    the one with the largest share of the traffic saturating first (one replica's bound when a
    single model is served)."""
    return replica_rate_bound(scenario, index, d, shape) / float(d.shares.max())


def gpu_specs(scenario: Scenario) -> dict[str, GpuSpec]:
    """The catalogue's GPUs plus the scenario's custom one, by name."""
    return {**GPUS, scenario.hardware.gpu_spec.name: scenario.hardware.gpu_spec}


def gpu_prices(scenario: Scenario) -> dict[str, float]:
    """Price per GPU-hour: the scenario's override, else the spec's default."""
    return {name: scenario.gpu_prices_per_hour_usd.get(name, gpu.price_per_hour_usd)
            for name, gpu in gpu_specs(scenario).items()}


def plan_strategy(scenario: Scenario | ResolvedScenario,
                  index: int) -> tuple[Plan, list[str]]:
    """Capacity plan of strategy `index` with the simulator as `evaluate`; also the pruned.
    Every trial reads the one resolution of the scenario (its pricing per GPU kind)."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    shape = workload_shape(scenario)
    if not math.isfinite(shape.rate_per_s):
        raise ValueError("workload: the capacity search needs an arrival rate "
                         "(workload.arrival_rate_per_s); all requests arrive at once")
    candidates, dropped = fitting_candidates(scenario, index, shape)
    bounds = {d: BOUND_SLACK * smallest_rate_bound(resolved, index, d, shape)
              for d in candidates}
    s = scenario.search
    space = SearchSpace(tuple(candidates), shape.rate_per_s, gpu_prices(scenario),
                        max_num_replicas=s.max_num_replicas, seeds=tuple(range(s.num_seeds)),
                        rate_upper_bounds=bounds, rate_tolerance=s.rate_tolerance,
                        exhaustive=s.exhaustive)
    done: dict[tuple[Deployment, float, int], dict] = {}  # shared by both searches

    def evaluate(d: Deployment, rate: float, seed: int) -> dict:
        if (d, rate, seed) not in done:
            point = with_rate(with_deployment(scenario, d), rate, shape)
            done[(d, rate, seed)] = simulate_strategy(
                resolved.at(point), index, seed=scenario.seed + seed,
                num_replicas=d.num_replicas).summary
        return done[(d, rate, seed)]

    if s.confidence is None:
        return search(space, evaluate, scenario.slo), dropped
    sure = replace(space, slo_values=confident_slo_values(resolved, s.confidence))
    plan, point = search(sure, evaluate, scenario.slo), search(space, evaluate, scenario.slo)
    gpus = point.chosen.deployment.num_gpus if point.chosen else None
    return replace(plan, point_estimate_num_gpus=gpus), dropped


def confident_slo_values(scenario: Scenario | ResolvedScenario, confidence: float):
    """The search's `slo_values` at `confidence`: each latency's upper end, widened by the
    measured error of the profile that prices the deployment's GPU kind."""
    from planner.predict.intervals import pricing_errors, slo_values

    resolved = as_resolved(scenario)
    errors = {gpu: pricing_errors(resolved, gpu) for gpu in resolved.pricing}

    def values(d: Deployment, mean, low, high):
        return slo_values(mean, low, high, errors[d.gpu], confidence)

    return values
