"""Tables for people of many variants of a scenario: a sweep's points, and the Compare page's
before/after change. Named columns with units, rounded values, the interval beside each
predicted value (read from the interval columns, planner.outputs.interval_columns); the raw
tables stay the CSV and parquet downloads."""

from __future__ import annotations

import math

import pandas as pd

from planner.outputs.plan_table import SUMMARY_COLUMNS, interval_cell, rounded
from planner.outputs.sweep_figures import field_name

ANALYSIS_COLUMNS = (("decision_s", "Decision (ms)", 1e3), ("switch_s", "Switch (ms)", 1e3),
                    ("decode_step_s", "Decode step (ms)", 1e3),
                    ("kv_gib_per_conversation", "KV per conversation (GiB)", 1.0))
"""(column, name with unit, scale) of the analytical metrics a sweep may hold."""

SWEEP_NOTE = ("Each simulated value with its interval where the profile that priced the point "
              "has a measured error ('seeds' where only the spread over seeds; a value alone: "
              "no measured error); analytical times carry no measured error. Every column is "
              "in sweep.csv and sweep.parquet.")


def people_sweep_table(table: pd.DataFrame, fields: list[str]) -> pd.DataFrame:
    """One row per point and strategy: the varied fields by name, then every metric the sweep
    holds with its unit, rounded, its interval beside it where it has one."""
    columns = [(m, name, scale) for m, name, scale in ANALYSIS_COLUMNS + SUMMARY_COLUMNS
               if m in table]
    rows = []
    for row in table.to_dict(orient="records"):
        out = {field_name(f): row[f] for f in fields}
        out["Strategy"] = row["strategy"]
        if "switch_mechanism" in row:
            out["Switch mechanism"] = row["switch_mechanism"]
        for metric, name, scale in columns:
            out[name] = interval_cell(row, metric, scale, mark_seeds=True)
        rows.append(out)
    return pd.DataFrame(rows)


def _relative(before: float, after: float) -> str:
    if not before or not (math.isfinite(before) and math.isfinite(after)):
        return "-"
    change = (after - before) / abs(before) * 100
    return f"{change:+.0f}%" if abs(change) >= 10 else f"{change:+.1f}%"


def people_change_table(changes: pd.DataFrame, stacked: pd.DataFrame) -> pd.DataFrame:
    """The before/after change per strategy and metric (`compare_summaries`' change table) for
    people: the metric by name with its unit, each variant's value with its interval (from
    `stacked`, the variants' summaries with interval columns), the change and the relative
    change."""
    by_variant = {(r["variant"], r["strategy"]): r for r in stacked.to_dict(orient="records")}
    names = {m: (name, scale) for m, name, scale in SUMMARY_COLUMNS}
    rows = []
    for row in changes.to_dict(orient="records"):
        metric = row["metric"]
        name, scale = names.get(metric, (field_name(metric), 1.0))
        before = by_variant.get(("before", row["strategy"]), {metric: row["before"]})
        after = by_variant.get(("after", row["strategy"]), {metric: row["after"]})
        change = row["after"] - row["before"]
        rows.append({"Strategy": row["strategy"], "Metric": name,
                     "Before": interval_cell(before, metric, scale, mark_seeds=True),
                     "After": interval_cell(after, metric, scale, mark_seeds=True),
                     "Change": ("+" if change > 0 else "") + rounded(change * scale),
                     "Change (%)": _relative(row["before"], row["after"])})
    return pd.DataFrame(rows)
