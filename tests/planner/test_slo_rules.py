"""SLO predicates at their edges: a run that measured nothing never meets an SLO, and a value
exactly at its limit meets it (each rule was left unguarded by the search tests)."""

from __future__ import annotations

import math

import pytest

from planner.search.slo import Slo, slo_violations
from planner.search.slo_search import Deployment, SearchSpace, search
from sim.metrics import summarize

SLO = Slo(ttft_p99_s=1.0, tpot_p99_s=0.05)


def test_an_empty_run_meets_no_slo():
    import pandas as pd

    empty = summarize(pd.DataFrame(), pd.DataFrame())
    assert empty == {"num_turns": 0}  # what the simulator reports for a run with no turns
    assert slo_violations(SLO, empty) == ["ttft_p99_s=nan > 1", "tpot_p99_s=nan > 0.05"]


@pytest.mark.parametrize("metric", ["ttft_p99_s", "tpot_p99_s"])
def test_a_nan_metric_misses_its_slo(metric):
    metrics = {"ttft_p99_s": 0.5, "tpot_p99_s": 0.01, metric: math.nan}
    assert slo_violations(SLO, metrics) == [f"{metric}=nan > {SLO.model_dump()[metric]:.4g}"]


def test_a_value_at_its_limit_meets_it_and_just_above_misses():
    assert slo_violations(SLO, {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05}) == []
    above = math.nextafter(1.0, 2.0)
    assert slo_violations(SLO, {"ttft_p99_s": above, "tpot_p99_s": 0.05}) == [
        f"ttft_p99_s={above:.4g} > 1"]


def _plan(evaluate):
    space = SearchSpace((Deployment("H100-SXM", 1),), target_rate_per_s=4.0,
                        price_per_gpu_hour={"H100-SXM": 2.0}, seeds=(0,),
                        rate_upper_bounds={Deployment("H100-SXM", 1): 4.0})
    return search(space, evaluate, SLO)


def test_the_search_never_plans_on_a_run_that_measured_nothing():
    plan = _plan(lambda d, rate, seed: {"num_turns": 0})
    assert not plan.is_feasible and plan.chosen is None


def test_the_search_accepts_a_deployment_exactly_at_the_limit():
    # One replica serves 1 request/s with TTFT p99 exactly at the limit (above it beyond);
    # four replicas share 4 requests/s the same way: the plan is four replicas.
    def evaluate(d, rate, seed):
        per_replica = rate / d.num_replicas
        return {"ttft_p99_s": 1.0 if per_replica <= 1.0 else 2.0, "tpot_p99_s": 0.01,
                "e2e_p99_s": 1.0}

    plan = _plan(evaluate)
    assert plan.is_feasible and plan.chosen.deployment.num_replicas == 4
