"""Any tidy table made readable: column names with units from the naming rules the code keeps
(`_s` seconds, `_gib` GiB, `_share` a fraction, `num_*` counts), rounded values, the columns
that say nothing per row dropped. For the analytical tables (memory, KV, switch cost,
routing share, decode step), which carry no interval: the cost model prices them alone, and no
validation measures them, which the sections say. The raw table stays the CSV/parquet file."""

from __future__ import annotations

import pandas as pd

from planner.outputs.plan_table import rounded

_WORDS = {"kv": "KV", "lora": "LoRA", "direft": "DiReFT", "moe": "MoE", "gemm": "GEMM",
          "gpu": "GPU", "e2e": "E2E", "ttft": "TTFT", "tpot": "TPOT", "slo": "SLO",
          "tp": "TP"}
_UNITS = (("_gib_per_gpu", "GiB per GPU", 1.0), ("_gib", "GiB", 1.0),
          ("_share", "%", 100.0), ("_tokens", "tokens", 1.0), ("_per_s", "/s", 1.0))
"""(name suffix, unit, scale), first match wins; `_s` is handled apart (s or ms)."""
_NAMED = {"mape": ("MAPE (%)", 100.0), "median_ape": ("Median APE (%)", 100.0),
          "r2": ("R²", 1.0)}
"""Columns whose names no suffix rule reads."""


def _words(stem: str) -> str:
    text = " ".join(_WORDS.get(w, w) for w in stem.split("_") if w)
    return text[:1].upper() + text[1:]


def column_name(column: str, values: pd.Series) -> tuple[str, float]:
    """(name with unit, scale) of a column: `switch_s` -> `Switch (ms)` when every value is
    under a second, `kv_gib` -> `KV (GiB)`, `routing_share` -> `Routing (%)`."""
    if column in _NAMED:
        return _NAMED[column]
    stem = column.removeprefix("num_")
    for suffix, unit, scale in _UNITS:
        if stem.endswith(suffix):
            return f"{_words(stem.removesuffix(suffix))} ({unit})", scale
    if stem.endswith("_s"):
        numbers = pd.to_numeric(values, errors="coerce").abs()
        if numbers.notna().any() and numbers.max() < 1:
            return f"{_words(stem[:-2])} (ms)", 1e3
        return f"{_words(stem[:-2])} (s)", 1.0
    return _words(stem), 1.0


def _cell(value, scale: float):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int) and scale == 1.0:
        return f"{value:,}"
    return rounded(value * scale)


def people_table(df: pd.DataFrame, drop: tuple[str, ...] = ("kind",)) -> pd.DataFrame:
    """`df` with named columns and units and rounded values; `drop` columns and columns with
    one value in every row (besides `strategy`) left out when the table has several rows."""
    kept = [c for c in df.columns if c not in drop
            and (c == "strategy" or len(df) < 2 or df[c].astype(str).nunique(dropna=False) > 1)]
    out = {}
    for column in kept:
        name, scale = column_name(column, df[column])
        out[name] = [_cell(v.item() if hasattr(v, "item") else v, scale) for v in df[column]]
    return pd.DataFrame(out, index=df.index).reset_index(drop=True)


ANALYTICAL_NOTE = ("Priced analytically by the cost model: no validation measures these numbers, "
                   "so they carry no interval (no measured error). Every column, unrounded, is "
                   "in the table files (CSV, parquet).")
