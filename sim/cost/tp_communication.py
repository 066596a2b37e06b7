"""Tensor-parallel communication of one step: two all-reduces per layer of the step's activations
(after attention's output projection and after the MLP's down projection), each priced by a
fitted all-reduce time of the TP degree, or by the ring formula where no fit covers it.

A fitted entry is `latency_s + num_bytes / bandwidth_bytes_per_s`, one per TP degree and
interconnect: measured all-reduce times (vidur's NCCL profiles on DGX A100 and H100) do not
follow the ring formula's (tp - 1) / tp across degrees (small messages take 7-11 us on two
H100s and 30-40 us on four or eight), so each degree carries its own latency and bandwidth.
Either price gains a latency per GPU in the all-reduce (`latency_per_gpu_s` x TP): a serving
engine's all-reduce waits for its slowest rank, which kernels timed alone after a barrier miss.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

ACTIVATION_DTYPE_BYTES = 2
"""bf16/fp16 activations, the all-reduced tensors."""
ALL_REDUCES_PER_LAYER = 2


class AllReduceFit(BaseModel):
    """Fitted time of one all-reduce over `tensor_parallel_size` GPUs of one interconnect."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    tensor_parallel_size: int = Field(ge=2)
    """GPUs in the all-reduce (the engine's TP degree)."""
    interconnect: Literal["nvlink", "pcie"]
    """The link the GPUs reduce over."""
    latency_s: float = Field(ge=0, le=1)
    """Fixed time of one all-reduce, whatever its size."""
    bandwidth_bytes_per_s: float = Field(gt=0)
    """Message bytes reduced per second (algorithm bandwidth: the message size, not the bytes
    on the links, over the time above the latency)."""
    source: str = Field(min_length=1)
    """Measurements it was fitted on (dataset, commit, rows)."""


def all_reduce_s(fit: AllReduceFit, num_bytes):
    """Seconds of all-reduces of `num_bytes` each (scalar or array) under `fit`."""
    return fit.latency_s + np.asarray(num_bytes, dtype=float) / fit.bandwidth_bytes_per_s


def find_all_reduce_fit(fits: tuple[AllReduceFit, ...], tp: int,
                        interconnect: str) -> AllReduceFit | None:
    """The fit of TP degree `tp` over `interconnect` among `fits`, None if there is none."""
    for fit in fits:
        if fit.tensor_parallel_size == tp and fit.interconnect == interconnect:
            return fit
    return None


def ring_all_reduce_s(tp: int, num_bytes, link_bytes_per_s: float, efficiency: float,
                      latency_s: float):
    """Seconds of ring all-reduces of `num_bytes` each over `tp` GPUs whose link moves
    `link_bytes_per_s` at `efficiency` of it, plus a fixed `latency_s` each."""
    moved = 2 * (tp - 1) / tp * np.asarray(num_bytes, dtype=float)
    return moved / (link_bytes_per_s * efficiency) + latency_s


def tensor_parallel_communication_s(*, tp: int, hidden_size: int, tokens_per_layer: np.ndarray,
                                    fit: AllReduceFit | None, link_bytes_per_s: float,
                                    efficiency: float, latency_s: float,
                                    latency_per_gpu_s: float = 0.0) -> float:
    """Seconds of a step's TP all-reduces: per layer that computes tokens, two all-reduces of
    (its tokens x `hidden_size` x 2 bytes), priced by `fit` when given, else by the ring formula
    with `efficiency` and `latency_s`, each plus `latency_per_gpu_s` x `tp` (waiting on the
    slowest rank). Zero at TP 1."""
    if tp == 1:
        return 0.0
    tokens = np.asarray(tokens_per_layer, dtype=float)
    num_bytes = tokens * hidden_size * ACTIVATION_DTYPE_BYTES
    if fit is None:
        per_reduce = ring_all_reduce_s(tp, num_bytes, link_bytes_per_s, efficiency, latency_s)
    else:
        per_reduce = all_reduce_s(fit, num_bytes)
    # Adding 0.0 leaves every price bit for bit as without the term.
    per_reduce = per_reduce + latency_per_gpu_s * tp
    return float((ALL_REDUCES_PER_LAYER * per_reduce * (tokens > 0)).sum())
