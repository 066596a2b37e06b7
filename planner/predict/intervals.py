"""An honest interval on every predicted number: the spread over seeds, widened by the measured
held-out error of the profile that priced it.

A profile's validation (`molcap calibrate validate`, kept beside the profile as
`<name>.validation.json`) holds, per workload and metric, the signed error of the prediction
against the real engine, e = predicted / measured - 1. The engine's value for a prediction p is
then p / (1 + e); over the validated workloads those ratios give, at a confidence c, the band
[p / (1 + e_hi), p / (1 + e_lo)] with e_lo, e_hi the (1 - c) / 2 and (1 + c) / 2 quantiles of
the errors. Applied to the lowest and highest seed it gives the interval. A profile without a
validation has no measured error: the interval is the seeds' spread alone, and says so.
Pure functions over plain values; the one loader reads a file beside the profile.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_CONFIDENCE = 0.9
"""Confidence of the intervals the planner prints."""

VALIDATED_METRIC = {
    "output_tokens_per_s": "throughput_tokens_per_s",
    "reply_tokens_per_s": "throughput_tokens_per_s",
    "throughput_tokens_per_s": "throughput_tokens_per_s",
    **{f"{family}_p{q}_s": f"{family}_p{q}_s" for family in ("ttft", "tpot", "e2e")
       for q in (50, 90, 99)},
}
"""Planner metric -> the validation metric whose errors price its uncertainty (the validation
measures throughput as prompt + output tokens per second; output tokens/s shares its error)."""


@dataclass(frozen=True)
class ProfileErrors:
    """Measured held-out errors of one profile, per validation metric."""

    profile: str
    errors: Mapping[str, tuple[float, ...]]
    """Validation metric -> signed errors (predicted / measured - 1), one per workload."""
    clock: str = "wall"
    """The clock the validation timed the engine on: "cpu" (the engine thread's CPU seconds,
    idle gaps skipped) or "wall". The interval holds for a measurement on this clock only."""


@dataclass(frozen=True)
class Interval:
    """A predicted value and the range the real engine's value is expected in."""

    value: float
    low: float
    high: float
    has_measured_error: bool
    """False: the range is the spread over seeds only (no measured error of the profile)."""


def profile_errors(report: Mapping, offline: bool = False) -> ProfileErrors:
    """The errors of a validation report (the JSON `molcap calibrate validate` writes).
    Throughput errors come from the validated workloads of the same arrival kind as the
    prediction: an open-loop engine below capacity serves the offered load, which the model
    matches closely, while an offline batch measures the engine's capacity, which it may not;
    an open-loop plan priced by the offline errors would get a band that misses the offered
    load."""
    errors: dict[str, list[float]] = {}
    for row in report["rows"]:
        metric = row["metric"]
        if metric.startswith("throughput") and ("offline" in row["workload"]) != offline:
            continue
        if row.get("error") is not None and math.isfinite(row["error"]):
            errors.setdefault(metric, []).append(float(row["error"]))
    # A validation that names no clock (the GPU ones, imported from serving logs) is wall time.
    return ProfileErrors(str(report["profile"]), {k: tuple(v) for k, v in errors.items()},
                         clock=str(report.get("clock", "wall")))


def ratio_band(errors: tuple[float, ...], confidence: float) -> tuple[float, float]:
    """(low, high) of measured / predicted at `confidence` over the errors."""
    ratios = 1.0 / (1.0 + np.asarray(errors, dtype=float))
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def metric_interval(metric: str, value: float, seed_low: float, seed_high: float,
                    errors: ProfileErrors | None,
                    confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """The interval of one predicted metric: seeds' [low, high] scaled by the profile's band
    (the seeds' spread alone when the profile has no measured error for it)."""
    measured = errors.errors.get(VALIDATED_METRIC.get(metric, ""), ()) if errors else ()
    if not measured:
        return Interval(value, seed_low, seed_high, False)
    low, high = ratio_band(measured, confidence)
    return Interval(value, seed_low * low, seed_high * high, True)


def trial_intervals(mean: Mapping[str, float], low: Mapping[str, float],
                    high: Mapping[str, float], errors: ProfileErrors | None,
                    confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Interval]:
    """Every metric of a trial (seed mean, min, max) with its interval."""
    return {k: metric_interval(k, v, low.get(k, v), high.get(k, v), errors, confidence)
            for k, v in mean.items()}


def slo_values(mean: Mapping[str, float], low: Mapping[str, float],
               high: Mapping[str, float], errors: ProfileErrors | None,
               confidence: float | None) -> dict[str, float]:
    """The values an SLO is checked on: the seed mean (confidence None), else the upper end
    of each latency's interval, never below the mean (a confidence only adds caution)."""
    if confidence is None:
        return dict(mean)
    out = dict(mean)
    for k, interval in trial_intervals(mean, low, high, errors, confidence).items():
        if k.endswith("_s") and not k.endswith("_per_s"):
            out[k] = max(interval.value, interval.high)
    return out


def _number(metric: str, value: float, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if metric.endswith("_per_s"):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}g}"
    return f"{value:.{digits}g}"


def unit(metric: str) -> str:
    """The unit a metric is printed in."""
    return "tok/s" if metric.endswith("tokens_per_s") else (
        "/s" if metric.endswith("_per_s") else "s")


def format_interval(metric: str, interval: Interval, note: bool = True) -> str:
    """`0.123 s (0.10-0.16)`; without a measured error `0.123 s (seeds 0.12-0.13; no measured
    error)`."""
    value = f"{_number(metric, interval.value)} {unit(metric)}"
    band = f"{_number(metric, interval.low, 2)}-{_number(metric, interval.high, 2)}"
    if interval.has_measured_error or not note:
        return f"{value} ({band})"
    return f"{value} (seeds {band}; no measured error)"


def pricing_errors(scenario, gpu_name: str, base_dir: Path | None = None) -> ProfileErrors | None:
    """The measured errors of the profile that prices `gpu_name` in `scenario` (a Scenario or
    its resolution: its named profile on its own GPU kind, else the kind's shipped profile),
    None where assumed coefficients price it or the profile has no validation."""
    from planner.scenario.pricing import DEFAULT_PROFILES, profile_path
    from planner.scenario.resolved import as_resolved
    from planner.scenario.workloads import is_offline

    resolved = as_resolved(scenario, base_dir)
    offline = is_offline(resolved.scenario.workload)
    if gpu_name in resolved.pricing:
        return load_profile_errors(resolved.pricing[gpu_name].path, offline)
    default = DEFAULT_PROFILES.get(gpu_name)
    return load_profile_errors(profile_path(default), offline) if default else None


PRINTED = (("ttft_p99_s", "p99 TTFT"), ("tpot_p99_s", "p99 TPOT"), ("e2e_p99_s", "p99 E2E"))
"""The plan metrics the CLI prints, with their names."""


def plan_row_text(row: Mapping, errors: ProfileErrors | None, confidence: float) -> str:
    """`p99 TTFT 0.123 s (0.10-0.16), ...` for one plan row; says when the intervals carry no
    measured error, and what a confidence cost over the point estimate."""
    parts = []
    for metric, name in PRINTED:
        value = row.get(metric)
        if value is None or not math.isfinite(value):
            continue
        interval = metric_interval(metric, value, row.get(f"{metric}_min", value),
                                   row.get(f"{metric}_max", value), errors, confidence)
        if errors is not None and not interval.has_measured_error:
            # The profile's validation does not measure this metric: say so, not a band.
            text = f"{_number(metric, value)} {unit(metric)} (no measured error)"
            if interval.low != interval.high:
                text = format_interval(metric, interval)
            parts.append(f"{name} {text}")
            continue
        parts.append(f"{name} {format_interval(metric, interval, note=False)}")
    text = ", ".join(parts) + f" ({confidence:.0%} intervals"
    text += "; no measured error: seeds only)" if errors is None else ")"
    extra = row.get("confidence_extra_gpus")
    if extra is not None and math.isfinite(extra):
        text += f"; the confidence costs {int(extra):+d} GPUs over the point estimate"
    return text


def validation_path(profile_path: Path) -> Path:
    """Where a profile's validation lives: beside it, `<name>.validation.json`."""
    return Path(profile_path).with_suffix(".validation.json")


def load_profile_errors(profile_path: Path | None, offline: bool = False) -> ProfileErrors | None:
    """The measured errors of the profile at `profile_path` for an open-loop (or, `offline`,
    an every-request-at-t=0) prediction (None: no profile, or no validation measured for it)."""
    if profile_path is None:
        return None
    path = validation_path(profile_path)
    if not path.exists():
        return None
    return profile_errors(json.loads(path.read_text(encoding="utf-8")), offline)
