"""The run-fitted H100-64GB profile: the step-fitted profile (`calibrate.gpu_fit`) with the
unknowns of the run-level fit (`calibrate.gpu_run_fit`) set to their fitted values, a record of
what that fit saw (`fit.run_fit`), and the profiles derived from it rewritten.

    python -m calibrate.gpu_run_profile [--stride 60] [--window-s 90] [--workers 2]

The start is always the step fit: a profile already run-fitted has its record's `start`
values put back first, so the command gives the same profile when run again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from pathlib import Path

from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
from calibrate.gpu_run_fit import (
    FIT_GROUP,
    FIT_OFFSET,
    FIT_STRIDE,
    TARGETS,
    UNKNOWNS,
    WARMUP_S,
    WINDOW_S,
    RunFit,
    code_commit,
    fit_rule,
    fit_runs,
    fit_slice,
)
from calibrate.gpu_runs import load_serving_runs
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY
from sim.cost.cost_model import CostCoeffs
from sim.cost.profile import CalibrationProfile, RunFitRecord, load_profile

DATASET = "agullo-dt@bae36e2d"


def step_fitted(profile: CalibrationProfile) -> CostCoeffs:
    """The profile's coefficients as the step fit left them (its run fit undone)."""
    record = profile.fit.run_fit
    if record is None:
        return profile.coefficients
    return profile.coefficients.model_copy(update=record.start)


def step_errors(coeffs: CostCoeffs, root: Path = DATA_DIR) -> list[dict]:
    """The step fit's error rows (train and held-out steps) at `coeffs`."""
    from calibrate.gpu_fit import error_rows, group_profiles, split_samples
    from calibrate.gpu_samples import load_agullo_samples
    from sim.hardware.catalogue import get_gpu

    train, test = split_samples(load_agullo_samples(root))
    profiles = group_profiles({s.group for s in train + test}, get_gpu("H100-64GB"))
    return error_rows(coeffs, train, "train", profiles) + error_rows(coeffs, test, "test",
                                                                      profiles)


def run_fitted_profile(source: CalibrationProfile, fit: RunFit, record: RunFitRecord,
                       command: str, root: Path = DATA_DIR) -> CalibrationProfile:
    """`source` (step-fitted) with the fitted unknowns, its step errors re-scored at them,
    and the record of the run fit."""
    from sim.cost.profile import FitErrorRow

    values = dict(zip(fit.names, fit.values, strict=True))
    coeffs = CostCoeffs(**{**step_fitted(source).model_dump(), **values})
    terms = tuple(dict.fromkeys(source.fit.fitted_terms + fit.names))
    summary = source.fit.model_copy(update=dict(
        fitted_terms=terms, run_fit=record,
        errors=tuple(FitErrorRow(**row) for row in step_errors(coeffs, root))))
    changes = ", ".join(f"{n} {s:.4g} -> {v:.4g}" for n, s, v in zip(
        fit.names, fit.start, fit.values, strict=True))
    description = source.description.split(" Run-level fit:")[0].rstrip(".") + (
        f". Run-level fit: {changes}, by simulating {len(record.run_ids)} serving runs of "
        f"{record.group} ({record.rule}; {record.targets}); the held-out validation leaves "
        "them out.")
    commands = tuple(c for c in source.commands if "gpu_run_fit" not in c) + (command,)
    return source.model_copy(update=dict(
        coefficients=coeffs, fit=summary, description=description, commands=commands,
        created_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds")))


def write_derived(profile: CalibrationProfile, folder: Path = PROFILES_DIR) -> None:
    """The profiles derived from the H100-64GB one (vidur-dense A100-80GB and H100-SXM, the
    scaled H200 and H20), rewritten from `profile`."""
    from calibrate.gpu_scaled import write_scaled_profiles
    from calibrate.gpu_vidur_fit import write_vidur_profiles

    write_vidur_profiles(profile, folder)
    write_scaled_profiles(profile, folder)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=FIT_STRIDE)
    parser.add_argument("--offset", type=int, default=FIT_OFFSET)
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-nfev", type=int, default=5)
    parser.add_argument("--unknowns", default=",".join(UNKNOWNS))
    args = parser.parse_args(argv)
    from calibrate.fitter import write_profile

    path = PROFILES_DIR / f"{PROFILE_NAME}.yaml"
    source = load_profile(path)
    start = step_fitted(source)
    runs = fit_slice(load_serving_runs(DATA_DIR / RUNS_SUMMARY, group=FIT_GROUP), args.offset,
                     args.stride)
    names = tuple(args.unknowns.split(","))
    warmup_s = args.window_s * WARMUP_S / WINDOW_S
    began = time.monotonic()
    fit = fit_runs(runs, [r.measured for r in runs], start, names, window_s=args.window_s,
                   warmup_s=warmup_s, max_nfev=args.max_nfev, workers=args.workers)
    wall_s = time.monotonic() - began
    load = tuple(round(x, 2) for x in os.getloadavg())
    command = (f"python -m calibrate.gpu_run_profile --stride {args.stride} --offset {args.offset} "
               f"--window-s {args.window_s:g} --max-nfev {args.max_nfev} "
               f"--unknowns {args.unknowns}")
    record = RunFitRecord(
        dataset=DATASET, group=FIT_GROUP, rule=fit_rule(args.offset, args.stride),
        run_ids=tuple(r.run_id for r in runs), engine_version="vllm 0.8.5 (fork, V1)",
        commit=code_commit(), targets=TARGETS, window_s=args.window_s, warmup_s=warmup_s,
        start=dict(zip(fit.names, fit.start, strict=True)),
        fitted=dict(zip(fit.names, fit.values, strict=True)),
        rms_log_error_start=fit.rms_log_error_start, rms_log_error=fit.rms_log_error,
        num_simulations=fit.num_simulations, wall_s=round(wall_s, 1), load_average=load)
    profile = run_fitted_profile(source, fit, record, command)
    write_profile(profile, path)
    write_derived(profile)
    print(f"{len(runs)} runs of {FIT_GROUP}, {fit.num_simulations} simulations in "
          f"{wall_s:.0f} s (load {load}), rms log error {fit.rms_log_error_start:.3f} -> "
          f"{fit.rms_log_error:.3f}")
    for name, s, v in zip(fit.names, fit.start, fit.values, strict=True):
        print(f"  {name}: {s:.4g} -> {v:.4g}")


if __name__ == "__main__":
    main()
