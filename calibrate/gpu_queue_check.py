"""The queue terms' evidence and held-out check (`calibrate.gpu_queue_fit`), for
docs/gpu-errors.md F.

    python -m calibrate.gpu_queue_check                  # the candidates on the mixed steps
    python -m calibrate.gpu_queue_check --held-out 20    # and every 20th run replayed both ways

"Shipped" is the profile with its queue terms set to 0; "queue terms" the chosen candidate's
fitted values (what `python -m calibrate.gpu_fit` writes into the profile).
"""

from __future__ import annotations

import argparse

import numpy as np

from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
from calibrate.gpu_queue_fit import (
    CANDIDATES,
    band_table,
    fit_queue_terms,
    queue_rows,
    term_columns,
    with_queue_terms,
)
from calibrate.gpu_runs import load_serving_runs
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY
from calibrate.gpu_validate import METRICS, run_rows
from sim.cost.cost_model import CostCoeffs
from sim.cost.profile import load_profile


def held_out_table(shipped: CostCoeffs, fitted: CostCoeffs, every: int, window_s: float,
                   workers: int = 1) -> list[dict]:
    """Every `every`-th test-set run replayed (`calibrate.gpu_validate.run_rows`) with each
    coefficient set: median |error| and median signed error per metric, by whether the run
    saturated (TTFT of saturated runs is not scored, as in the validation)."""
    runs = load_serving_runs(DATA_DIR / RUNS_SUMMARY)[::every]
    out = []
    for label, coeffs in (("shipped", shipped), ("queue terms", fitted)):
        rows = run_rows(coeffs, runs, window_s, workers)
        for part, chosen in (("every run", rows),
                             ("unsaturated", [r for r in rows if not r["is_saturated"]]),
                             ("saturated", [r for r in rows if r["is_saturated"]])):
            out.append(dict(replay=label, runs=part, num_runs=len(chosen),
                            **{m: _medians(chosen, m) for m in METRICS}))
    return out


def _medians(rows: list[dict], metric: str) -> tuple[float, float] | None:
    """(median |error|, median error) of `metric` over `rows`, TTFT of saturated runs left out."""
    errors = [r["error"][metric] for r in rows if r["error"][metric] is not None
              and not (metric.startswith("ttft") and r["is_saturated"])]
    if not errors:
        return None
    return float(np.median(np.abs(errors))), float(np.median(errors))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", type=int, default=0, metavar="EVERY",
                        help="replay every EVERY-th test-set run with and without the terms")
    parser.add_argument("--window-s", type=float, default=180.0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    coeffs = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").coefficients
    shipped = coeffs.model_copy(update={k: 0.0 for k in CANDIDATES["waiting"]
                                        + CANDIDATES["sequences"]})
    rows = queue_rows(shipped)
    best, terms, summaries = fit_queue_terms(rows)
    for row in band_table(rows, summaries):
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    for name, summary in summaries.items():
        print(name, {k: v if k == "terms" else round(v, 4) if isinstance(v, float) else v
                     for k, v in summary.items()})
    print("chosen:", best, terms)
    held = queue_rows(shipped, held_out=True)
    for label, values in (("none", [0.0, 0.0]), (best, list(terms.values()))):
        priced = np.array([r["priced_step_ms"] for r in held]) / 1e3
        price = priced + term_columns(held, best) @ np.array(values)
        error = np.array([r["measured_interval_ms"] / 1e3 for r in held]) / price - 1
        queued = term_columns(held, best)[:, 0] > 0
        print(f"held-out steps ({len(held)} runs in the table, {int(queued.sum())} queued), "
              f"{label}: median |error| {np.median(np.abs(error)):.1%}, queued "
              f"{np.median(np.abs(error[queued])):.1%} (median {np.median(error[queued]):+.1%})")
    if args.held_out:
        for row in held_out_table(shipped, with_queue_terms(shipped, terms), args.held_out,
                                  args.window_s, args.workers):
            print(row, flush=True)


if __name__ == "__main__":
    main()
