"""Fit one all-reduce time per TP degree (`sim.cost.tp_communication.AllReduceFit`: a latency
plus the message bytes over a bandwidth) on vidur's NCCL all-reduce times of one DGX node.

vidur times the NCCL kernels alone (kineto, `nccl` kernels, after a barrier) for 2, 4 and 8
GPUs of one node at 994 message sizes from 2 KB to 64 MB (its `size` column is bytes: the
profiler allocates `size / 2` fp16 elements). Every row weighs alike, as in the ring fit of
`calibrate.gpu_vidur_fit.fit_communication`. Each degree is fitted on its own rows, so no
degree is held out here; the held-out check is Splitwise's whole steps
(`calibrate.gpu_splitwise`), which the fit never saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from calibrate.fitter import error_row
from sim.cost.tp_communication import AllReduceFit, all_reduce_s

LATENCY_BOUNDS_S = (0.0, 1e-3)
BANDWIDTH_BOUNDS_BYTES_PER_S = (1e9, 1e13)


@dataclass(frozen=True)
class AllReduceTableFit:
    """One fit per TP degree of one network profile, and their error rows."""

    fits: tuple[AllReduceFit, ...]
    errors: list[dict]
    num_rows: int


def _fit_one(sizes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(latency_s, bandwidth_bytes_per_s) minimising the log ratio of predicted to measured."""
    scale = np.array([1e-5, 1e11])

    def residuals(x):
        latency, bandwidth = x * scale
        return np.log((latency + sizes / bandwidth) / seconds)

    lo = np.array([LATENCY_BOUNDS_S[0], BANDWIDTH_BOUNDS_BYTES_PER_S[0]]) / scale
    hi = np.array([LATENCY_BOUNDS_S[1], BANDWIDTH_BOUNDS_BYTES_PER_S[1]]) / scale
    sol = least_squares(residuals, [3.0, 2.0], bounds=(lo, hi))
    latency, bandwidth = sol.x * scale
    return float(latency), float(bandwidth)


def fit_all_reduce_table(rows: list, network: str, interconnect: str,
                         source: str) -> AllReduceTableFit:
    """An `AllReduceFit` per worker count among `rows` (vidur all-reduce records of one node
    of `network`), recorded as fitted on `source`; error rows per degree ("train")."""
    if not rows:
        raise ValueError(f"no one-node all-reduce rows of {network} to fit")
    fits, errors = [], []
    for n in sorted({r.num_workers for r in rows}):
        part = [r for r in rows if r.num_workers == n]
        sizes = np.array([r.size for r in part], dtype=float)
        measured = np.array([r.median_ms / 1e3 for r in part])
        latency, bandwidth = _fit_one(sizes, measured)
        fit = AllReduceFit(
            tensor_parallel_size=n, interconnect=interconnect, latency_s=latency,
            bandwidth_bytes_per_s=bandwidth,
            source=f"{source}: {network} all_reduce, {n} GPUs of one node, {len(part)} rows")
        fits.append(fit)
        errors.append(error_row("train", f"vidur_all_reduce_by_tp:{network}:tp{n}", measured,
                                np.asarray(all_reduce_s(fit, sizes))))
    return AllReduceTableFit(tuple(fits), errors, len(rows))
