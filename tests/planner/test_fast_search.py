"""The fast capacity search (candidates that cannot beat a verified cost pruned, seeds stopped
on a proven miss, no point simulated twice) gives the plan the exhaustive search gives, with
fewer evaluations: on many small random spaces of fake replicas, and with the simulator on a
small scenario."""

import numpy as np
import pytest

from planner.scenario.loading import scenario_from_text
from planner.scenario.schema import SloConfig
from planner.search.slo_search import Deployment, SearchSpace, min_cost_per_hour, search
from planner.search.strategy_plan import plan_strategy

GPUS = ("H20", "H100-SXM", "H200", "A100-80GB")


def fake_evaluate(service_rate: dict, floor_s: float, seed_spread: float, calls: list):
    """M/M/1-like p99 latency per replica: floor / (1 - load), scaled per seed."""

    def evaluate(d: Deployment, rate: float, seed: int):
        calls.append((d, rate, seed))
        rho = rate / (service_rate[d.gpu] * d.num_replicas)
        factor = 1.0 + seed_spread * (seed - 1)
        latency = 1e3 if rho >= 1 else floor_s / (1 - rho) * factor
        return {"e2e_p99_s": latency, "ttft_p99_s": latency / 4,
                "output_tokens_per_s": 10.0 * rate}

    return evaluate


def random_case(rng: np.random.Generator):
    gpus = tuple(rng.choice(GPUS, size=rng.integers(1, 5), replace=False))
    candidates = tuple(Deployment(str(g), int(tp)) for g in gpus
                       for tp in rng.choice([1, 2, 4], size=rng.integers(1, 3), replace=False))
    service = {str(g): float(rng.uniform(2, 40)) for g in gpus}
    prices = {str(g): float(rng.choice([1.0, 1.5, 2.0, 3.5])) for g in gpus}
    bounds = {c: service[c.gpu] * float(rng.uniform(0.6, 1.6)) for c in candidates}
    space = dict(candidates=candidates, target_rate_per_s=float(rng.uniform(1, 80)),
                 price_per_gpu_hour=prices, max_num_replicas=int(rng.integers(4, 40)),
                 seeds=(0, 1, 2), rate_upper_bounds=bounds,
                 rate_tolerance=float(rng.choice([0.02, 0.05, 0.1])))
    slo = SloConfig(e2e_p99_s=float(rng.uniform(0.3, 2.0)),
                    ttft_p99_s=float(rng.uniform(0.2, 1.0)) if rng.random() < 0.5 else None)
    return space, service, float(rng.uniform(0.2, 0.6)), float(rng.uniform(0, 0.3)), slo


@pytest.mark.parametrize("case", range(40))
def test_fast_search_chooses_what_the_exhaustive_search_chooses(case):
    space, service, floor_s, spread, slo = random_case(np.random.default_rng(case))
    plans, calls = {}, {}
    for exhaustive in (True, False):
        calls[exhaustive] = []
        evaluate = fake_evaluate(service, floor_s, spread, calls[exhaustive])
        plans[exhaustive] = search(SearchSpace(**space, exhaustive=exhaustive), evaluate, slo)
    full, fast = plans[True], plans[False]
    assert fast.is_feasible == full.is_feasible
    assert len(calls[False]) <= len(calls[True])
    if not full.is_feasible:
        return
    assert fast.chosen.deployment == full.chosen.deployment
    assert fast.chosen.cost_per_hour_usd == full.chosen.cost_per_hour_usd
    assert fast.chosen.meets_slo
    # Every candidate the fast search evaluated got the exhaustive search's capacity.
    for candidate, capacity in fast.capacities.items():
        assert capacity == full.capacities[candidate]
    # Every pruned candidate could not have been cheaper than the chosen plan.
    evaluated = set(fast.capacities)
    for candidate in set(space["candidates"]) - evaluated:
        assert min_cost_per_hour(SearchSpace(**space), candidate) > fast.chosen.cost_per_hour_usd


def test_cheaper_candidates_are_searched_first_and_the_rest_pruned():
    # H20 (1 $/h) serves 10/s per replica, H200 (3.5 $/h) 40/s. At 8/s one H20 replica (1 $/h)
    # verifies; an H200 costs at least 3.5 $/h, so it is never simulated.
    calls = []
    evaluate = fake_evaluate({"H20": 20.0, "H200": 80.0}, 0.5, 0.0, calls)
    h200, h20 = Deployment("H200", 1), Deployment("H20", 1)
    space = SearchSpace((h200, h20), 8.0, {"H20": 1.0, "H200": 3.5}, seeds=(0,),
                        rate_upper_bounds={h200: 80.0, h20: 20.0})
    plan = search(space, evaluate, SloConfig(e2e_p99_s=1.0))
    assert plan.chosen.deployment == Deployment("H20", 1, num_replicas=1)
    assert {d.gpu for d, _, _ in calls} == {"H20"}
    assert len(plan.pruned) == 1 and plan.pruned[0].startswith("H200")


def test_a_seed_that_proves_the_mean_misses_stops_the_point():
    # Three seeds, SLO 1 s: a seed at 3.5 s alone puts the mean above 1 s (others are >= 0).
    calls = []
    evaluate = fake_evaluate({"H20": 10.0}, 0.5, 0.0, calls)
    h20 = Deployment("H20", 1)
    space = SearchSpace((h20,), 9.5, {"H20": 1.0}, seeds=(0, 1, 2),
                        rate_upper_bounds={h20: 9.5})  # 0.5 / (1 - 0.95) = 10 s at the bound
    plan = search(space, evaluate, SloConfig(e2e_p99_s=1.0))
    first = plan.trials[0]
    assert first.rate_per_s == 9.5 and not first.meets_slo and first.num_seeds == 1
    assert all(t.num_seeds == 3 for t in plan.trials if t.meets_slo)


SMALL = """
name: small_fast
model: llama-3.1-8b
hardware: {gpu: H100-SXM}
engine: {max_num_seqs: 32, max_loras: 2, max_lora_rank: 16}
strategies:
  - kind: multi_lora
    adapters: [{name: a}, {name: b}, {name: c}]
workload:
  kind: punica
  num_requests: 300
  num_adapters: 3
  num_output_tokens: 64
  arrival_rate_per_s: 30.0
slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.05}
search:
  gpus: [H100-SXM, A100-80GB, H20]
  max_num_replicas: 8
  max_turns_per_evaluation: 120
  num_seeds: 2
analysis: {context_tokens: [512], decode_tokens_per_turn: [16], adapters_visited: [1]}
"""


def test_fast_and_exhaustive_plans_agree_with_the_simulator():
    plans = {}
    for exhaustive in (True, False):
        text = SMALL.replace("num_seeds: 2", f"num_seeds: 2\n  exhaustive: {str(exhaustive)}")
        plans[exhaustive], _ = plan_strategy(scenario_from_text(text, "small.yaml"), 0)
    full, fast = plans[True], plans[False]
    assert full.is_feasible and fast.is_feasible
    assert fast.chosen.deployment == full.chosen.deployment
    assert fast.chosen.mean == full.chosen.mean  # the same simulations at the target rate
    assert fast.capacities == full.capacities
    assert sum(t.num_seeds for t in fast.trials) < sum(t.num_seeds for t in full.trials)
    assert fast.per_replica_rate_per_s == full.per_replica_rate_per_s
