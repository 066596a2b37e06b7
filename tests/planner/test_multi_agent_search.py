"""Multi-agent capacity search: the replica count follows each agent's share of the traffic
(one replica at a time, dealt as the simulator deals them), not one more replica per agent per
step. The fake evaluate deals replicas with the simulator's own rule and says an agent meets
the SLO while its replicas each carry at most 1 request/s."""

import math

import pytest

from planner.scenario.schema import SloConfig
from planner.search.slo_search import Deployment, SearchSpace, replicas_for_rate, search
from sim.engine.cluster import replica_groups

SHARES = (0.5, 0.25, 0.125, 0.125)
AGENTS = Deployment("H100-SXM", 1, num_replicas=4, num_model_copies=4, traffic_shares=SHARES)
SLO = SloConfig(e2e_p99_s=1.0)


def by_share(d: Deployment, rate: float, seed: int) -> dict:
    groups = replica_groups(d.num_replicas, d.num_model_copies, list(SHARES))
    load = max(rate * s / len(g) for s, g in zip(SHARES, groups, strict=True))
    latency = math.inf if load >= 1.0 else 0.5 / (1 - load)  # 1.0 s at half the service rate
    return {"e2e_p99_s": latency, "output_tokens_per_s": rate}


def test_replicas_follow_each_agents_share_of_the_traffic():
    # At 16/s the agents carry 8, 4, 2 and 2/s; at 0.5/s per replica (the SLO) they need 16, 8,
    # 4 and 4 replicas: 32. The smallest deployment (one each) saturates at 1/s, where the
    # busiest agent's replica carries 0.5/s. Adding one replica per agent per step would land on
    # 4 x ceil(16 / 1) = 64 replicas.
    space = SearchSpace((AGENTS,), 16.0, {"H100-SXM": 1.0}, seeds=(0,), max_num_replicas=128,
                        rate_upper_bounds={AGENTS: 1.0}, rate_tolerance=0.01)
    plan = search(space, by_share, SLO)
    assert plan.chosen.deployment.num_replicas == 32
    assert plan.chosen.deployment.num_gpus == 32
    assert plan.capacities[AGENTS] == 1.0  # the smallest deployment's capacity
    assert plan.per_replica_rate_per_s == 0.5  # what its busiest replica carries


def test_equal_shares_scale_like_whole_groups_and_one_model_like_one_replica():
    equal = Deployment("H100-SXM", 1, num_replicas=3, num_model_copies=3)
    assert replicas_for_rate(equal, 10.0, 2.0) == 3 * math.ceil(10.0 / 2.0)
    assert replicas_for_rate(Deployment("H100-SXM", 1), 10.0, 3.0) == 4
    # Skewed: 0.5 x 2 = 1 request/s per replica; 8, 4, 2, 2 replicas for 16/s.
    assert replicas_for_rate(AGENTS, 16.0, 2.0) == 16
    assert replicas_for_rate(AGENTS, 0.1, 2.0) == 4  # never fewer than one per agent


def test_the_rate_bound_is_the_smallest_deployments_the_busiest_agent_saturating_first():
    # Four agents over a Zipf-skewed workload: the smallest deployment (one replica each)
    # serves one replica's bound over the busiest agent's share, not one replica's bound.
    from planner.scenario.loading import scenario_from_text
    from planner.search.strategy_plan import (
        fitting_candidates,
        replica_rate_bound,
        smallest_rate_bound,
        workload_shape,
    )
    scenario = scenario_from_text("""
model: llama-3.1-8b
hardware: {gpu: H100-SXM}
strategies:
  - kind: multi_agent
    adapters: [{name: a}, {name: b}, {name: c}, {name: d}]
  - kind: multi_lora
    adapters: [{name: a}, {name: b}, {name: c}, {name: d}]
workload: {kind: punica, num_requests: 400, num_adapters: 4, popularity: skewed,
           arrival_rate_per_s: 5.0}
""", "agents.yaml")
    shape = workload_shape(scenario)
    (agents,), _ = fitting_candidates(scenario, 0, shape)
    (one_model,), _ = fitting_candidates(scenario, 1, shape)
    busiest = max(agents.traffic_shares)
    assert agents.num_replicas == agents.num_model_copies == 4
    assert 0.3 < busiest < 0.7 and sum(agents.traffic_shares) == pytest.approx(1.0)
    single = replica_rate_bound(scenario, 0, agents, shape)
    assert smallest_rate_bound(scenario, 0, agents, shape) == pytest.approx(single / busiest)
    assert smallest_rate_bound(scenario, 1, one_model, shape) == \
        replica_rate_bound(scenario, 1, one_model, shape)


def test_a_model_per_agent_reserves_no_lora_slots_in_the_fit_checks():
    # One full model per agent loads no LoRA: the scenario check and the search's fit check
    # size its KV pool as the simulator does, without vLLM's LoRA slots (32 slots of rank 256
    # would leave an 8B model ~117k tokens on an H100; without them it holds ~444k).
    from planner.predict.simulation import create_sim_config
    from planner.scenario.loading import scenario_from_text
    from planner.search.strategy_plan import fitting_candidates, with_deployment, workload_shape
    from sim.simulate import resolve_num_kv_blocks
    scenario = scenario_from_text("""
model: llama-3.1-8b
hardware: {gpu: H100-SXM}
engine: {max_loras: 32, max_cpu_loras: 32, max_lora_rank: 256}
strategies:
  - kind: multi_agent
    adapters: [{name: a}, {name: b}]
workload: {kind: punica, num_requests: 20, num_adapters: 2, max_prompt_tokens: 120000,
           arrival_rate_per_s: 1.0}
""", "agents.yaml")
    (agents,), dropped = fitting_candidates(scenario, 0, workload_shape(scenario))
    config = create_sim_config(with_deployment(scenario, agents), 0)
    assert not dropped
    assert resolve_num_kv_blocks(config) * config.engine.block_size > 120_000 + 128
