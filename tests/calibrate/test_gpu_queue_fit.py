"""The queue terms' fit (`calibrate.gpu_queue_fit`): steps made from known terms give them
back, and the candidate that made them is the one chosen."""

import numpy as np
import pytest

from calibrate.gpu_queue_fit import fit_candidate, fit_queue_terms, with_queue_terms
from sim.cost.coeffs import CostCoeffs

TRUTH = {"waiting": (4e-3, 1.5e-6), "arrivals": (8e-3, 5e-4), "sequences": (2e-3, 5e-5)}


def synthetic_rows(candidate: str, seed: int = 0, noise: float = 0.005) -> list[dict]:
    """Steps of runs with and without a queue, measured = priced + the candidate's terms, times
    a log-normal noise of `noise`."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(300):
        waiting = float(rng.choice([0.0, rng.uniform(1, 25_000)]))
        row = dict(priced_step_ms=rng.uniform(15, 200), running=rng.uniform(10, 900),
                   waiting=waiting, arrivals=rng.uniform(0.1, 60))
        step_s, per_unit_s = TRUTH[candidate]
        unit = {"waiting": waiting, "arrivals": row["arrivals"],
                "sequences": row["running"]}[candidate]
        extra_ms = 1e3 * (step_s + per_unit_s * unit) if waiting > 0 else 0.0
        row["measured_interval_ms"] = ((row["priced_step_ms"] + extra_ms)
                                       * np.exp(rng.normal(0, noise)))
        rows.append(row)
    return rows


@pytest.mark.parametrize("candidate", sorted(TRUTH))
def test_round_trip_recovers_the_terms_and_chooses_their_candidate(candidate):
    rows = synthetic_rows(candidate)
    terms, summary = fit_candidate(rows, candidate)
    np.testing.assert_allclose(list(terms.values()), TRUTH[candidate], rtol=0.1)
    assert summary["rms_log_error"] < 0.01
    best, best_terms, _ = fit_queue_terms(rows)
    assert best == candidate and best_terms == terms


def test_without_noise_the_terms_are_exact():
    terms, summary = fit_candidate(synthetic_rows("sequences", noise=0.0), "sequences")
    np.testing.assert_allclose(list(terms.values()), TRUTH["sequences"], rtol=1e-9)
    assert summary["rms_log_error"] < 1e-9


def test_only_the_engine_terms_reach_the_coefficients():
    coeffs = with_queue_terms(CostCoeffs(), {"queue_step_overhead_s": 1e-3,
                                             "per_arrival_s": 2e-4})
    assert coeffs.queue_step_overhead_s == 1e-3 and coeffs.queue_per_sequence_s == 0.0
