"""The capacity plan and the simulation summary as tables for people: named columns with
units, rounded values, the interval beside each predicted number. Formatting only (the raw
table stays in the CSV and parquet files); every interval is read from the interval columns
(planner.outputs.interval_columns), so a table and its chart's error bars agree."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from planner.outputs.interval_columns import with_intervals
from planner.predict.intervals import DEFAULT_CONFIDENCE, ProfileErrors
from planner.scenario.resolved import ResolvedScenario, gpu_pricing_source

LATENCIES = (("ttft_p99_s", "p99 TTFT", "s", 1.0), ("tpot_p99_s", "p99 TPOT", "ms", 1e3),
             ("e2e_p99_s", "p99 E2E", "s", 1.0))
"""(plan column, name, unit, scale) of the latencies shown."""

NO_INTERVAL = "not stored: run it again for intervals"
"""A plan row without interval columns (a table written before they were stored)."""


def rounded(value, digits: int = 3) -> str:
    """`value` to `digits` significant digits (thousands separated from 1,000 up)."""
    if _missing(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def band_text(value: float, low: float, high: float, scale: float = 1.0) -> str:
    """`0.123 (0.10-0.16)`: a value and its interval, the ends to two digits (three where two
    would print them alike)."""
    low, high = low * scale, high * scale
    digits = 2 if rounded(low, 2) != rounded(high, 2) else 3
    return f"{rounded(value * scale)} ({rounded(low, digits)}-{rounded(high, digits)})"


def interval_cell(row: Mapping, metric: str, scale: float = 1.0,
                  mark_seeds: bool = False) -> str:
    """A value with its interval from the row's interval columns, the value alone where the
    row has none. `mark_seeds`: a band with no measured error reads `0.12 (seeds 0.11-0.13)`;
    a single run's (no band at all) is the value alone, `(no measured error)` beside it where
    the row's profile has a validation that does not measure this metric."""
    value = row.get(metric)
    if _missing(value):
        return "-"
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    if _missing(low) or _missing(high):
        return rounded(value * scale)
    if mark_seeds and not row.get(f"{metric}_measured_error", True):
        if low != high:
            return band_text(value, low, high, scale).replace(" (", " (seeds ", 1)
        flag = row.get("interval_validated")
        validated = isinstance(flag, bool | np.bool_) and bool(flag)
        return rounded(value * scale) + (" (no measured error)" if validated else "")
    return band_text(value, low, high, scale)


def interval_phrase(row: Mapping, metric: str, unit: str, scale: float = 1.0) -> str:
    """A value with its unit and interval for a sentence: `0.123 s (0.10-0.16)`, `0.123 s
    (seeds 0.12-0.13; no measured error)`, or `0.123 s (no measured error)` for a single run
    whose profile has none."""
    value = row.get(metric)
    if _missing(value):
        return "-"
    text = f"{rounded(value * scale)} {unit}"
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    if _missing(low) or _missing(high):
        return text
    band = band_text(value, low, high, scale).split(" (", 1)[1].rstrip(")")
    if row.get(f"{metric}_measured_error", True):
        return f"{text} ({band})"
    return f"{text} (no measured error)" if low == high else \
        f"{text} (seeds {band}; no measured error)"


def people_plan_table(plans: pd.DataFrame,
                      errors_by_gpu: Mapping[str, ProfileErrors | None] | None = None,
                      confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """One row per strategy: its deployment, cost and p99 latencies with their intervals at
    `confidence`; an infeasible strategy shows why. Without `errors_by_gpu` the rows carry
    their interval columns already (a saved run's table)."""
    if errors_by_gpu is not None:
        plans = with_intervals(plans, errors_by_gpu, confidence)
    rows = []
    for row in plans.to_dict(orient="records"):
        if not row.get("is_feasible"):
            rows.append({"Strategy": row["strategy"], "Deployment": "no plan",
                         "Why": row.get("reason") or "-"})
            continue
        out = {"Strategy": row["strategy"],
               "Deployment": f"{int(row['num_gpus'])} x {row['gpu']} (TP "
                             f"{int(row['tensor_parallel_size'])}, {int(row['num_replicas'])} "
                             f"replica{'s' if int(row['num_replicas']) > 1 else ''})",
               "Cost ($/h)": f"{row['cost_per_hour_usd']:,.2f}",
               "Cost ($/M output tokens)": rounded(row.get("cost_per_million_tokens_usd")),
               "Rate per replica (req/s)": rounded(row.get("per_replica_rate_per_s")),
               "Batch / adapter slots": f"{int(row['max_num_seqs'])} / {int(row['max_loras'])}"}
        for metric, name, unit, scale in LATENCIES:
            out[f"{name} ({unit})"] = interval_cell(row, metric, scale, mark_seeds=True)
        out["Output (tok/s)"] = interval_cell(row, "output_tokens_per_s", mark_seeds=True)
        level = row.get("interval_confidence")
        level = confidence if _missing(level) else level
        out[f"Interval ({level:.0%})"] = row.get("interval_source") or NO_INTERVAL
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


def people_summary_table(charted: pd.DataFrame) -> pd.DataFrame:
    """The simulation summary for people: one row per strategy, named columns with units,
    rounded values, each predicted value's interval beside it where it has one (a metric the
    profile has no measured error for shows its value alone)."""
    rows = []
    for row in charted.to_dict(orient="records"):
        out = {"Strategy": row["strategy"]}
        for metric, name, scale in SUMMARY_COLUMNS:
            if metric in row:
                out[name] = interval_cell(row, metric, scale, mark_seeds=True)
        rows.append(out)
    return pd.DataFrame(rows)


def chosen_gpu_pricing(resolved: ResolvedScenario, plans: pd.DataFrame) -> dict[str, str]:
    """GPU kind -> the line naming the profile that priced it, for each GPU kind a feasible plan
    chose, once each in plan order (every strategy on one GPU kind shares its pricing)."""
    chosen = [row["gpu"] for row in plans.to_dict("records") if row.get("is_feasible")]
    return {gpu: gpu_pricing_source(resolved, gpu) for gpu in dict.fromkeys(chosen)}


def pricing_table(resolved: ResolvedScenario, plans: pd.DataFrame) -> pd.DataFrame:
    """Which profile priced what: the simulation and comparisons on the scenario's GPU, and
    each GPU kind a plan chose."""
    own = resolved.scenario.hardware.gpu_spec.name
    rows = [{"numbers": f"simulation and comparisons on {own}",
             "priced by": gpu_pricing_source(resolved, own)}]
    rows += [{"numbers": f"plans on {gpu}", "priced by": source}
             for gpu, source in chosen_gpu_pricing(resolved, plans).items()]
    return pd.DataFrame(rows)
