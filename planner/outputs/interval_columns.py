"""Interval columns for the charts: `<metric>_low`, `<metric>_high` and
`<metric>_measured_error` beside each predicted metric of a table, the same interval the
people's tables print (the seeds' spread widened by the measured error of the profile that
priced the row). The figure builders only draw these columns; the pricing stays here."""

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

CHARTED = tuple(VALIDATED_METRIC) + ("goodput_turns_per_s",)
"""Metrics a chart may draw as bars: each gets interval columns where the table has it."""


def with_intervals(frame: pd.DataFrame, errors_by_gpu: Mapping[str, ProfileErrors | None],
                   confidence: float = DEFAULT_CONFIDENCE,
                   default_gpu: str | None = None) -> pd.DataFrame:
    """`frame` with interval columns for every charted metric it has. A row's profile is its
    `gpu` column's (else `default_gpu`'s); its seeds' spread is `<metric>_min/_max` where the
    table has them (a single run: no spread)."""
    out = frame.copy()
    gpus = out["gpu"] if "gpu" in out else pd.Series(default_gpu, index=out.index)
    for metric in (m for m in CHARTED if m in out):
        low, high, measured = [], [], []
        for i, value in out[metric].items():
            row = out.loc[i]
            interval = metric_interval(metric, float(value), float(row.get(f"{metric}_min", value)),
                                       float(row.get(f"{metric}_max", value)),
                                       errors_by_gpu.get(gpus[i]), confidence)
            low.append(interval.low)
            high.append(interval.high)
            measured.append(interval.has_measured_error)
        out[f"{metric}_low"], out[f"{metric}_high"] = low, high
        out[f"{metric}_measured_error"] = measured
    return out


def _confidence(scenario) -> float:
    return scenario.search.confidence or DEFAULT_CONFIDENCE


def summary_intervals(summary: pd.DataFrame, scenario) -> pd.DataFrame:
    """A simulation summary (the scenario's own GPU) with its interval columns."""
    gpu = scenario.hardware.gpu_spec.name
    return with_intervals(summary, {gpu: pricing_errors(scenario, gpu)}, _confidence(scenario),
                          default_gpu=gpu)


def plan_intervals(plans: pd.DataFrame, scenario) -> pd.DataFrame:
    """Plan rows (each on its own GPU kind) with their interval columns."""
    gpus = plans["gpu"].dropna().unique() if "gpu" in plans else []
    errors = {gpu: pricing_errors(scenario, gpu) for gpu in gpus}
    return with_intervals(plans, errors, _confidence(scenario))


def variants_intervals(stacked: pd.DataFrame, scenarios: Mapping[str, object]) -> pd.DataFrame:
    """Stacked variant summaries (column `variant`), each variant priced by its own scenario."""
    parts = [summary_intervals(group, scenarios[str(variant)])
             for variant, group in stacked.groupby("variant", sort=False)]
    return pd.concat(parts) if parts else stacked
