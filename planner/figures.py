"""Pure figure builders: tidy DataFrame in, plotly Figure out (shared by the report and the app)."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

_LAYOUT = dict(template="plotly_white", height=420, legend_title_text="strategy")


def kv_per_conversation_figure(df: pd.DataFrame) -> go.Figure:
    """KV GiB per conversation vs context, one panel per number of adapters visited."""
    fig = px.line(df, x="context_tokens", y="kv_gib", color="strategy",
                  facet_col="adapters_visited", markers=True, log_x=True, log_y=True,
                  labels={"context_tokens": "context (tokens)",
                          "kv_gib": "KV per conversation (GiB)",
                          "adapters_visited": "adapters visited"},
                  title="KV memory per conversation")
    return fig.update_layout(**_LAYOUT)


def switch_cost_figure(df: pd.DataFrame) -> go.Figure:
    """Seconds of one domain switch vs context length."""
    fig = px.line(df.dropna(subset=["switch_s"]), x="context_tokens", y="switch_s",
                  color="strategy", markers=True, log_x=True, log_y=True,
                  hover_data=["mechanism"],
                  labels={"context_tokens": "context (tokens)", "switch_s": "switch cost (s)"},
                  title="Cost of one domain switch (handoff vs bounded replay vs re-prefill)")
    return fig.update_layout(**_LAYOUT)


def routing_vs_reply_figure(df: pd.DataFrame) -> go.Figure:
    """Routing share of a turn vs tokens decoded per turn (one decision per turn)."""
    fig = px.line(df, x="decode_tokens_per_turn", y="routing_share", color="strategy",
                  markers=True, log_x=True,
                  labels={"decode_tokens_per_turn": "tokens decoded per turn",
                          "routing_share": "routing share of the turn"},
                  title="Routing overhead vs reply length (one decision per turn)")
    return fig.update_layout(yaxis_tickformat=".0%", **_LAYOUT)


def routing_vs_frequency_figure(df: pd.DataFrame) -> go.Figure:
    """Routing (and switch) share vs a decision every k decoded tokens."""
    fig = px.line(df, x="decision_every_tokens", y="routing_and_switch_share", color="strategy",
                  markers=True, log_x=True, hover_data=["decision_s", "switch_s", "decode_s"],
                  labels={"decision_every_tokens": "a decision (and switch) every k tokens",
                          "routing_and_switch_share": "share of time routing and switching"},
                  title="Routing and switching overhead vs decision frequency")
    return fig.update_layout(yaxis_tickformat=".0%", **_LAYOUT)


def decode_step_figure(df: pd.DataFrame) -> go.Figure:
    """Decode step time vs distinct adapters in the batch."""
    fig = px.line(df, x="distinct_adapters", y="step_s", color="strategy", markers=True,
                  log_x=True, hover_data=["lora_s", "direft_s", "attention_s", "dense_gemm_s"],
                  labels={"distinct_adapters": "distinct adapters in the decode batch",
                          "step_s": "decode step (s)"},
                  title="Decode step time vs adapter mix (multi-LoRA vs PreFT)")
    return fig.update_layout(**_LAYOUT)


COMPARISON_FIGURES = {
    "kv_per_conversation": kv_per_conversation_figure,
    "switch_cost": switch_cost_figure,
    "routing_vs_reply_length": routing_vs_reply_figure,
    "routing_vs_decision_frequency": routing_vs_frequency_figure,
    "decode_step_vs_adapters": decode_step_figure,
}
"""Comparison name -> its figure builder."""


def pareto_figure(trials: pd.DataFrame) -> go.Figure:
    """Cost per hour vs p99 end-to-end latency of every deployment tried at the target rate."""
    data = trials.dropna(subset=["e2e_p99_s"]).assign(
        slo=lambda d: d["meets_slo"].map({True: "meets SLOs", False: "misses SLOs"}))
    fig = px.scatter(data, x="cost_per_hour_usd", y="e2e_p99_s", color="strategy",
                     symbol="slo", log_y=True,
                     hover_data=["gpu", "tensor_parallel_size", "num_replicas", "max_num_seqs",
                                 "ttft_p99_s", "tpot_p99_s"],
                     labels={"cost_per_hour_usd": "cost (USD per hour)",
                             "e2e_p99_s": "p99 end-to-end per turn (s)"},
                     title="Deployments tried at the target rate: cost vs p99 latency")
    return fig.update_layout(**_LAYOUT)


def sim_latency_figure(summary: pd.DataFrame) -> go.Figure:
    """p50 and p99 of TTFT, TPOT and end-to-end per strategy, from the simulation."""
    cols = [c for c in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                        "e2e_p99_s") if c in summary.columns]
    long = summary.melt(id_vars=["strategy"], value_vars=cols, var_name="metric",
                        value_name="seconds")
    fig = px.bar(long, x="metric", y="seconds", color="strategy", barmode="group", log_y=True,
                 title="Simulated latency on the scenario's hardware")
    return fig.update_layout(**_LAYOUT)
