"""Capacity search with fake evaluate functions whose answers are known by construction."""

import math

import pytest

from planner.scenario.schema import SloConfig
from planner.search.slo_search import Deployment, SearchSpace, pareto_front, search

H100 = Deployment("H100-SXM", 1)
H20 = Deployment("H20", 1)
PRICES = {"H100-SXM": 2.0, "H20": 1.0}
SLO = SloConfig(e2e_p99_s=1.0)


def queueing_evaluate(capacity_by_gpu: dict[str, float]):
    """Latency of an M/M/1-like replica: 0.5 s at no load, blowing up at its capacity.

    With the SLO at 1.0 s the per-replica capacity is exactly half the service rate:
    0.5 / (1 - rho) <= 1  <=>  rho <= 0.5.
    """
    calls = []

    def evaluate(d: Deployment, rate: float, seed: int):
        calls.append((d, rate, seed))
        rho = rate / (capacity_by_gpu[d.gpu] * d.num_replicas)
        latency = math.inf if rho >= 1 else 0.5 / (1 - rho)
        return {"e2e_p99_s": latency + 1e-6 * seed, "output_tokens_per_s": 100.0 * rate}

    evaluate.calls = calls
    return evaluate


def test_monotone_search_finds_the_cheapest_deployment():
    # H100 serves 20 req/s (SLO capacity 10/replica); H20 serves 6 (capacity 3/replica).
    # Target 25 req/s: H100 needs ceil(25/10)=3 replicas = 6 $/h; H20 needs ceil(25/3)=9 = 9 $/h.
    evaluate = queueing_evaluate({"H100-SXM": 20.0, "H20": 6.0})
    space = SearchSpace((H100, H20), target_rate_per_s=25.0, price_per_gpu_hour=PRICES,
                        rate_upper_bounds={H100: 40.0, H20: 40.0}, rate_tolerance=0.01)
    plan = search(space, evaluate, SLO)
    assert plan.is_feasible
    assert plan.chosen.deployment == Deployment("H100-SXM", 1, num_replicas=3)
    assert plan.chosen.cost_per_hour_usd == pytest.approx(6.0)
    assert plan.per_replica_rate_per_s == pytest.approx(10.0, rel=0.011)
    assert plan.capacities[H20] == pytest.approx(3.0, rel=0.011)
    assert [t.deployment.gpu for t in plan.runner_ups] == ["H20"]
    assert plan.chosen.meets_slo and all(t.meets_slo for t in plan.runner_ups)
    # Every seed was run for every trial.
    assert {seed for _, _, seed in evaluate.calls} == {0, 1, 2}
    # cost per million tokens = 6 $/h / (100*25 tok/s * 3600 s/h) * 1e6
    assert plan.cost_per_million_tokens_usd == pytest.approx(6 / (2500 * 3600) * 1e6)


def test_infeasible_slo_is_reported_not_planned():
    evaluate = queueing_evaluate({"H100-SXM": 20.0, "H20": 6.0})
    space = SearchSpace((H100, H20), target_rate_per_s=5.0, price_per_gpu_hour=PRICES)
    plan = search(space, evaluate, SloConfig(e2e_p99_s=0.4))  # below the 0.5 s floor
    assert not plan.is_feasible
    assert plan.chosen is None
    assert "misses the SLOs even at a trickle" in plan.reason
    assert math.isnan(plan.cost_per_million_tokens_usd)


def test_too_many_replicas_is_infeasible():
    evaluate = queueing_evaluate({"H100-SXM": 20.0})
    space = SearchSpace((H100,), target_rate_per_s=1000.0, price_per_gpu_hour=PRICES,
                        max_num_replicas=8)
    plan = search(space, evaluate, SLO)
    assert not plan.is_feasible and "more than 8 replicas" in plan.reason


def test_non_monotone_evaluate_never_yields_an_unverified_plan():
    """A replica that meets the SLO at low load, misses it in a middle band, and the scaled-out
    deployment misses once more than its estimate: the plan must still be one that was verified
    at the target rate."""

    def evaluate(d: Deployment, rate: float, seed: int):
        per_replica = rate / d.num_replicas
        bad_band = 4.0 <= per_replica <= 6.0
        overloaded = per_replica > 8.0
        # Scale-out interference: with exactly 3 replicas the deployment misses.
        interference = d.num_replicas == 3
        ok = not (bad_band or overloaded or interference)
        return {"e2e_p99_s": 0.5 if ok else 2.0}

    space = SearchSpace((H100,), target_rate_per_s=20.0, price_per_gpu_hour=PRICES,
                        rate_upper_bounds={H100: 8.0}, seeds=(0,))
    plan = search(space, evaluate, SLO)
    assert plan.is_feasible
    chosen = plan.chosen
    assert chosen.rate_per_s == 20.0 and chosen.meets_slo
    # Re-check the chosen deployment independently.
    assert evaluate(chosen.deployment, 20.0, 0)["e2e_p99_s"] <= 1.0
    assert chosen.deployment.num_replicas != 3


def test_pareto_front_drops_dominated_points():
    from planner.search.slo_search import Trial

    def trial(cost, latency):
        return Trial(H100, 1.0, {"e2e_p99_s": latency}, {}, {}, (), cost)

    a, b, c, d = trial(1, 5), trial(2, 3), trial(3, 4), trial(4, 1)
    assert pareto_front([c, a, d, b]) == (a, b, d)  # c is beaten by b on both axes
