"""What `molcap verify` checks: each strategy's planned deployment (from the plan `molcap run`
wrote, or the scenario's own deployment), the workload one replica of it receives, and the
simulator's prediction of exactly that workload on the engine's resolved KV pool."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from planner.capacity import with_deployment
from planner.scenario import Scenario
from planner.search import Deployment
from planner.workloads import ConversationWorkload, PunicaWorkload

PLAN_METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                "e2e_p99_s", "output_tokens_per_s")
"""Metrics a plan reports (seed means of the whole deployment at the target rate)."""


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
    if not all(isinstance(r, dict) and "payload" in r and "result" in r for r in records):
        raise PlanMismatch(f"{path}: not a molcap plan (a plan.json or points/plan-*.json that "
                           "`molcap run` wrote)")
    return records


def _differences(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def planned_deployments(scenario: Scenario, scenario_path: Path,
                        plan_path: Path | None) -> list[PlannedDeployment]:
    """Each strategy's deployment: the plan's chosen one, else the scenario's own. A plan made
    for another scenario (or another version of this one) is refused, naming both."""
    own = scenario_deployment(scenario)
    if plan_path is None:
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
    out = []
    for record in sorted(mine, key=lambda r: r["payload"]["index"]):
        index, result = record["payload"]["index"], record.get("result") or {}
        chosen = result.get("chosen")
        label = scenario.strategies[index].label
        if record.get("status") != "ok" or not chosen:
            out.append(PlannedDeployment(index, label, own, False, {}, f"scenario "
                                         f"{scenario_path} (the plan found no deployment)"))
            continue
        d = Deployment(chosen["gpu"], int(chosen["tensor_parallel_size"]),
                       int(chosen["num_replicas"]), int(chosen["max_num_seqs"]),
                       int(chosen["max_loras"]))
        metrics = {k: v for k, v in chosen.items()
                   if isinstance(v, (int, float)) and k.split("_min")[0].split("_max")[0]
                   in PLAN_METRICS}
        out.append(PlannedDeployment(index, label, d, bool(result.get("is_feasible")), metrics,
                                     f"plan {plan_path}"))
    return out


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


def replay_conversations(workload, kind: str, seed: int, vocab_size: int):
    """The simulator's workload arrays as conversations to replay: random tokens of each
    turn's length (a conversation's initial context joins its first turn), each turn on its
    own adapter, the turn's think time honoured."""
    from calibrate.replay import ReplayConversation, ReplayTurn

    rng = np.random.default_rng(seed)
    out = []
    for c in range(workload.num_conversations):
        first, count = int(workload.conv_first_turn[c]), int(workload.conv_num_turns[c])
        turns = []
        for t in range(first, first + count):
            n = int(workload.turn_user_tokens[t]) + (
                int(workload.conv_initial_tokens[c]) if t == first else 0)
            tokens = tuple(rng.integers(3, vocab_size, max(n, 1)).tolist())
            turns.append(ReplayTurn(tokens, int(workload.turn_reply_tokens[t]),
                                    float(workload.turn_think_s[t]),
                                    adapter=int(workload.turn_domain[t])))
        out.append(ReplayConversation(float(workload.conv_arrival_s[c]), kind,
                                      int(workload.turn_domain[first]), tuple(turns)))
    return out


def predict_replay(scenario: Scenario, index: int, workload, num_kv_blocks: int) -> dict:
    """The simulator's summary of exactly the replayed workload on one replica, with the KV
    pool the engine resolved (the largest single source of error when computed instead)."""
    from planner.profiles import resolve_pricing
    from planner.simulation import engine_limits, strategy_spec
    from sim.config import ClusterSpec, SimConfig
    from sim.simulate import simulate

    engine = engine_limits(scenario).model_copy(update=dict(num_kv_blocks=num_kv_blocks))
    hw = scenario.hardware
    config = SimConfig(arch=scenario.strategy_arch(index), gpu=hw.gpu_spec,
                       tensor_parallel_size=hw.tensor_parallel_size, engine=engine,
                       strategy=strategy_spec(scenario, index),
                       coeffs=resolve_pricing(scenario).coeffs,
                       cluster=ClusterSpec(num_replicas=1), seed=scenario.seed)
    turns = simulate(config, workload).turns
    return summarize(turn_records(turns))


def summarize(records: list[dict]) -> dict[str, float]:
    """Latency percentiles and throughput of turn records (as `calibrate.validator`), plus
    output tokens per second."""
    from calibrate.validator import summarize_turns

    out = summarize_turns(records)
    span = max(r["finish_s"] for r in records) - min(r["arrival_s"] for r in records)
    out["output_tokens_per_s"] = float(sum(r["num_output_tokens"] for r in records) / span)
    return out


def turn_records(turns) -> list[dict]:
    """Simulated turns as replay records (arrival, first token, finish, tokens)."""
    return [dict(arrival_s=a, first_token_s=f, finish_s=d, num_output_tokens=n,
                 num_prompt_tokens=c + u)
            for a, f, d, n, c, u in zip(turns["arrival_s"], turns["first_token_s"],
                                        turns["finish_s"], turns["num_output_tokens"],
                                        turns["num_context_tokens"], turns["num_user_tokens"],
                                        strict=True)]
