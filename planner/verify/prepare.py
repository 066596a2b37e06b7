"""What `molcap verify` checks, planner side: each strategy's planned deployment (from the plan
`molcap run` wrote, or the scenario's own), the scenario as one replica of it sees it, the vLLM
arguments and process settings it runs with, and the simulator's prediction of exactly the
requests replayed on the KV pool the engine resolved. Plain values out: the engine side
(`calibrate.verify_engine`) takes dicts and the simulator's workload arrays."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from planner.scenario.resolved import ResolvedScenario, as_resolved, create_strategy_costing
from planner.scenario.schema import Scenario
from planner.scenario.workloads import ConversationWorkload, PunicaWorkload
from planner.search.slo_search import Deployment
from planner.search.strategy_plan import with_deployment
from sim.strategies.registry import get_strategy

PLAN_METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                "e2e_p99_s", "output_tokens_per_s")
"""Metrics a plan reports (seed means of the whole deployment at the target rate)."""
TINY_MODEL = "vllm-tiny-llama"
"""The one catalogue model verify builds itself (the CPU profile's model)."""
ROUTED_KIND = "routed"
"""The adapter kind of a strategy the plugin routes: requests name no adapter."""


class PlanMismatch(ValueError):
    """A plan file that is not a plan of the scenario given (the message names both)."""


@dataclass(frozen=True)
class PlannedDeployment:
    """The deployment of one strategy that verify starts, and what the plan predicted for it."""

    index: int
    """Position of the strategy in the scenario."""
    strategy: str
    deployment: Deployment
    is_feasible: bool
    """False: the plan found no deployment meeting the SLOs (the scenario's own one is run)."""
    plan_metrics: dict
    """The plan's seed-mean metrics and their min/max (`<metric>_min`, `<metric>_max`)."""
    source: str
    """Where the deployment comes from: the plan file, or the scenario."""


def is_routed_in_engine(scenario: Scenario, index: int) -> bool:
    """The strategy is routed after a decoder layer inside the engine (MoL2 with `route_layer`
    on a decoder-only model): the molcap vLLM plugin's router picks each request's adapter."""
    strategy = scenario.strategies[index]
    return (get_strategy(strategy.kind).is_routing and not scenario.strategy_arch(index).is_ced
            and getattr(strategy, "route_layer", None) is not None)


def refusal(scenario: Scenario, index: int) -> str | None:
    """Why vLLM cannot run this strategy as planned, naming what is missing (None: it can)."""
    strategy = scenario.strategies[index]
    served, arch = get_strategy(strategy.kind), scenario.strategy_arch(index)
    if served.is_verifiable or is_routed_in_engine(scenario, index):
        return None
    head = f"{strategy.label}: kind {strategy.kind!r} is not verified on vLLM"
    if served.is_model_per_domain:
        return (f"{head}: it serves one full model per domain on replicas of its own, and verify "
                "starts one engine per strategy (missing: a multi-model deployment driver)")
    if served.is_routing and arch.is_ced:
        return (f"{head}: vLLM has no implementation of the causal encoder-decoder model "
                f"{arch.name!r} its router reads (missing: a CED model in vLLM and a "
                "contextual or CED router in the molcap plugin; the plugin routes decoder-only "
                "models with a MoL2 pointer head: kind mol2 with route_layer)")
    if served.is_routing:
        return (f"{head}: its router is an adapter decoding a label, then a handoff prefill and "
                "a summary hop, a client-side protocol verify does not drive (missing: that "
                "driver; the plugin routes in the engine with a MoL2 pointer head: kind mol2 "
                "with route_layer)")
    return f"{head} (missing: an engine mapping for this kind)"


def scenario_deployment(scenario: Scenario) -> Deployment:
    """The deployment the scenario itself describes (hardware and engine sections)."""
    hw, e = scenario.hardware, scenario.engine
    return Deployment(hw.gpu_spec.name, hw.tensor_parallel_size, hw.num_replicas,
                      e.max_num_seqs, e.max_loras)


def _plan_records(path: Path) -> list[dict]:
    """Plan point records in a plan file (`plan.json` of `molcap run`, or one point record), a
    run folder or its points folder."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("plan-*.json")) or sorted((path / "points").glob("plan-*.json"))
        if not files:
            raise FileNotFoundError(f"{path}: no plan in this folder (plan-*.json, or "
                                    "points/plan-*.json as `molcap run` writes them)")
        return [json.loads(f.read_text(encoding="utf-8")) for f in files]
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"{path}: cannot read the plan: {err}") from None
    records = raw.get("plans", [raw]) if isinstance(raw, dict) else []
    if not records or not all(isinstance(r, dict) and "payload" in r for r in records):
        raise PlanMismatch(f"{path}: not a molcap plan (a plan.json or points/plan-*.json that "
                           "`molcap run` wrote)")
    return records


def _differences(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _planned(scenario: Scenario, scenario_path: Path, record: dict,
             plan_path: Path) -> PlannedDeployment:
    index, result = record["payload"]["index"], record.get("result") or {}
    chosen, label = result.get("chosen"), scenario.strategies[index].label
    if record.get("status") != "ok" or not chosen:
        return PlannedDeployment(index, label, scenario_deployment(scenario), False, {},
                                 f"scenario {scenario_path} (the plan found no deployment)")
    d = Deployment(chosen["gpu"], int(chosen["tensor_parallel_size"]),
                   int(chosen["num_replicas"]), int(chosen["max_num_seqs"]),
                   int(chosen["max_loras"]))
    metrics = {k: v for k, v in chosen.items() if isinstance(v, (int, float))
               and k.removesuffix("_min").removesuffix("_max") in PLAN_METRICS}
    return PlannedDeployment(index, label, d, bool(result.get("is_feasible")), metrics,
                             f"plan {plan_path}")


def planned_deployments(scenario: Scenario, scenario_path: Path,
                        plan_path: Path | None) -> list[PlannedDeployment]:
    """Each strategy's deployment: the plan's chosen one, else the scenario's own. A plan made
    for another scenario (or another version of this one) is refused, naming both."""
    if plan_path is None:
        own = scenario_deployment(scenario)
        return [PlannedDeployment(i, s.label, own, True, {}, f"scenario {scenario_path}")
                for i, s in enumerate(scenario.strategies)]
    dump = scenario.model_dump(mode="json")
    records = _plan_records(plan_path)
    mine = [r for r in records if r["payload"].get("scenario") == dump]
    if not mine:
        other = records[0]["payload"].get("scenario", {})
        fields = ", ".join(_differences(other, dump)) or "?"
        raise PlanMismatch(
            f"{plan_path}: this is a plan of scenario {other.get('name')!r}, which does not "
            f"match scenario {scenario.name!r} ({scenario_path}): they differ in {fields}; run "
            f"`molcap run {scenario_path}` to plan this scenario, or pass its plan")
    return [_planned(scenario, scenario_path, r, plan_path)
            for r in sorted(mine, key=lambda r: r["payload"]["index"])]


def replica_scenario(scenario: Scenario, planned: PlannedDeployment,
                     num_requests: int) -> Scenario:
    """The scenario as one replica of the deployment sees it: the planned engine limits, its
    share (1 / replicas) of the target rate, `num_requests` requests (turns)."""
    d = planned.deployment
    point = with_deployment(scenario, replace(d, num_replicas=1))
    w = scenario.workload
    replicas = max(1, d.num_replicas)
    if isinstance(w, PunicaWorkload):
        rate = None if w.arrival_rate_per_s is None else w.arrival_rate_per_s / replicas
        new = w.model_copy(update=dict(num_requests=num_requests, arrival_rate_per_s=rate))
    elif isinstance(w, ConversationWorkload):
        count = max(1, math.ceil(num_requests / w.num_turns))
        new = w.model_copy(update=dict(num_conversations=count,
                                       arrival_rate_per_s=w.arrival_rate_per_s / replicas))
    else:  # a trace: its own arrivals, spread over the replicas
        new = w.model_copy(update=dict(rate_scale=w.rate_scale / replicas,
                                       max_requests=num_requests))
    return point.model_copy(update=dict(workload=new))


def engine_kwargs(scenario: Scenario, index: int, model_path: str, device: str) -> dict:
    """`vllm.LLM` keyword arguments of one replica of the (replica-)scenario: exactly the
    plan's limits; eager mode on CPU (as the CPU profile was measured) and for in-engine
    routing (the plugin's layer hook needs it), float32 for the tiny model built here, vLLM's
    defaults for everything else."""
    e, hw = scenario.engine, scenario.hardware
    arch = scenario.strategy_arch(index)
    is_tiny = arch.name == TINY_MODEL
    adapters = getattr(scenario.strategies[index], "adapters", ())
    out = dict(model=model_path, max_num_seqs=e.max_num_seqs,
               max_num_batched_tokens=e.max_num_batched_tokens, block_size=e.block_size,
               tensor_parallel_size=hw.tensor_parallel_size,
               enable_prefix_caching=e.enable_prefix_caching,
               enable_chunked_prefill=e.enable_chunked_prefill,
               gpu_memory_utilization=e.gpu_memory_utilization, seed=scenario.seed,
               enforce_eager=device == "cpu" or is_routed_in_engine(scenario, index),
               dtype="float32" if is_tiny else "auto")
    if get_strategy(scenario.strategies[index].kind).uses_adapters:
        out.update(enable_lora=True, max_loras=e.max_loras, max_lora_rank=e.max_lora_rank,
                   max_cpu_loras=max(e.max_cpu_loras, len(adapters)))
    if e.kv_cache_memory_bytes is not None:
        out["kv_cache_memory_bytes"] = int(e.kv_cache_memory_bytes)
    if is_tiny:
        out["max_model_len"] = arch.max_context_tokens
    return out


def adapter_specs(scenario: Scenario, index: int) -> tuple[str, list[dict]]:
    """The adapter kind the engine names requests by ("base", "lora", "lora_p", "direft_p";
    "routed": none, the plugin's router picks) and each adapter's name, rank, modules and
    layers."""
    strategy = scenario.strategies[index]
    served = get_strategy(strategy.kind)
    if not served.uses_adapters:
        return "base", []
    kind = ROUTED_KIND if is_routed_in_engine(scenario, index) else \
        served.engine_adapter_kind(strategy)
    return kind, [dict(name=a.name, rank=a.rank, target_modules=list(a.target_modules),
                       layers=None if a.layers is None else list(a.layers))
                  for a in strategy.adapters]


def router_spec(scenario: Scenario | ResolvedScenario, index: int) -> dict | None:
    """What the engine's router is built with (None: not routed in the engine): the layer it
    reads, the head size the plan priced, and the simulator's analytical seconds of one
    decision (the pointer head inside the answer's prefill step)."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    if not is_routed_in_engine(scenario, index):
        return None
    from planner.predict.simulation import strategy_spec
    from sim.strategies.strategy import TurnPricing

    strategy, arch = scenario.strategies[index], resolved.strategies[index].arch
    costing = create_strategy_costing(resolved, index)
    pricing = TurnPricing(costing.coeffs, costing.profile, scenario.engine.max_num_batched_tokens,
                          num_query_tokens=1, routing_last_layer=strategy.route_layer + 1)
    decision_s = get_strategy(strategy.kind).decision_s(strategy_spec(resolved, index), pricing,
                                                        num_context_tokens=0)
    return dict(route_layer=strategy.route_layer, num_head_params=strategy.num_head_params,
                num_layers=arch.num_layers, predicted_decision_s=float(decision_s),
                seed=scenario.seed)


def host_settings(scenario: Scenario | ResolvedScenario, device: str) -> dict:
    """What the pricing profile recorded about the process it was measured in, to apply the
    same way: torch threads and the kept-freed-memory allocator on CPU (a plan priced by
    assumed coefficients, or on a GPU, gets vLLM's defaults)."""
    resolved = as_resolved(scenario)
    profile = resolved.source(resolved.scenario.hardware.gpu_spec.name).profile
    settings = profile.engine.settings if profile is not None else {}
    if device != "cpu":
        return dict(num_threads=None, keep_freed_memory=False)
    threads = settings.get("num_threads")
    return dict(num_threads=int(threads) if threads else None,
                keep_freed_memory="freed memory kept" in str(settings.get("host_allocator", "")))


def layer_costs_json(scenario: Scenario | ResolvedScenario, index: int) -> dict:
    """The layer costs that price this strategy's steps (as
    `planner.scenario.resolved.create_strategy_costing` resolves it) as plain JSON: arrays as
    {"array": values, "dtype": name}, the GPU spec dumped. The calibration prices a verify
    run's steps on it (`calibrate.verify_samples`)."""
    from dataclasses import fields

    import numpy as np

    profile = create_strategy_costing(scenario, index).profile
    out = {}
    for f in fields(profile):
        value = getattr(profile, f.name)
        if isinstance(value, np.ndarray):
            value = dict(array=value.tolist(), dtype=str(value.dtype))
        elif f.name == "gpu":
            value = value.model_dump(mode="json")
        out[f.name] = value
    return out


def predict_replay(scenario: Scenario | ResolvedScenario, index: int, workload,
                   num_kv_blocks: int) -> dict:
    """The simulator's summary of exactly the replayed workload on one replica, with the KV
    pool the engine resolved (the largest single source of error when computed instead)."""
    from planner.predict.simulation import engine_limits, strategy_spec
    from planner.verify.checks import summarize, turn_records
    from sim.config import ClusterSpec, SimConfig
    from sim.simulate import simulate

    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    engine = engine_limits(scenario).model_copy(update=dict(num_kv_blocks=num_kv_blocks))
    hw = scenario.hardware
    config = SimConfig(arch=resolved.strategies[index].arch, gpu=hw.gpu_spec,
                       tensor_parallel_size=hw.tensor_parallel_size, engine=engine,
                       strategy=strategy_spec(resolved, index),
                       coeffs=resolved.coeffs(hw.gpu_spec.name),
                       cluster=ClusterSpec(num_replicas=1), seed=scenario.seed)
    return summarize(turn_records(simulate(config, workload).turns))
