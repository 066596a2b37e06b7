"""Rules of the capacity search (`planner.search.slo_search`) that the plan tests reach only
through one scenario each: replicas per model under uneven traffic, GPUs of a router pool, the
one-seed early stop at its boundary, ties, the Pareto front's equal points, the scale-down to
fewer replicas than the estimate and its floor."""

from __future__ import annotations

import math

import pytest

from planner.search.slo import Slo
from planner.search.slo_search import (
    Deployment,
    SearchSpace,
    Trial,
    min_cost_per_hour,
    pareto_front,
    replicas_for_rate,
    search,
)

H100 = Deployment("H100-SXM", 1)
SLO = Slo(e2e_p99_s=1.0)


@pytest.mark.parametrize("rate, capacity, expected", [
    (30.0, 10.0, 3), (30.5, 10.0, 4), (0.1, 10.0, 1), (0.0, 10.0, 1)])
def test_one_model_needs_rate_over_capacity_replicas_rounded_up(rate, capacity, expected):
    assert replicas_for_rate(H100, rate, capacity) == expected


def test_each_model_gets_replicas_for_its_own_share_of_the_traffic():
    # Shares 3:1; the smallest deployment (one replica each) saturates at 10/s in all, its
    # busy model's replica then carrying 7.5/s. At 40/s the busy model needs 30 / 7.5 = 4
    # replicas and the other ceil(10 / 7.5) = 2.
    d = Deployment("H100-SXM", 2, num_model_copies=2, traffic_shares=(3.0, 1.0))
    assert d.shares.tolist() == [0.75, 0.25]
    assert replicas_for_rate(d, 40.0, 10.0) == 6
    assert replicas_for_rate(d, 0.5, 10.0) == 2  # never fewer than one replica per model
    assert d.smallest == Deployment("H100-SXM", 2, num_replicas=2, num_model_copies=2,
                                    traffic_shares=(3.0, 1.0))


def test_shares_default_to_equal_and_all_zero_shares_count_as_equal():
    assert Deployment("H20", 1, num_model_copies=4).shares.tolist() == [0.25] * 4
    zero = Deployment("H20", 1, num_model_copies=2, traffic_shares=(0.0, 0.0))
    assert zero.shares.tolist() == [0.5, 0.5]


def test_a_router_pool_counts_in_the_gpus_and_the_cost():
    d = Deployment("H100-SXM", 2, num_replicas=3, num_router_replicas=1)
    assert d.num_gpus == 8
    space = SearchSpace((d,), 10.0, {"H100-SXM": 2.5}, rate_upper_bounds={d: 4.0},
                        max_num_replicas=64)
    # 10/s at a bound of 4/s per replica: at least 3 serving replicas, plus the router's one.
    assert min_cost_per_hour(space, d) == 2.5 * 2 * (3 + 1)


def test_the_cheapest_possible_cost_never_counts_more_replicas_than_allowed():
    space = SearchSpace((H100,), 100.0, {"H100-SXM": 2.0}, rate_upper_bounds={H100: 1.0},
                        max_num_replicas=8)
    assert min_cost_per_hour(space, H100) == 2.0 * 8


def _space(**fields) -> SearchSpace:
    return SearchSpace(**({"candidates": (H100,), "target_rate_per_s": 4.0,
                           "price_per_gpu_hour": {"H100-SXM": 2.0},
                           "rate_upper_bounds": {H100: 4.0}} | fields))


def test_a_seed_exactly_at_seeds_times_the_limit_does_not_stop_the_point():
    # Three seeds, limit 1 s: a first seed at 3 s with the others at 0 s gives a mean of
    # exactly 1 s, which meets the SLO. Only a seed above 3 s proves a miss.
    latencies = {0: 3.0, 1: 0.0, 2: 0.0}
    plan = search(_space(seeds=(0, 1, 2)), lambda d, rate, seed: {
        "e2e_p99_s": latencies[seed]}, SLO)
    first = plan.trials[0]
    assert first.num_seeds == 3 and first.mean["e2e_p99_s"] == 1.0 and first.meets_slo
    latencies[0] = math.nextafter(3.0, 4.0)
    plan = search(_space(seeds=(0, 1, 2)), lambda d, rate, seed: {
        "e2e_p99_s": latencies[seed]}, SLO)
    assert plan.trials[0].num_seeds == 1 and not plan.trials[0].meets_slo


def test_a_metric_a_seed_does_not_report_does_not_stop_the_point():
    # Seed 0 reports no e2e latency at all: that proves nothing about the mean.
    plan = search(_space(seeds=(0, 1)), lambda d, rate, seed: {"ttft_p99_s": 9.0} if seed == 0
                  else {"e2e_p99_s": 0.5, "ttft_p99_s": 9.0}, SLO)
    assert plan.trials[0].num_seeds == 2


def test_equal_cost_plans_rank_by_latency_then_by_the_order_given():
    a, b, c = Deployment("A", 1), Deployment("B", 1), Deployment("C", 1)
    latency = {"A": 0.6, "B": 0.5, "C": 0.5}

    def evaluate(d, rate, seed):
        return {"e2e_p99_s": latency[d.gpu] if rate / d.num_replicas <= 2.0 else 5.0}

    space = SearchSpace((a, c, b), 4.0, {"A": 1.0, "B": 1.0, "C": 1.0}, seeds=(0,),
                        rate_upper_bounds={a: 2.0, b: 2.0, c: 2.0}, exhaustive=True)
    plan = search(space, evaluate, SLO)
    assert [t.deployment.gpu for t in (plan.chosen, *plan.runner_ups)] == ["C", "B", "A"]


def test_the_pareto_front_keeps_equal_points_and_drops_a_point_beaten_on_one_axis():
    def trial(cost, latency):
        return Trial(H100, 1.0, {"e2e_p99_s": latency}, {}, {}, (), cost)

    a, a_again, same_cost_slower, same_latency_dearer = (
        trial(1, 2), trial(1, 2), trial(1, 3), trial(2, 2))
    front = pareto_front([same_cost_slower, a, same_latency_dearer, a_again])
    assert front == (a, a_again)


def test_the_plan_scales_down_below_the_estimate_when_fewer_replicas_verify():
    # One replica serves 2/s; at 8/s the estimate is 4 replicas, but replicas share bursts and
    # 3 meet the SLO at 8/s (not 2). The bound (3/s per replica) allows no fewer than 3.
    def evaluate(d, rate, seed):
        ok = rate <= 2.0 if d.num_replicas == 1 else rate / d.num_replicas <= 8 / 3
        return {"e2e_p99_s": 0.5 if ok else 5.0}

    plan = search(_space(target_rate_per_s=8.0, seeds=(0,), rate_upper_bounds={H100: 3.0},
                         rate_tolerance=0.001), evaluate, SLO)
    capacity = plan.capacities[H100]
    assert capacity == pytest.approx(2.0, rel=0.01)
    estimate = replicas_for_rate(H100, 8.0, capacity)
    assert estimate >= 4 and plan.chosen.deployment.num_replicas == 3
    tried = {t.deployment.num_replicas for t in plan.trials if t.rate_per_s == 8.0}
    assert tried == set(range(3, estimate + 1))  # down one at a time, never 2: the floor

    # The same with a bound of 1.5/s per replica: the floor is 6 and no fewer are tried.
    plan = search(_space(target_rate_per_s=8.0, seeds=(0,), rate_upper_bounds={H100: 1.5},
                         rate_tolerance=0.001), evaluate, SLO)
    assert {t.deployment.num_replicas for t in plan.trials if t.rate_per_s == 8.0} == {6}


def test_a_replica_count_past_the_estimate_is_tried_up_to_the_extra_allowed():
    # The estimate (4) and the next two miss; the third extra replica verifies.
    def evaluate(d, rate, seed):
        ok = rate <= 2.0 if d.num_replicas == 1 else d.num_replicas >= 7
        return {"e2e_p99_s": 0.5 if ok else 5.0}

    space = _space(target_rate_per_s=8.0, seeds=(0,), rate_upper_bounds={H100: 2.0})
    assert search(space, evaluate, SLO).chosen.deployment.num_replicas == 7
    plan = search(_space(target_rate_per_s=8.0, seeds=(0,), rate_upper_bounds={H100: 2.0},
                         max_extra_replicas=2), evaluate, SLO)
    assert not plan.is_feasible and "more than 64 replicas or never verifies" in plan.reason


def test_a_deployment_without_limits_carries_the_engines_defaults():
    from planner.scenario.deployment import EngineConfig

    engine = EngineConfig()
    assert (H100.max_num_seqs, H100.max_loras) == (engine.max_num_seqs, engine.max_loras)


def test_the_default_bisection_stops_once_the_bracket_is_within_five_percent():
    # Capacity 10/s exactly, bound 80/s: the bracket starts at [5, 80] and halves in log space,
    # so it stops with high / low in (sqrt(1.05), 1.05]: within the tolerance, not tighter.
    def evaluate(d, rate, seed):
        return {"e2e_p99_s": 0.5 if rate <= 10.0 else 5.0}

    plan = search(_space(target_rate_per_s=10.0, seeds=(0,), rate_upper_bounds={H100: 80.0}),
                  evaluate, SLO)
    assert SearchSpace((), 1.0, {}).rate_tolerance == 0.05
    capacity = plan.capacities[H100]
    above = min(t.rate_per_s for t in plan.trials
                if t.deployment.num_replicas == 1 and not t.meets_slo)
    assert capacity <= 10.0 < above
    assert math.sqrt(1.05) < above / capacity <= 1.05


def test_the_seed_that_proves_a_miss_stops_the_point_whichever_it_is():
    # Three seeds, limit 1 s: seeds 0 and 1 are fine, seed 2 alone at 4 s proves the mean
    # misses; a point whose second seed proves it stops after two seeds.
    latencies = {0: 0.5, 1: 4.0, 2: 0.5}
    plan = search(_space(seeds=(0, 1, 2)), lambda d, rate, seed: {
        "e2e_p99_s": latencies[seed]}, SLO)
    assert plan.trials[0].num_seeds == 2 and not plan.trials[0].meets_slo


def test_the_last_extra_replica_allowed_is_tried():
    # The estimate (4) and the next two miss; 7 = 4 + 3 verifies with exactly 3 extra allowed.
    def evaluate(d, rate, seed):
        ok = rate <= 2.0 if d.num_replicas == 1 else d.num_replicas >= 7
        return {"e2e_p99_s": 0.5 if ok else 5.0}

    plan = search(_space(target_rate_per_s=8.0, seeds=(0,), rate_upper_bounds={H100: 2.0},
                         max_extra_replicas=3), evaluate, SLO)
    assert plan.chosen.deployment.num_replicas == 7
