"""Pure figure builders for simulation results: DataFrame in, plotly Figure out.

Tables that compare strategies carry a `strategy` column; `combine` builds them from a mapping
of strategy label to SimResult.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go


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
        fig.add_trace(go.Scatter(x=values, y=share, mode="lines", name=str(label)))
    fig.update_layout(title=f"{metric} distribution per turn", xaxis_title=f"{metric} (s)",
                      yaxis_title="share of turns", xaxis_type="log")
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
    fig.update_layout(barmode="stack", title="Where a turn's time goes (mean seconds)",
                      yaxis_title="seconds")
    return fig


def switch_cost_figure(turns: pd.DataFrame) -> go.Figure:
    """Mean time to first token after routing, switched vs same-domain turns, per strategy."""
    cost = (turns["ttft_s"] - turns["route_s"]).rename("cost")
    table = turns.assign(cost=cost).groupby(["strategy", "is_switch"], sort=False)["cost"].mean()
    table = table.unstack("is_switch")
    fig = go.Figure([go.Bar(name="switch" if flag else "same domain", x=table.index,
                            y=table[flag]) for flag in table.columns])
    fig.update_layout(barmode="group", title="Time to first token after routing",
                      yaxis_title="seconds")
    return fig


def timeseries_figure(timeseries: pd.DataFrame, column: str = "kv_blocks_used") -> go.Figure:
    """A per-replica timeseries column over simulated time (one line per strategy/replica)."""
    fig = go.Figure()
    keys = ["strategy", "replica"] if "strategy" in timeseries else ["replica"]
    for key, group in timeseries.groupby(keys, sort=False):
        name = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        fig.add_trace(go.Scatter(x=group["time_s"], y=group[column], mode="lines", name=name))
    fig.update_layout(title=column.replace("_", " "), xaxis_title="simulated time (s)",
                      yaxis_title=column)
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
                      xaxis_title="simulated time (s)", yaxis_title="blocks")
    return fig


def throughput_figure(summary: pd.DataFrame) -> go.Figure:
    """Output tokens per second and goodput per strategy."""
    fig = go.Figure([
        go.Bar(name="output tokens/s", x=summary["strategy"], y=summary["output_tokens_per_s"]),
        go.Bar(name="goodput turns/s (x100)", x=summary["strategy"],
               y=summary["goodput_turns_per_s"] * 100),
    ])
    fig.update_layout(barmode="group", title="Throughput and goodput")
    return fig
