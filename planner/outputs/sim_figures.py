"""Pure figure builders for simulation results: DataFrame in, plotly Figure out.

Tables that compare strategies carry a `strategy` column; `combine` builds them from a mapping
of strategy label to SimResult.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go

STRATEGY_COLORS = {
    "base": "#7f7f7f", "multi_lora": "#1f77b4", "preft": "#ff7f0e", "preft_lora_p": "#ff7f0e",
    "preft_direft_p": "#e7ba52", "mol": "#d62728", "contextual_mol": "#2ca02c",
    "mol2": "#9467bd", "mol2_in_engine": "#9467bd", "mol2_outside_engine": "#c49cde",
    "multi_agent": "#8c564b",
}
"""One colour per strategy label, the same in every chart of the report and the dashboard."""

_OTHER_COLORS = ("#17becf", "#e377c2", "#bcbd22", "#393b79", "#637939", "#843c39", "#7b4173",
                 "#3182bd", "#e6550d", "#31a354")


def strategy_color(label: str) -> str:
    """The colour of a strategy label: its own, its kind's (a label starting with a kind), or a
    stable hash of the label, so a strategy keeps its colour across scenarios and pages."""
    if label in STRATEGY_COLORS:
        return STRATEGY_COLORS[label]
    kinds = sorted((k for k in STRATEGY_COLORS if label.startswith(k)), key=len, reverse=True)
    if kinds:
        return STRATEGY_COLORS[kinds[0]]
    return _OTHER_COLORS[zlib.crc32(label.encode()) % len(_OTHER_COLORS)]


def strategy_colors(labels) -> dict[str, str]:
    """Label -> colour for plotly express's `color_discrete_map`."""
    return {str(label): strategy_color(str(label)) for label in labels}


_METRIC_NAMES = {"ttft_s": "time to first token", "tpot_s": "time per output token",
                 "e2e_s": "end-to-end latency per turn"}


def error_bars(df: pd.DataFrame, metric: str) -> dict | None:
    """Plotly `error_y` of `metric` from its interval columns (`<metric>_low/_high`, written by
    planner.outputs.interval_columns); None where the table has no interval. A band that lies
    wholly above or below the value (the profile's measured error says the engine runs slower
    or faster than predicted) is drawn from the value to its far end; the hover gives it
    exactly."""
    if f"{metric}_low" not in df or f"{metric}_high" not in df:
        return None
    value = df[metric].astype(float)
    return dict(type="data", symmetric=False, visible=True, thickness=1.5, width=4,
                array=(df[f"{metric}_high"] - value).clip(lower=0).tolist(),
                arrayminus=(value - df[f"{metric}_low"]).clip(lower=0).tolist())


def interval_note(df: pd.DataFrame, metrics) -> str:
    """What the error bars show: the interval, and "no measured error" where a bar's profile
    has none (its bar is the seeds' spread only)."""
    flags = [df[f"{m}_measured_error"] for m in metrics if f"{m}_measured_error" in df]
    if not flags:
        return ""
    if all(f.astype(bool).all() for f in flags):
        return "error bars: seeds' spread widened by the profile's measured error"
    return "error bars: seeds' spread only where the profile has no measured error"


def interval_hover(df: pd.DataFrame, metric: str) -> list[str]:
    """Per row: the interval in words for a hover label."""
    if f"{metric}_low" not in df:
        return [""] * len(df)
    flags = df.get(f"{metric}_measured_error", pd.Series(True, index=df.index))
    return [f"interval {lo:.3g}-{hi:.3g}" + ("" if ok else " (seeds only: no measured error)")
            for lo, hi, ok in zip(df[f"{metric}_low"], df[f"{metric}_high"], flags, strict=True)]


def with_note(title: str, note: str) -> str:
    """A chart title with its error-bar note as a subtitle."""
    return f"{title}<br><sup>{note}</sup>" if note else title


def combine(results: dict, table: str) -> pd.DataFrame:
    """One table (`turns`, `requests`, `timeseries`, ...) of several results, with `strategy`."""
    frames = [getattr(r, table).assign(strategy=label) for label, r in results.items()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def summary_frame(results: dict) -> pd.DataFrame:
    """One row of summary numbers per strategy."""
    return pd.DataFrame([{"strategy": label, **r.summary} for label, r in results.items()])


def latency_cdf_figure(turns: pd.DataFrame, metric: str = "ttft_s") -> go.Figure:
    """Empirical CDF of a per-turn latency (ttft_s, tpot_s, e2e_s), one line per strategy."""
    fig = go.Figure()
    for label, group in turns.groupby("strategy", sort=False):
        values = np.sort(group[metric].to_numpy())
        share = np.arange(1, values.size + 1) / max(values.size, 1)
        fig.add_trace(go.Scatter(x=values, y=share, mode="lines", name=str(label),
                                 line_color=strategy_color(str(label))))
    name = _METRIC_NAMES.get(metric, metric)
    fig.update_layout(title=f"Distribution of {name}", xaxis_title=f"{name} (s, log)",
                      yaxis_title="share of turns (CDF)", xaxis_type="log",
                      yaxis_tickformat=".0%", legend_title_text="strategy")
    return fig


def hop_breakdown_figure(turns: pd.DataFrame) -> go.Figure:
    """Mean time per turn by phase: routing, prefill up to the first token, decode, summary."""
    phases = pd.DataFrame({
        "strategy": turns["strategy"],
        "route": turns["route_s"],
        "prefill (handoff/replay)": turns["ttft_s"] - turns["route_s"],
        "decode": turns["finish_s"] - turns["first_token_s"],
        "summary": turns["done_s"] - turns["finish_s"],
    }).groupby("strategy", sort=False).mean()
    fig = go.Figure([go.Bar(name=phase, x=phases.index, y=phases[phase])
                     for phase in phases.columns])
    fig.update_layout(barmode="stack", title="Where a turn's time goes (mean per turn)",
                      yaxis_title="mean time per turn (s)", xaxis_title="strategy",
                      legend_title_text="phase")
    return fig


GPU_PIECES = {
    "routing_busy_s": "routing pass",
    "prefill_busy_s": "prompt (encode new tokens, write KV)",
    "reencode_busy_s": "encoder window re-encode (C[-W:])",
    "replay_busy_s": "bounded replay",
    "decode_busy_s": "decode",
    "summary_busy_s": "summary hop",
}


def gpu_time_figure(turns: pd.DataFrame) -> go.Figure:
    """Mean replica-seconds per turn by priced piece: what the GPUs spend on a turn, its share
    of every batched step it ran in (routing passes included)."""
    pieces = turns.groupby("strategy", sort=False)[list(GPU_PIECES)].mean()
    fig = go.Figure([go.Bar(name=label, x=pieces.index, y=pieces[column])
                     for column, label in GPU_PIECES.items()])
    fig.update_layout(barmode="stack", title="What the GPUs spend on a turn (mean per turn)",
                      yaxis_title="replica-seconds per turn", xaxis_title="strategy",
                      legend_title_text="piece")
    return fig


def switch_cost_figure(turns: pd.DataFrame) -> go.Figure:
    """Mean time to first token after routing, switched vs same-domain turns, per strategy."""
    cost = (turns["ttft_s"] - turns["route_s"]).rename("cost")
    table = turns.assign(cost=cost).groupby(["strategy", "is_switch"], sort=False)["cost"].mean()
    table = table.unstack("is_switch")
    fig = go.Figure([go.Bar(name="switch" if flag else "same domain", x=table.index,
                            y=table[flag]) for flag in table.columns])
    fig.update_layout(barmode="group", title="Time to first token after routing",
                      yaxis_title="mean time to first token after routing (s)",
                      xaxis_title="strategy", legend_title_text="turn")
    return fig


_SERIES_UNITS = {
    "kv_blocks_used": "KV blocks in use (blocks)", "kv_blocks_cached": "KV blocks cached (blocks)",
    "kv_blocks_occupied": "KV blocks held or cached (blocks)",
    "num_running": "running sequences (count)", "num_waiting": "waiting sequences (count)",
    "batch_size": "batch size (sequences)",
    "num_resident_adapters": "adapters in GPU slots (count)",
    "num_adapter_loads": "adapter loads so far (count)",
    "num_preemptions": "preemptions so far (count)",
}
"""Axis titles with units of the per-replica timeseries columns."""


def timeseries_figure(timeseries: pd.DataFrame, column: str = "kv_blocks_used") -> go.Figure:
    """A per-replica timeseries column over simulated time (one line per strategy/replica)."""
    fig = go.Figure()
    keys = ["strategy", "replica"] if "strategy" in timeseries else ["replica"]
    for key, group in timeseries.groupby(keys, sort=False):
        name = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        label = str(key[0] if isinstance(key, tuple) else key)
        color = strategy_color(label) if "strategy" in timeseries else None
        fig.add_trace(go.Scatter(x=group["time_s"], y=group[column], mode="lines", name=name,
                                 line_color=color))
    unit = _SERIES_UNITS.get(column, column.replace("_", " "))
    fig.update_layout(title=unit[0].upper() + unit[1:] + " over time",
                      xaxis_title="simulated time (s)", yaxis_title=unit,
                      legend_title_text=" / ".join(keys))
    return fig


def kv_namespace_figure(kv_by_namespace: pd.DataFrame) -> go.Figure:
    """KV blocks held per namespace (adapter copies; -1 = shared) summed over replicas."""
    fig = go.Figure()
    summed = kv_by_namespace.groupby(["namespace", "time_s"], sort=True)["blocks"].sum()
    for namespace, series in summed.groupby(level="namespace"):
        label = "shared" if namespace == -1 else f"adapter {namespace}"
        fig.add_trace(go.Scatter(x=series.index.get_level_values("time_s"), y=series.values,
                                 mode="lines", stackgroup="kv", name=label))
    fig.update_layout(title="KV blocks held by running sequences, per copy",
                      xaxis_title="simulated time (s)", yaxis_title="KV blocks (blocks)",
                      legend_title_text="KV copy")
    return fig


def throughput_figure(summary: pd.DataFrame) -> go.Figure:
    """Output tokens per second and goodput per strategy, with error bars where the summary
    has interval columns."""
    colors = [strategy_color(str(s)) for s in summary["strategy"]]
    metrics = ("output_tokens_per_s", "goodput_turns_per_s")
    hover = "%{x}: %{y:.4g}<br>%{customdata}<extra>%{fullData.name}</extra>"
    fig = go.Figure([
        go.Bar(name="output tokens/s", x=summary["strategy"], y=summary[metrics[0]],
               marker_color=colors, yaxis="y", offsetgroup=0,
               error_y=error_bars(summary, metrics[0]),
               customdata=interval_hover(summary, metrics[0]), hovertemplate=hover),
        go.Bar(name="goodput turns/s (right axis)", x=summary["strategy"],
               y=summary[metrics[1]], marker_color=colors, marker_pattern_shape="/",
               yaxis="y2", offsetgroup=1, error_y=error_bars(summary, metrics[1]),
               customdata=interval_hover(summary, metrics[1]), hovertemplate=hover),
    ])
    title = with_note("Throughput and goodput (turns within the SLOs)",
                      interval_note(summary, metrics))
    fig.update_layout(barmode="group", title=title,
                      xaxis_title="strategy", yaxis_title="output tokens per second (tokens/s)",
                      yaxis2=dict(title="goodput (turns/s)", overlaying="y", side="right",
                                  rangemode="tozero", tickformat=".2~f", showgrid=False),
                      legend=dict(orientation="h", y=1.12))
    return fig


def adapter_activity_figure(kv_by_namespace: pd.DataFrame) -> go.Figure:
    """Which adapters hold KV on the GPU over time (blocks summed over replicas): a heatmap of
    adapter copies (rows) by simulated time (columns); the shared copy is its own row."""
    summed = kv_by_namespace.groupby(["namespace", "time_s"], sort=True)["blocks"].sum()
    table = summed.unstack("time_s", fill_value=0)
    labels = ["shared" if ns == -1 else f"adapter {ns}" for ns in table.index]
    fig = go.Figure(go.Heatmap(z=table.to_numpy(), x=table.columns, y=labels,
                               colorscale="Blues", colorbar_title="KV blocks",
                               hovertemplate="%{y}<br>t=%{x:.1f} s<br>%{z} blocks<extra></extra>"))
    fig.update_layout(title="Adapters holding KV on the GPU over time",
                      xaxis_title="simulated time (s)", yaxis_title="KV copy")
    return fig


def adapter_residency_figure(timeseries: pd.DataFrame) -> go.Figure:
    """Which adapters sit in one replica's GPU slots over time (from `resident_adapter_mask`):
    a row per adapter, filled while it is resident; loads and evictions show as edges."""
    masks = timeseries["resident_adapter_mask"].to_numpy(dtype=np.int64)
    top = int(masks.max()).bit_length() if masks.size else 0
    rows = [(masks >> a) & 1 for a in range(top)]
    fig = go.Figure(go.Heatmap(
        z=rows, x=timeseries["time_s"], y=[f"adapter {a}" for a in range(top)],
        colorscale=[[0, "#f4f4f4"], [1, "#1f77b4"]], showscale=False, zmin=0, zmax=1,
        hovertemplate="%{y}<br>t=%{x:.1f} s<br>resident: %{z}<extra></extra>"))
    fig.update_layout(title="Adapters in the GPU slots over time (one replica)",
                      xaxis_title="simulated time (s)", yaxis_title="adapter")
    return fig
