"""The host cost of a queue (`sim.cost.queue_cost`) and its place in the engine's step loop:
priced only while requests wait, by named terms that sum to the total, added to the step's wall
time, and the same in the fast path as in the step-by-step reference, bit for bit."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.cost.coeffs import CostCoeffs
from sim.cost.queue_cost import has_queue_cost, predict_queue_cost
from sim.simulate import simulate
from sim.workload.generate import punica_workload

QUEUE = dict(queue_step_overhead_s=1e-3, queue_per_waiting_s=2e-6, queue_per_sequence_s=5e-5)


def test_terms_are_hand_computed_and_sum_to_the_total():
    cost = predict_queue_cost(CostCoeffs(**QUEUE), num_waiting=30, num_seqs=8)
    assert (cost.step_s, cost.waiting_s, cost.sequence_s) == (1e-3, 2e-6 * 30, 5e-5 * 8)
    assert cost.total_s == 1e-3 + 2e-6 * 30 + 5e-5 * 8


def test_nothing_without_a_queue_or_at_the_default():
    assert predict_queue_cost(CostCoeffs(**QUEUE), num_waiting=0, num_seqs=8).total_s == 0.0
    assert predict_queue_cost(CostCoeffs(), num_waiting=500, num_seqs=8).total_s == 0.0
    assert not has_queue_cost(CostCoeffs())
    assert all(has_queue_cost(CostCoeffs(**{k: v})) for k, v in QUEUE.items())


SATURATED = dict(rate_per_s=1e6, max_num_seqs=4, num_adapters=4)
"""All 40 requests arrive at once and wait behind four sequences: pure-decode steps while
requests wait."""
SLOTS = dict(rate_per_s=10.0, max_num_seqs=8, num_adapters=6, max_loras=2)
"""Requests arrive during decode runs with nothing waiting; one whose adapter has no slot
cannot start before the run ends, yet from its arrival each step pays the queue."""


def simulated(mode: str, case: dict, **coeffs):
    """40 requests of 30 output tokens over the case's adapters, under `coeffs`."""
    engine = {k: v for k, v in case.items() if k != "rate_per_s"}
    config = small_config("multi_lora", mode=mode, **engine)
    config = config.model_copy(update={"coeffs": config.coeffs.model_copy(update=coeffs)})
    workload = punica_workload(np.random.default_rng(0), num_requests=40,
                               num_adapters=case["num_adapters"], num_output_tokens=30,
                               arrival_rate_per_s=case["rate_per_s"])
    return simulate(config, workload)


@pytest.mark.parametrize("case", (SATURATED, SLOTS), ids=("saturated", "slots"))
def test_fast_path_prices_the_queue_as_the_reference_bit_for_bit(case):
    ref = simulated("reference", case, **QUEUE)
    fast = simulated("fast", case, **QUEUE)
    for col in ("first_scheduled_s", "first_token_s", "finish_s", "busy_prefill_s",
                "busy_decode_s"):
        np.testing.assert_array_equal(fast.requests[col], ref.requests[col], err_msg=col)
    plain = simulated("fast", case)
    assert (fast.requests["finish_s"] > plain.requests["finish_s"]).any()
    assert fast.stats["num_engine_events"] < ref.stats["num_engine_events"]


def test_the_queue_adds_its_price_to_each_step_while_requests_wait():
    plain = simulated("reference", SATURATED)
    queued = simulated("reference", SATURATED, queue_per_sequence_s=1e-3)
    # The last four requests start when nothing is left waiting: their steps are the same,
    # shifted by what the queue added before them; every earlier step paid 4 x 1 ms.
    shift = queued.requests["first_token_s"].to_numpy() - plain.requests["first_token_s"]
    finish = queued.requests["finish_s"].to_numpy() - plain.requests["finish_s"]
    last = np.argsort(plain.requests["first_token_s"].to_numpy())[-4:]
    np.testing.assert_allclose(finish[last] - shift[last], 0.0, atol=1e-9)
    assert shift[last].min() > 0.1  # 9 waves of about 31 steps at 4 ms each before them
