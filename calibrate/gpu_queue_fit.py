"""The host cost of a step scheduled while requests wait (`sim.cost.queue_cost`), fitted on the
steps of serving runs the validation never scores (`python -m calibrate.gpu_queue_check`
prints the comparison and replays held-out runs with and without the terms;
`calibrate.gpu_fit` puts the chosen terms into the shipped profile).

A step of a vLLM 0.8.5 V1 run that holds a queue takes longer than its composition prices
(docs/gpu-errors.md F). Each run's mean step comes from vLLM's counters and the client's
throughput (`calibrate.gpu_work_fit.mixed_step_rows`: the running decodes plus the prompts
admitted per token interval, priced with no replay; the token interval is the measured step).
Three candidates for what the excess follows, each a fixed cost per step while any request
waits plus one more term, fitted by non-negative least squares on the relative excess:
the waiting requests (a walk of the queue), the requests arrived since the last step (the
engine core's input thread decoding arrivals at the offered rate), or the sequences the step
runs while requests wait. The candidate with the lowest RMS log error on the fit rows is
chosen. Fit rows: the test-set runs outside the validation's table (every 4th from the
first), with or without a queue (those without one hold the terms at their price).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from calibrate.gpu_runs import load_serving_runs
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY
from calibrate.gpu_work_fit import (
    ENGINE_METRICS,
    HELD_OUT_EVERY,
    load_engine_metrics,
    mixed_step_rows,
)
from sim.cost.cost_model import CostCoeffs

CANDIDATES = {
    "waiting": ("queue_step_overhead_s", "queue_per_waiting_s"),
    "arrivals": ("queue_step_overhead_s", "per_arrival_s"),
    "sequences": ("queue_step_overhead_s", "queue_per_sequence_s"),
}
"""Candidate -> its terms' names (`per_arrival_s` has no engine term: it is compared only)."""
FIT_RULE = ("the candidate of least RMS log error (per waiting request, per arrival, per "
            "sequence of the step while requests wait) fitted on the mean measured steps of "
            "the ml_modelling/test_dataset runs with engine counters outside the validation's "
            f"table (index % {HELD_OUT_EVERY} != 0; engine_metrics.csv)")


def queue_rows(coeffs: CostCoeffs, root: Path = DATA_DIR, held_out: bool = False) -> list[dict]:
    """`mixed_step_rows` with the run's median waiting requests, its arrivals per step (offered
    rate x token interval) and whether it is in the validation's table; only the rows outside
    the table unless `held_out`."""
    metrics = load_engine_metrics(root / ENGINE_METRICS)
    runs = load_serving_runs(root / RUNS_SUMMARY)
    held = {r.run_id for r in runs[::HELD_OUT_EVERY]}
    offered = {r.run_id: sum(r.adapter_rates) for r in runs}
    rows = []
    for row in mixed_step_rows(coeffs, root):
        if (row["run_id"] in held) != held_out:
            continue
        rows.append(dict(row, waiting=metrics[row["run_id"]]["waiting_median"],
                         arrivals=offered[row["run_id"]] * row["measured_interval_ms"] / 1e3))
    return rows


def term_columns(rows: list[dict], candidate: str) -> np.ndarray:
    """[rows, 2]: each term's multiplier in seconds' units of `candidate` (1 per step while
    requests wait; then the waiting requests, arrivals or sequences, times the same flag)."""
    waits = np.array([r["waiting"] > 0 for r in rows], dtype=float)
    other = {"waiting": "waiting", "arrivals": "arrivals", "sequences": "running"}[candidate]
    values = np.array([r[other] for r in rows], dtype=float)
    return np.column_stack([waits, waits * values])


def fit_candidate(rows: list[dict], candidate: str) -> tuple[dict[str, float], dict]:
    """(terms in seconds, summary) of `candidate` fitted to `rows`: non-negative least squares
    of the measured step's excess over its price, each row relative to its price."""
    priced = np.array([r["priced_step_ms"] for r in rows]) / 1e3
    measured = np.array([r["measured_interval_ms"] for r in rows]) / 1e3
    cols = term_columns(rows, candidate)
    values, _ = nnls(cols / priced[:, None], measured / priced - 1)
    log_error = np.log(measured / (priced + cols @ values))
    waits = cols[:, 0] > 0
    summary = dict(num_rows=len(rows), num_queued=int(waits.sum()),
                   rms_log_error=float(np.sqrt(np.mean(log_error**2))),
                   median_abs_error=float(np.median(np.abs(np.expm1(log_error)))),
                   median_abs_error_queued=float(np.median(np.abs(np.expm1(
                       log_error[waits])))) if waits.any() else None)
    return dict(zip(CANDIDATES[candidate], map(float, values), strict=True)), summary


def fit_queue_terms(rows: list[dict]) -> tuple[str, dict[str, float], dict[str, dict]]:
    """(chosen candidate, its terms, every candidate's summary): the lowest RMS log error."""
    fits = {name: fit_candidate(rows, name) for name in CANDIDATES}
    best = min(fits, key=lambda name: fits[name][1]["rms_log_error"])
    return best, fits[best][0], {name: dict(terms=t, **s) for name, (t, s) in fits.items()}


WAITING_BANDS = (0, 1, 1000, 5000, 15000, 22000, 10**9)
"""Bands of the runs' median waiting requests (docs/gpu-errors.md F's)."""


def band_table(rows: list[dict], fits: dict[str, dict]) -> list[dict]:
    """Median measured / priced step per model and band of waiting requests, with no queue
    terms and with each candidate's fitted terms."""
    out = []
    priced = np.array([r["priced_step_ms"] for r in rows]) / 1e3
    measured = np.array([r["measured_interval_ms"] for r in rows]) / 1e3
    with_terms = {name: priced + term_columns(rows, name) @ np.array(list(fit["terms"].values()))
                  for name, fit in fits.items()}
    waiting = np.array([r["waiting"] for r in rows])
    for model in sorted({r["model"] for r in rows}):
        is_model = np.array([r["model"] == model for r in rows])
        for lo, hi in zip(WAITING_BANDS, WAITING_BANDS[1:], strict=False):
            part = is_model & (waiting >= lo) & (waiting < hi)
            if part.any():
                out.append(dict(model=model, waiting_band=f"{lo}-{hi}", num_runs=int(part.sum()),
                                none=float(np.median(measured[part] / priced[part])),
                                **{name: float(np.median(measured[part] / price[part]))
                                   for name, price in with_terms.items()}))
    return out


def with_queue_terms(coeffs: CostCoeffs, terms: dict[str, float]) -> CostCoeffs:
    """`coeffs` with the engine's queue terms of `terms` set (others of `terms` ignored)."""
    return coeffs.model_copy(update={k: v for k, v in terms.items() if k in
                                     CostCoeffs.model_fields})
