"""Interval columns for the charts and tables: `<metric>_low`, `<metric>_high` and
`<metric>_measured_error` beside each predicted metric of a table, the same interval the
people's tables print (the seeds' spread widened by the measured error of the profile that
priced the row), and per row what widened it (`interval_source`), whether its profile has a
validation at all (`interval_validated`), which profile (`interval_profile`) and at which
confidence (`interval_confidence`). The figure builders and people's tables only read these
columns; the pricing stays here. `molcap run` and `molcap sweep` write them into their table
files, so a saved run shows its intervals without recomputing them.

Each function takes a `Scenario` (resolved on the spot, as the dashboard calls them) or the
`ResolvedScenario` a run already holds, so a run's report resolves nothing again."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from planner.predict.intervals import (
    DEFAULT_CONFIDENCE,
    VALIDATED_METRIC,
    ProfileErrors,
    metric_interval,
    pricing_errors,
)
from planner.scenario.resolved import ResolvedScenario
from planner.scenario.schema import Scenario

ScenarioLike = Scenario | ResolvedScenario

CHARTED = tuple(VALIDATED_METRIC) + ("goodput_turns_per_s",)
"""Metrics a chart may draw as bars: each gets interval columns where the table has it."""


def error_source(errors: ProfileErrors | None) -> str:
    """What widened the interval: the profile's measured error, or nothing but the seeds."""
    if errors is None:
        return "seeds only: no measured error"
    num = max((len(v) for v in errors.errors.values()), default=0)
    return f"seeds x measured error ({num} workloads)"


def with_intervals(frame: pd.DataFrame, errors_by_gpu: Mapping[str, ProfileErrors | None],
                   confidence: float = DEFAULT_CONFIDENCE,
                   default_gpu: str | None = None) -> pd.DataFrame:
    """`frame` with interval columns for every charted metric it has. A row's profile is its
    `gpu` column's (else `default_gpu`'s); its seeds' spread is `<metric>_min/_max` where the
    table has them (a single run: no spread)."""
    out = frame.copy()
    gpus = list(out["gpu"]) if "gpu" in out else [default_gpu] * len(out)
    errors = [errors_by_gpu.get(g) for g in gpus]
    for metric in (m for m in CHARTED if m in out):
        values = out[metric].astype(float)
        lows = out.get(f"{metric}_min", values).astype(float)
        highs = out.get(f"{metric}_max", values).astype(float)
        intervals = [metric_interval(metric, v, lo, hi, e, confidence)
                     for v, lo, hi, e in zip(values, lows, highs, errors, strict=True)]
        out[f"{metric}_low"] = [i.low for i in intervals]
        out[f"{metric}_high"] = [i.high for i in intervals]
        out[f"{metric}_measured_error"] = [i.has_measured_error for i in intervals]
    out["interval_source"] = [error_source(e) for e in errors]
    out["interval_validated"] = [e is not None for e in errors]
    out["interval_profile"] = [getattr(e, "profile", None) for e in errors]
    out["interval_confidence"] = confidence
    return out


def _plain(scenario: ScenarioLike) -> Scenario:
    return scenario.scenario if isinstance(scenario, ResolvedScenario) else scenario


def _confidence(scenario: ScenarioLike) -> float:
    return _plain(scenario).search.confidence or DEFAULT_CONFIDENCE


def summary_intervals(summary: pd.DataFrame, scenario: ScenarioLike) -> pd.DataFrame:
    """A simulation summary (the scenario's own GPU) with its interval columns."""
    gpu = _plain(scenario).hardware.gpu_spec.name
    return with_intervals(summary, {gpu: pricing_errors(scenario, gpu)}, _confidence(scenario),
                          default_gpu=gpu)


def plan_intervals(plans: pd.DataFrame, scenario: ScenarioLike) -> pd.DataFrame:
    """Plan rows (each on its own GPU kind) with their interval columns."""
    gpus = plans["gpu"].dropna().unique() if "gpu" in plans else []
    errors = {gpu: pricing_errors(scenario, gpu) for gpu in gpus}
    return with_intervals(plans, errors, _confidence(scenario))


def variants_intervals(stacked: pd.DataFrame,
                       scenarios: Mapping[str, ScenarioLike]) -> pd.DataFrame:
    """Stacked variant summaries (column `variant`), each variant priced by its own scenario."""
    parts = [summary_intervals(group, scenarios[str(variant)])
             for variant, group in stacked.groupby("variant", sort=False)]
    return pd.concat(parts) if parts else stacked


def sweep_intervals(table: pd.DataFrame,
                    scenarios: Mapping[str, ScenarioLike]) -> pd.DataFrame:
    """A sweep table (column `point`) with interval columns, each point priced by its own
    scenario (`scenarios`: point key -> its scenario or resolution): a swept GPU kind or
    profile changes the measured error that widens its interval."""
    errors: dict[tuple, ProfileErrors | None] = {}
    parts = []
    for point, group in table.groupby("point", sort=False):
        scenario = scenarios[str(point)]
        hardware = _plain(scenario).hardware
        gpu = hardware.gpu_spec.name
        key = (gpu, hardware.model_dump_json())
        if key not in errors:  # one validation file read per distinct hardware, not per point
            errors[key] = pricing_errors(scenario, gpu)
        parts.append(with_intervals(group, {gpu: errors[key]}, _confidence(scenario),
                                    default_gpu=gpu))
    return pd.concat(parts) if parts else table
