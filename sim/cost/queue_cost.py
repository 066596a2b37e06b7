"""Host cost of a step scheduled while requests wait: the price a step's batch alone does not
see (docs/gpu-errors.md F).

Steps of vLLM 0.8.5 V1 serving runs that hold a queue take longer than their composition
prices, and the excess follows the sequences the step runs, not the batch's tokens, the
waiting requests or the arrival rate; steps of the same size with nothing waiting are priced
right. vLLM V1 runs its scheduler, the model's step and the output handling one after the
other in the engine core's busy loop, so this host time adds to the step's wall time; it does
not overlap the GPU's work. `predict_queue_cost(coeffs, num_waiting, num_seqs)` is pure: the
engine's step loop passes the requests left waiting when the step is scheduled and the
sequences it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.cost.coeffs import CostCoeffs


@dataclass(frozen=True)
class QueueCost:
    """Seconds a queue adds to one step, by term (they sum to `total_s`)."""

    step_s: float
    """`queue_step_overhead_s`, paid once by a step scheduled while any request waits."""
    waiting_s: float
    """`queue_per_waiting_s` times the waiting requests."""
    sequence_s: float
    """`queue_per_sequence_s` times the step's sequences, while any request waits."""

    @property
    def total_s(self) -> float:
        """Seconds added to the step's wall time."""
        return self.step_s + self.waiting_s + self.sequence_s


NO_QUEUE_COST = QueueCost(0.0, 0.0, 0.0)


def has_queue_cost(coeffs: CostCoeffs) -> bool:
    """Whether any queue term is non-zero (a step's price then depends on the queue)."""
    return bool(coeffs.queue_step_overhead_s or coeffs.queue_per_waiting_s
                or coeffs.queue_per_sequence_s)


def predict_queue_cost(coeffs: CostCoeffs, num_waiting: int, num_seqs: int) -> QueueCost:
    """Host seconds a step of `num_seqs` sequences pays when `num_waiting` requests are left
    waiting as it is scheduled; nothing when none waits."""
    if num_waiting <= 0:
        return NO_QUEUE_COST
    return QueueCost(step_s=coeffs.queue_step_overhead_s,
                     waiting_s=coeffs.queue_per_waiting_s * num_waiting,
                     sequence_s=coeffs.queue_per_sequence_s * num_seqs)
