"""Simulation in the loop: fit cost coefficients to run-level metrics of serving runs by
replaying each run through the simulator at trial coefficients, on top of the step fit.

    python -m calibrate.gpu_run_profile [--stride 60] [--window-s 90] [--workers 2]
    (rewrites the shipped H100-64GB profile and the profiles derived from it)

Some data gives only run-level metrics: the measured throughput and TPOT of a run at known
rates and engine limits. `fit_runs` treats chosen coefficients as unknowns and minimises, with
scipy's `least_squares`, the log ratios of simulated to measured metrics over a set of runs
(`calibrate.gpu_runs.predict_run` replays each). The unknowns are fitted as log factors on a
starting profile, so coefficients of different scales share one step size; the
finite-difference step is a few percent because a simulated metric is a count or a quantile
of discrete events, flat under tiny changes.

The runs: agullo-dt's `ml_modelling/test_dataset` (vLLM 0.8.5 V1, the held-out table's engine
and GPU), every `--stride`-th run from index 2 of `load_serving_runs`' order. The held-out
validation (`calibrate.gpu_validate`) takes every 4th run from index 0, and leaves out every
run the profile records as fitted (`fit.run_fit.run_ids`), so the two never share a run.

What each run is fitted on (`run_targets`): TPOT p50 of a run the engine kept up with, and
the throughput (the capacity) of one it did not. TPOT of saturated runs is left out: it comes
out about a third fast at near-unbiased capacity, a miss of the replayed scheduling
(docs/validation-gpu.md), which cost terms fitted to it would only hide. TTFT is left out:
measured at the HTTP client, it holds costs outside the engine's steps.

Unknowns (`UNKNOWNS`), each a term of `sim.cost.coeffs` the held-out errors point at: the base
decode's bandwidth (light runs' decode steps), the LoRA kernel programs that compute (what
each distinct adapter adds, priced on decode-sized steps by the step fit) and the programs
that exit at once (the grid over every slot and every token block, which steps carrying
prompt chunks of up to 2,048 tokens multiply and the step fit saw only at 1 and 220-250
tokens).

Cost: each trial point simulates every run once; least_squares' forward-difference Jacobian
adds one trial per unknown, so 14 runs (stride 60), 3 unknowns and at most 5 trial points
simulate at most 5 x 4 x 14 = 280 runs of well under a CPU-second each at 90 s (the fit's
record keeps its wall time and load): inside the 15 minutes a fit may take on a 2-core
machine, with room for a loaded one (two processes side by side).

Window 90 s with a 30 s warm-up: light runs reach their steady batch within seconds, and a
saturated run's batch turns over within 10-25 s, so after 30 s its mix is the steady one;
the 60 s scored hold 600-2,000 completions at the measured capacities (10-36 req/s), a 2-4%
sampling error on throughput, under the differences the fit resolves (5% steps).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from calibrate.gpu_runs import ServingRun, backlog_of, predict_run
from sim.cost.cost_model import CostCoeffs

FIT_GROUP = "ml_modelling/test_dataset"
"""Serving runs the run-level fit takes its slice from."""
FIT_OFFSET, FIT_STRIDE = 2, 60
"""The fit's runs: index FIT_OFFSET, FIT_OFFSET + FIT_STRIDE, ... of `load_serving_runs`'
order. An offset of 2 with a stride that is a multiple of 4 misses the validation's every-4th
runs from index 0 by construction; the validation also drops them by id."""
UNKNOWNS = ("memory_bandwidth_efficiency", "lora_working_program_s",
            "lora_idle_expand_program_s")
"""Default unknowns (module docstring: why these)."""
WINDOW_S, WARMUP_S = 90.0, 30.0
"""Simulated window per run and the warm-up left out of its scores (module docstring)."""
MAX_FACTOR = 10.0
"""Each unknown stays within this factor of its starting value (and within its field's
bounds)."""
TARGETS = ("TPOT p50 of runs measured at >= 95% of their offered rate; throughput of the "
           "others (saturated)")


@dataclass(frozen=True)
class RunFit:
    """Fitted values of the unknowns and how the fit went."""

    names: tuple[str, ...]
    values: tuple[float, ...]
    start: tuple[float, ...]
    rms_log_error: float
    """Root mean square of the final log(simulated / measured) residuals."""
    num_simulations: int
    rms_log_error_start: float = 0.0
    """The same at the starting values."""


def run_targets(run: ServingRun, measured: dict[str, float]) -> dict[str, float]:
    """The metrics a run is fitted on (module docstring: why): TPOT p50 where the engine kept
    up with the offered rate, the throughput where it did not."""
    if measured["throughput_rps"] < 0.95 * sum(run.adapter_rates):
        return {"throughput_rps": measured["throughput_rps"]}
    return {"tpot_p50_s": measured["tpot_p50_s"]}


def fit_slice(runs: Sequence[ServingRun], offset: int = FIT_OFFSET,
              stride: int = FIT_STRIDE) -> list[ServingRun]:
    """The runs of the fit: every `stride`-th from index `offset`."""
    if stride < 1 or not 0 <= offset < stride:
        raise ValueError(f"offset={offset}, stride={stride}; allowed: stride >= 1, "
                         f"0 <= offset < stride")
    return list(runs[offset::stride])


def fit_rule(offset: int, stride: int) -> str:
    """The slice's rule in words, as the profile records it."""
    return (f"every {stride}th run from index {offset} of calibrate.gpu_runs.load_serving_runs' "
            f"order (runs with a result, Llama-3.1-8B and Qwen2.5-7B)")


def _bounds(names: Sequence[str], start: CostCoeffs) -> tuple[np.ndarray, np.ndarray]:
    """Log-factor bounds: MAX_FACTOR either way, and inside each field's own range."""
    lo, hi = [], []
    for name in names:
        value, upper = getattr(start, name), np.log(MAX_FACTOR)
        for rule in CostCoeffs.model_fields[name].metadata:
            limit = getattr(rule, "le", None) or getattr(rule, "lt", None)
            if limit is not None:
                upper = min(upper, np.log(limit / value) * 0.999)
        lo.append(-np.log(MAX_FACTOR))
        hi.append(upper)
    return np.asarray(lo), np.asarray(hi)


def _simulate(task) -> dict:
    run, coeffs, window_s, warmup_s, backlog = task
    return predict_run(run, coeffs, window_s=window_s, warmup_s=warmup_s, num_backlog=backlog)


@dataclass
class _Objective:
    """Log residuals of every run at a trial point; counts simulations, keeps the first rms."""

    names: tuple[str, ...]
    start: CostCoeffs
    runs: list
    measured: list
    window_s: float
    warmup_s: float
    pool: ProcessPoolExecutor | None
    num_simulations: int = 0
    first_rms: list = field(default_factory=list)
    backlogs: tuple = ()
    """Per run, the waiting requests its replay starts behind, settled once at the start values
    (`calibrate.gpu_runs.backlog_of`): switching it inside the objective would make it jump."""

    def coeffs(self, log_factors) -> CostCoeffs:
        return self.start.model_copy(update={
            n: getattr(self.start, n) * float(np.exp(f))
            for n, f in zip(self.names, log_factors, strict=True)})

    def __call__(self, log_factors) -> np.ndarray:
        coeffs = self.coeffs(log_factors)
        tasks = [(run, coeffs, self.window_s, self.warmup_s, backlog)
                 for run, backlog in zip(self.runs, self.backlogs, strict=True)]
        predicted = list(self.pool.map(_simulate, tasks) if self.pool else map(_simulate, tasks))
        self.num_simulations += len(tasks)
        out = np.asarray([np.log(p[m] / v) for run, meas, p in zip(
            self.runs, self.measured, predicted, strict=True)
            for m, v in run_targets(run, meas).items()])
        if not self.first_rms:
            self.first_rms.append(float(np.sqrt(np.mean(out**2))))
        return out


def fit_runs(runs: Sequence[ServingRun], measured: Sequence[dict[str, float]],
             start: CostCoeffs, names: Sequence[str] = UNKNOWNS, *,
             window_s: float = WINDOW_S, warmup_s: float = WARMUP_S, max_nfev: int = 20,
             workers: int = 1) -> RunFit:
    """Least-squares fit of `names` (log factors on `start`) to the runs' measured metrics;
    `workers` processes simulate a trial point's runs side by side."""
    unknown = [n for n in names if n not in CostCoeffs.model_fields]
    if unknown:
        raise ValueError(f"unknowns {unknown}: not cost coefficients; allowed: "
                         f"{', '.join(CostCoeffs.model_fields)}")
    zero = [n for n in names if not getattr(start, n) > 0]
    if zero:
        raise ValueError(f"unknowns {zero}: starting value must be > 0 (fitted as factors)")
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        backlogs = tuple(backlog_of(run, start, window_s=window_s, warmup_s=warmup_s)
                         for run in runs)
        objective = _Objective(tuple(names), start, list(runs), list(measured), window_s,
                               warmup_s, pool, backlogs=backlogs)
        # xtol: a few tenths of the 5% difference step, below which the simulated metrics
        # (counts and quantiles) do not resolve a change.
        result = least_squares(objective, np.zeros(len(names)), bounds=_bounds(names, start),
                               diff_step=0.05, max_nfev=max_nfev, x_scale=1.0, xtol=0.01,
                               ftol=1e-3)
    finally:
        if pool:
            pool.shutdown()
    fitted = objective.coeffs(result.x)
    return RunFit(tuple(names), tuple(getattr(fitted, n) for n in names),
                  tuple(getattr(start, n) for n in names),
                  float(np.sqrt(np.mean(result.fun**2))), objective.num_simulations,
                  objective.first_rms[0])


def code_commit() -> str:
    """The checkout's commit, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip() or "unknown"
