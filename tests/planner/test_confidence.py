"""Plans at a confidence level: the search checks each SLO at the upper end of the interval
(seeds' spread x the profile's measured error), never at less than the point estimate."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from planner.predict.intervals import ProfileErrors, slo_values
from planner.scenario.schema import SloConfig
from planner.search.slo_search import Deployment, SearchSpace, search

PRICES = {"H100-SXM": 2.0, "H20": 1.0}


def evaluate_for(service_rate: dict[str, float], noise: float):
    """An M/M/1-like replica: 0.5 s at no load, blowing up at its service rate; seeds differ
    by `noise` (relative)."""
    def evaluate(d: Deployment, rate: float, seed: int):
        rho = rate / (service_rate[d.gpu] * d.num_replicas)
        latency = math.inf if rho >= 1 else 0.5 / (1 - rho)
        return {"e2e_p99_s": latency * (1 + noise * seed), "output_tokens_per_s": 10 * rate}
    return evaluate


@settings(max_examples=40, deadline=None)
@given(h100=st.floats(2.0, 50.0), h20=st.floats(1.0, 20.0), target=st.floats(0.5, 60.0),
       noise=st.floats(0.0, 0.3),
       errors=st.lists(st.floats(-0.6, 0.6), min_size=1, max_size=6))
# Confidence moved this plan from 19 x H20 (19 $/h) to 11 x H100 (22 $/h): fewer GPUs, dearer.
@example(h100=2.0, h20=1.0, target=8.0, noise=0.25, errors=[0.0])
def test_a_confidence_never_plans_cheaper_nor_fewer_replicas_of_a_gpu(h100, h20, target, noise,
                                                                      errors):
    evaluate = evaluate_for({"H100-SXM": h100, "H20": h20}, noise)
    candidates = (Deployment("H100-SXM", 1), Deployment("H20", 1))
    space = SearchSpace(candidates, target_rate_per_s=target, price_per_gpu_hour=PRICES,
                        seeds=(0, 1), max_num_replicas=200, rate_tolerance=0.02)
    measured = ProfileErrors("p", {"e2e_p99_s": tuple(errors)})
    sure = replace(space, slo_values=lambda d, mean, low, high: slo_values(
        mean, low, high, measured, 0.9))
    slo = SloConfig(e2e_p99_s=1.0)
    point, confident = search(space, evaluate, slo), search(sure, evaluate, slo)
    if confident.is_feasible:
        # A stricter check can move the plan to a faster, dearer GPU with fewer GPUs in all;
        # it can never find a cheaper plan, nor fewer replicas of the same GPU.
        assert point.is_feasible
        assert confident.chosen.cost_per_hour_usd >= point.chosen.cost_per_hour_usd
        sure_d, point_d = confident.chosen.deployment, point.chosen.deployment
        if sure_d.gpu == point_d.gpu:
            assert sure_d.num_replicas >= point_d.num_replicas


def test_a_measured_under_prediction_costs_replicas():
    # The engine took 2x the predicted latency on every validated workload. A replica's
    # predicted p99 is 0.5 / (1 - rho) with rho its load over 20 req/s; the SLO is 2 s.
    # Point estimate: rho <= 0.75 -> 15 req/s a replica -> 3 replicas for 40 req/s.
    # At 0.9: 2 x 0.5 / (1 - rho) <= 2 -> rho <= 0.5 -> 10 req/s a replica -> 4 replicas.
    evaluate = evaluate_for({"H100-SXM": 20.0}, 0.0)
    space = SearchSpace((Deployment("H100-SXM", 1),), target_rate_per_s=40.0,
                        price_per_gpu_hour=PRICES, rate_tolerance=0.01, seeds=(0,))
    measured = ProfileErrors("p", {"e2e_p99_s": (-0.5, -0.5)})
    sure = replace(space, slo_values=lambda d, mean, low, high: slo_values(
        mean, low, high, measured, 0.9))
    slo = SloConfig(e2e_p99_s=2.0)
    assert search(space, evaluate, slo).chosen.deployment.num_replicas == 3
    assert search(sure, evaluate, slo).chosen.deployment.num_replicas == 4


CPU_SCENARIO = """
name: cpu_confidence
model: vllm-tiny-llama
hardware: {gpu: cpu}
engine: {max_num_seqs: 8, max_num_batched_tokens: 512, block_size: 32, max_loras: 2,
         max_cpu_loras: 4, max_lora_rank: 8, kv_cache_memory_bytes: 16777216}
strategies:
  - kind: multi_lora
    adapters: [{name: a0, rank: 8, target_modules: [q_proj, v_proj]}]
workload: {kind: punica, num_requests: 60, num_adapters: 1, max_prompt_tokens: 64,
           num_output_tokens: 8, arrival_rate_per_s: 4.0}
slo: {e2e_p99_s: 60.0}
search: {num_seeds: 2, max_turns_per_evaluation: 60, confidence: 0.9}
"""


def test_a_plan_at_a_confidence_says_what_it_costs_over_the_point_estimate():
    from planner.jobs.strategy_points import plan_record
    from planner.scenario.loading import scenario_from_text
    from planner.search.strategy_plan import plan_strategy

    plan, dropped = plan_strategy(scenario_from_text(CPU_SCENARIO, "cpu.yaml"), 0)
    chosen = plan_record("multi_lora", plan, dropped)["chosen"]
    # The shipped CPU profile's measured errors widen the check; this SLO is far away, so the
    # confidence costs nothing here, and the record says so.
    assert chosen["point_estimate_num_gpus"] == chosen["num_gpus"] == 1
    assert chosen["confidence_extra_gpus"] == 0
