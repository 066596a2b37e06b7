"""Simulation in the loop: fit cost coefficients to run-level metrics (throughput, TPOT) of
serving runs by replaying each run through the simulator at trial coefficients.

    python -m calibrate.gpu_run_fit [--every 15] [--window-s 90]

Some data gives only run-level metrics: the measured throughput and TPOT of a run at known
rates and engine limits. `fit_runs` treats chosen coefficients as unknowns and minimises, with
scipy's `least_squares`, the log ratios of simulated to measured metrics over a small set of
runs (`calibrate.gpu_runs.predict_run` replays each). The unknowns are fitted as log factors
on a starting profile, so coefficients of different scales share one step size; the
finite-difference step is a few percent because a simulated metric is a count or a quantile
of discrete events, flat under tiny changes.

The runs the fit may see are agullo-dt's `motivation_figure/with_slots` group; the held-out
validation (`calibrate.gpu_validate`) replays `ml_modelling/test_dataset`, which this fit never
reads. Throughput is a residual only where the run was overloaded (measured below 95% of the
offered rate): elsewhere it is the offered rate, which any coefficients match.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from calibrate.gpu_runs import MODELS, ServingRun, load_serving_runs, predict_run
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY
from sim.cost.cost_model import CostCoeffs

FIT_GROUP = "motivation_figure/with_slots"
"""Serving runs the run-level fit may see (disjoint from the validation's test set)."""
UNKNOWNS = ("memory_bandwidth_efficiency", "lora_working_program_s")
"""Default unknowns: the base decode's bandwidth and the per-token LoRA kernel cost, the two
terms the run-level TPOT and capacity move most."""
MAX_FACTOR = 10.0
"""Each unknown stays within this factor of its starting value."""


@dataclass(frozen=True)
class RunFit:
    """Fitted values of the unknowns and how the fit went."""

    names: tuple[str, ...]
    values: tuple[float, ...]
    start: tuple[float, ...]
    rms_log_error: float
    """Root mean square of the final log(simulated / measured) residuals."""
    num_simulations: int


def run_targets(run: ServingRun, measured: dict[str, float]) -> dict[str, float]:
    """The metrics a run is fitted on: TPOT p50 always, throughput where it was overloaded."""
    targets = {"tpot_p50_s": measured["tpot_p50_s"]}
    if measured["throughput_rps"] < 0.95 * sum(run.adapter_rates):
        targets["throughput_rps"] = measured["throughput_rps"]
    return targets


def _residuals(log_factors, names, start: CostCoeffs, runs, measured, window_s, warmup_s,
               counter) -> np.ndarray:
    values = {n: getattr(start, n) * float(np.exp(f)) for n, f in zip(names, log_factors,
                                                                       strict=True)}
    coeffs = start.model_copy(update=values)
    out = []
    for run, meas in zip(runs, measured, strict=True):
        predicted = predict_run(run, coeffs, window_s=window_s, warmup_s=warmup_s)
        counter[0] += 1
        out += [np.log(predicted[m] / v) for m, v in run_targets(run, meas).items()]
    return np.asarray(out)


def fit_runs(runs: Sequence[ServingRun], measured: Sequence[dict[str, float]],
             start: CostCoeffs, names: Sequence[str] = UNKNOWNS, *, window_s: float = 90.0,
             warmup_s: float = 30.0, max_nfev: int = 20) -> RunFit:
    """Least-squares fit of `names` (log factors on `start`) to the runs' measured metrics."""
    unknown = [n for n in names if n not in CostCoeffs.model_fields]
    if unknown:
        raise ValueError(f"unknowns {unknown}: not cost coefficients; allowed: "
                         f"{', '.join(CostCoeffs.model_fields)}")
    zero = [n for n in names if not getattr(start, n) > 0]
    if zero:
        raise ValueError(f"unknowns {zero}: starting value must be > 0 (fitted as factors)")
    counter = [0]
    bound = np.log(MAX_FACTOR)
    result = least_squares(
        _residuals, np.zeros(len(names)), bounds=(-bound, bound), diff_step=0.05,
        max_nfev=max_nfev, x_scale=1.0,
        args=(tuple(names), start, list(runs), list(measured), window_s, warmup_s, counter))
    values = tuple(getattr(start, n) * float(np.exp(f)) for n, f in zip(names, result.x,
                                                                       strict=True))
    return RunFit(tuple(names), values, tuple(getattr(start, n) for n in names),
                  float(np.sqrt(np.mean(result.fun**2))), counter[0])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=15)
    parser.add_argument("--window-s", type=float, default=90.0)
    args = parser.parse_args(argv)
    from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
    from sim.cost.profile import load_profile

    start = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").coefficients
    runs = load_serving_runs(DATA_DIR / RUNS_SUMMARY, group=FIT_GROUP)[::args.every]
    if not runs:
        raise SystemExit(f"{FIT_GROUP}: no run of a catalogued model ({', '.join(MODELS)}); "
                         "its runs serve Llama-2-7B, which the catalogue lacks")
    fit = fit_runs(runs, [r.measured for r in runs], start, window_s=args.window_s,
                   warmup_s=args.window_s / 3)
    print(f"{len(runs)} runs of {FIT_GROUP}, {fit.num_simulations} simulations, "
          f"rms log error {fit.rms_log_error:.3f}")
    for name, s, v in zip(fit.names, fit.start, fit.values, strict=True):
        print(f"  {name}: {s:.4g} -> {v:.4g}")


if __name__ == "__main__":
    main()
