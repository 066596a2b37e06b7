"""The capacity plan as a table for people: named columns with units, rounded values, the
interval beside each predicted number. Formatting only (the raw table stays in the CSV and
parquet files); every number comes from the plan rows and the profiles' measured errors."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from planner.predict.intervals import DEFAULT_CONFIDENCE, ProfileErrors, metric_interval

LATENCIES = (("ttft_p99_s", "p99 TTFT", "s", 1.0), ("tpot_p99_s", "p99 TPOT", "ms", 1e3),
             ("e2e_p99_s", "p99 E2E", "s", 1.0))
"""(plan column, name, unit, scale) of the latencies shown."""


def rounded(value, digits: int = 3) -> str:
    """`value` to `digits` significant digits (thousands separated from 1,000 up)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def interval_cell(row: Mapping, metric: str, errors: ProfileErrors | None,
                  confidence: float, scale: float = 1.0) -> str:
    """`0.123 (0.10-0.16)`: the seed mean and its interval (seeds' spread scaled by the
    measured error; the seeds' spread alone when there is none)."""
    value = row.get(metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    interval = metric_interval(metric, value, row.get(f"{metric}_min", value),
                               row.get(f"{metric}_max", value), errors, confidence)
    low, high = interval.low * scale, interval.high * scale
    digits = 2 if rounded(low, 2) != rounded(high, 2) else 3
    return f"{rounded(interval.value * scale)} ({rounded(low, digits)}-{rounded(high, digits)})"


def error_source(errors: ProfileErrors | None) -> str:
    """What widened the interval: the profile's measured error, or nothing but the seeds."""
    if errors is None:
        return "seeds only: no measured error"
    num = max((len(v) for v in errors.errors.values()), default=0)
    return f"seeds x measured error of {errors.profile} ({num} workloads)"


def people_plan_table(plans: pd.DataFrame, errors_by_gpu: Mapping[str, ProfileErrors | None],
                      confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """One row per strategy: its deployment, cost and p99 latencies with their intervals at
    `confidence`; an infeasible strategy shows why."""
    rows = []
    for row in plans.to_dict(orient="records"):
        if not row.get("is_feasible"):
            rows.append({"Strategy": row["strategy"], "Deployment": "no plan",
                         "Why": row.get("reason") or "-"})
            continue
        errors = errors_by_gpu.get(row["gpu"])
        out = {"Strategy": row["strategy"],
               "Deployment": f"{int(row['num_gpus'])} x {row['gpu']} (TP "
                             f"{int(row['tensor_parallel_size'])}, {int(row['num_replicas'])} "
                             "replicas)",
               "Cost ($/h)": f"{row['cost_per_hour_usd']:,.2f}",
               "Cost ($/M output tokens)": rounded(row.get("cost_per_million_tokens_usd")),
               "Rate per replica (req/s)": rounded(row.get("per_replica_rate_per_s")),
               "Batch / adapter slots": f"{int(row['max_num_seqs'])} / {int(row['max_loras'])}"}
        for metric, name, unit, scale in LATENCIES:
            out[f"{name} ({unit})"] = interval_cell(row, metric, errors, confidence, scale)
        out["Output (tok/s)"] = interval_cell(row, "output_tokens_per_s", errors, confidence)
        out[f"Interval ({confidence:.0%})"] = error_source(errors)
        rows.append(out)
    return pd.DataFrame(rows).fillna("")


SUMMARY_COLUMNS = (("turns_per_s", "Turns (/s)", 1.0),
                   ("output_tokens_per_s", "Output (tok/s)", 1.0),
                   ("goodput_turns_per_s", "Goodput (turns/s)", 1.0),
                   ("slo_attainment", "SLO attainment (%)", 100.0),
                   ("ttft_p50_s", "p50 TTFT (s)", 1.0), ("ttft_p99_s", "p99 TTFT (s)", 1.0),
                   ("tpot_p99_s", "p99 TPOT (ms)", 1e3), ("e2e_p99_s", "p99 E2E (s)", 1.0),
                   ("misroute_rate", "Misroutes (%)", 100.0),
                   ("num_preemptions", "Preemptions", 1.0))
"""(summary column, name with unit, scale) of the simulation summary shown to people."""


def _charted_cell(row: Mapping, metric: str, scale: float) -> str:
    """`value (low-high)` from the interval columns (planner.outputs.interval_columns), the
    value alone where the table has none; `*` marks a band with no measured error."""
    value = row.get(metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = rounded(value * scale)
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return text
    if not row.get(f"{metric}_measured_error", True):
        return text if low == high else f"{text} (seeds {rounded(low * scale, 2)}-" \
                                        f"{rounded(high * scale, 2)})"
    return f"{text} ({rounded(low * scale, 2)}-{rounded(high * scale, 2)})"


def people_summary_table(charted: pd.DataFrame) -> pd.DataFrame:
    """The simulation summary for people: one row per strategy, named columns with units,
    rounded values, each predicted value's interval beside it where it has one (a metric the
    profile has no measured error for shows its value alone)."""
    rows = []
    for row in charted.to_dict(orient="records"):
        out = {"Strategy": row["strategy"]}
        for metric, name, scale in SUMMARY_COLUMNS:
            if metric in row:
                out[name] = _charted_cell(row, metric, scale)
        rows.append(out)
    return pd.DataFrame(rows)
