"""Pure figure builders: tidy DataFrame in, plotly Figure out (shared by the report and the app)."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from planner.outputs.sim_figures import (
    error_bars,
    interval_hover,
    interval_note,
    strategy_colors,
    with_note,
)

_TEMPLATE = "plotly_white"
_LAYOUT = dict(template=_TEMPLATE, height=420, legend_title_text="strategy")
_PX_LAYOUT = {k: v for k, v in _LAYOUT.items() if k != "template"}
"""`_LAYOUT` for a plotly express figure, which takes its template as an argument: setting it
again afterwards copies the whole template a second time, a third of a figure's build."""


def _colors(df: pd.DataFrame) -> dict[str, str]:
    return strategy_colors(df["strategy"].unique()) if "strategy" in df else {}


def kv_per_conversation_figure(df: pd.DataFrame) -> go.Figure:
    """KV GiB per conversation vs context, one panel per number of adapters visited."""
    fig = px.line(df, x="context_tokens", y="kv_gib", color="strategy",
                  color_discrete_map=_colors(df),
                  facet_col="adapters_visited", markers=True, log_x=True, log_y=True,
                  labels={"context_tokens": "context (tokens)",
                          "kv_gib": "KV per conversation (GiB)",
                          "adapters_visited": "adapters visited"},
                  template=_TEMPLATE, title="KV memory per conversation")
    return fig.update_layout(**_PX_LAYOUT)


def switch_cost_figure(df: pd.DataFrame) -> go.Figure:
    """Seconds of one domain switch vs context length."""
    fig = px.line(df.dropna(subset=["switch_s"]), x="context_tokens", y="switch_s",
                  color="strategy", markers=True, log_x=True, log_y=True,
                  hover_data=["mechanism"], color_discrete_map=_colors(df),
                  labels={"context_tokens": "context (tokens)", "switch_s": "switch cost (s)"},
                  template=_TEMPLATE,
                  title="Cost of one domain switch (handoff vs bounded replay vs re-prefill)")
    return fig.update_layout(**_PX_LAYOUT)


def routing_vs_reply_figure(df: pd.DataFrame) -> go.Figure:
    """Routing share of a turn vs tokens decoded per turn (one decision per turn)."""
    fig = px.line(df, x="decode_tokens_per_turn", y="routing_share", color="strategy",
                  markers=True, log_x=True, color_discrete_map=_colors(df),
                  labels={"decode_tokens_per_turn": "tokens decoded per turn (tokens)",
                          "routing_share": "routing share of the turn (%)"},
                  template=_TEMPLATE,
                  title="Routing overhead vs reply length (one decision per turn)")
    return fig.update_layout(yaxis_tickformat=".0%", **_PX_LAYOUT)


def routing_vs_frequency_figure(df: pd.DataFrame) -> go.Figure:
    """Routing (and switch) share vs a decision every k decoded tokens."""
    fig = px.line(df, x="decision_every_tokens", y="routing_and_switch_share", color="strategy",
                  markers=True, log_x=True, hover_data=["decision_s", "switch_s", "decode_s"],
                  color_discrete_map=_colors(df),
                  labels={"decision_every_tokens": "a decision (and switch) every k tokens",
                          "routing_and_switch_share": "share of time routing and switching (%)"},
                  template=_TEMPLATE, title="Routing and switching overhead vs decision frequency")
    return fig.update_layout(yaxis_tickformat=".0%", **_PX_LAYOUT)


def decode_step_figure(df: pd.DataFrame) -> go.Figure:
    """Decode step time vs distinct adapters in the batch."""
    fig = px.line(df, x="distinct_adapters", y="step_s", color="strategy", markers=True,
                  log_x=True, color_discrete_map=_colors(df),
                  hover_data=["lora_s", "direft_s", "attention_s", "dense_gemm_s"],
                  labels={"distinct_adapters": "distinct adapters in the decode batch",
                          "step_s": "decode step (s)"},
                  template=_TEMPLATE, title="Decode step time vs adapter mix (multi-LoRA vs PreFT)")
    return fig.update_layout(**_PX_LAYOUT)


COMPARISON_FIGURES = {
    "kv_per_conversation": kv_per_conversation_figure,
    "switch_cost": switch_cost_figure,
    "routing_vs_reply_length": routing_vs_reply_figure,
    "routing_vs_decision_frequency": routing_vs_frequency_figure,
    "decode_step_vs_adapters": decode_step_figure,
}
"""Comparison name -> its figure builder."""


def _band_columns(data: pd.DataFrame, metric: str) -> pd.DataFrame:
    """`data` with `plus`/`minus` (the interval's distances above and below `metric`) and the
    interval in words, from the interval columns; zeros where there are none."""
    value = data[metric].astype(float)
    if f"{metric}_low" not in data:
        return data.assign(plus=0.0, minus=0.0, interval="")
    return data.assign(plus=(data[f"{metric}_high"] - value).clip(lower=0),
                       minus=(value - data[f"{metric}_low"]).clip(lower=0),
                       interval=interval_hover(data, metric))


def pareto_figure(trials: pd.DataFrame) -> go.Figure:
    """Cost per hour vs p99 end-to-end latency of every deployment tried at the target rate,
    the latency's interval as error bars where the trials carry interval columns."""
    data = trials.dropna(subset=["e2e_p99_s"]).assign(
        slo=lambda d: d["meets_slo"].map({True: "meets SLOs", False: "misses SLOs"}))
    bars = "e2e_p99_s_low" in data
    data = _band_columns(data, "e2e_p99_s")
    fig = px.scatter(data, x="cost_per_hour_usd", y="e2e_p99_s", color="strategy",
                     symbol="slo", log_y=True, color_discrete_map=_colors(data),
                     error_y="plus" if bars else None, error_y_minus="minus" if bars else None,
                     hover_data={c: True for c in ("gpu", "tensor_parallel_size", "num_replicas",
                                                   "max_num_seqs", "ttft_p99_s", "tpot_p99_s",
                                                   "interval") if c in data}
                     | {"plus": False, "minus": False},
                     labels={"cost_per_hour_usd": "cost (USD per hour)",
                             "e2e_p99_s": "p99 end-to-end per turn (s)"},
                     template=_TEMPLATE,
                     title=with_note("Deployments tried at the target rate: cost vs p99 latency",
                                     interval_note(data, ["e2e_p99_s"])))
    return fig.update_layout(**_PX_LAYOUT)


_PERCENTILE_NAMES = {"ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99", "tpot_p50_s": "TPOT p50",
                     "tpot_p99_s": "TPOT p99", "e2e_p50_s": "end-to-end p50",
                     "e2e_p99_s": "end-to-end p99"}


def _long_latencies(table: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """One row per (strategy, percentile) with its interval's distances below and above."""
    rows = []
    hovers = {col: interval_hover(table, col) for col in cols}  # not a frame per row: slow
    for i, (_, row) in enumerate(table.iterrows()):
        for col in cols:
            value = float(row[col])
            low, high = row.get(f"{col}_low", value), row.get(f"{col}_high", value)
            rows.append({"strategy": row["strategy"], "metric": _PERCENTILE_NAMES[col],
                         "seconds": value, "plus": max(high - value, 0.0),
                         "minus": max(value - low, 0.0), "interval": hovers[col][i]})
    return pd.DataFrame(rows)


def _latency_bars(table: pd.DataFrame, cols: list[str], title: str) -> go.Figure:
    long = _long_latencies(table, cols)
    bars = any(f"{c}_low" in table for c in cols)
    fig = px.bar(long, x="metric", y="seconds", color="strategy", barmode="group", log_y=True,
                 color_discrete_map=_colors(table),
                 error_y="plus" if bars else None, error_y_minus="minus" if bars else None,
                 hover_data={"interval": True, "plus": False, "minus": False},
                 labels={"metric": "latency percentile", "seconds": "latency (s, log)"},
                 template=_TEMPLATE, title=with_note(title, interval_note(table, cols)))
    return fig.update_layout(**_PX_LAYOUT)


def sim_latency_figure(summary: pd.DataFrame) -> go.Figure:
    """p50 and p99 of TTFT, TPOT and end-to-end per strategy, from the simulation; error bars
    from the interval columns where the summary has them."""
    cols = [c for c in _PERCENTILE_NAMES if c in summary.columns]
    return _latency_bars(summary, cols, "Simulated latency on the scenario's hardware")


def plan_latency_figure(plans: pd.DataFrame) -> go.Figure:
    """p99 TTFT, TPOT and end-to-end of each strategy's chosen deployment, with the interval
    the plan table prints as error bars."""
    data = plans[plans["is_feasible"].astype(bool)]
    cols = [c for c in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s") if c in data.columns]
    return _latency_bars(data, cols, "Capacity plan: p99 latency of each chosen deployment")


def plan_figure(plans: pd.DataFrame) -> go.Figure:
    """Cost per hour of each strategy's cheapest deployment (feasible ones), GPUs on the bar."""
    data = plans[plans["is_feasible"].astype(bool)].sort_values("cost_per_hour_usd")
    data = data.assign(deployment=lambda d: d["num_gpus"].astype(int).astype(str) + " x "
                       + d["gpu"].astype(str))
    fig = px.bar(data, x="strategy", y="cost_per_hour_usd", color="strategy", text="deployment",
                 color_discrete_map=_colors(data),
                 hover_data=[c for c in ("tensor_parallel_size", "num_replicas",
                                         "cost_per_million_tokens_usd", "ttft_p99_s",
                                         "tpot_p99_s", "e2e_p99_s") if c in data],
                 labels={"cost_per_hour_usd": "cost of the cheapest deployment (USD per hour)",
                         "strategy": "strategy"},
                 template=_TEMPLATE,
                 title="Capacity plan: cheapest deployment per strategy within the SLOs")
    return fig.update_layout(showlegend=False, **_PX_LAYOUT)


def variants_figure(summary: pd.DataFrame, metric: str, unit: str) -> go.Figure:
    """One metric per strategy for two scenario variants side by side (column `variant`): the
    colour stays the strategy's, the pattern tells the variants apart."""
    fig = go.Figure()
    for i, (variant, group) in enumerate(summary.groupby("variant", sort=False)):
        colors = list(_colors(group).get(s, None) for s in group["strategy"])
        fig.add_trace(go.Bar(name=str(variant), x=group["strategy"], y=group[metric],
                             marker_color=colors, marker_pattern_shape="" if i == 0 else "/",
                             error_y=error_bars(group, metric),
                             hovertemplate="%{x}: %{y:.4g}<extra>" + str(variant) + "</extra>"))
    fig.update_layout(barmode="group", title=f"{unit}: before vs after", xaxis_title="strategy",
                      yaxis_title=unit, **{**_LAYOUT, "legend_title_text": "variant"})
    return fig
