"""The host cost of a queue (`sim.cost.queue_cost`): priced only while requests wait, by named
terms that sum to the total."""

from sim.cost.coeffs import CostCoeffs
from sim.cost.queue_cost import has_queue_cost, predict_queue_cost

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
