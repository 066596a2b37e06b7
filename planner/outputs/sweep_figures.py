"""A sweep's charts: each predicted metric against a varied field, a line per strategy (and a
line style per value of a second field), its interval as error bars where the sweep table has
interval columns (planner.outputs.interval_columns). Shared by the sweep report and the
dashboard's Saved page."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from planner.outputs.sim_figures import error_bars, interval_note, strategy_color, with_note

MAX_DASH_VALUES = 4
"""Values of the second swept parameter drawn as separate lines in one chart."""

SWEEP_METRICS = ("decision_s", "switch_s", "decode_step_s", "kv_gib_per_conversation",
                 "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "output_tokens_per_s")
"""Metrics the sweep report charts, where the table has them."""

_STYLES = ("solid", "dash", "dot", "dashdot")

METRIC_LABELS = {
    "decision_s": "routing decision (s)", "switch_s": "switch cost (s)",
    "decode_step_s": "decode step (s)", "kv_gib_per_conversation": "KV per conversation (GiB)",
    "ttft_p50_s": "p50 TTFT (s)", "ttft_p99_s": "p99 TTFT (s)", "tpot_p50_s": "p50 TPOT (s)",
    "tpot_p99_s": "p99 TPOT (s)", "e2e_p50_s": "p50 end-to-end (s)",
    "e2e_p99_s": "p99 end-to-end (s)", "output_tokens_per_s": "output (tokens/s)",
    "goodput_turns_per_s": "goodput (turns/s)", "turns_per_s": "turns (/s)",
}
"""Axis names with the unit of the values as the sweep table holds them."""


def metric_label(metric: str) -> str:
    """The axis name of a sweep metric: its unit-bearing name, else its words."""
    return METRIC_LABELS.get(metric, metric.replace("_", " "))


def field_name(column: str) -> str:
    """`analysis.num_turn_context_tokens` -> `num turn context tokens`."""
    return column.split(".")[-1].replace("_", " ")


def sweep_line_figure(data: pd.DataFrame, x: str, y: str, dash: str | None,
                      title: str) -> dict:
    """`y` vs `x`, the strategy's colour and a line style per value of `dash`, as a plain
    figure dict: building graph objects validates every trace (about half the parent's serial
    time in a 200-point sweep), and these traces are valid by construction."""
    strategies = list(dict.fromkeys(data["strategy"]))
    values = list(dict.fromkeys(data[dash])) if dash else [None]
    names = data["strategy"].to_numpy()
    dashes = data[dash].to_numpy() if dash else None
    traces = []
    for strategy in strategies:
        rows = names == strategy
        for v_i, value in enumerate(values):
            line = data[rows if dash is None else rows & (dashes == value)]
            trace = dict(type="scatter", x=line[x].to_numpy(), y=line[y].to_numpy(),
                         mode="lines+markers", legendgroup=strategy,
                         name=strategy if dash is None else f"{strategy}, "
                                                            f"{field_name(dash)}={value}",
                         line=dict(color=strategy_color(str(strategy)),
                                   dash=_STYLES[v_i % len(_STYLES)]))
            bars = error_bars(line, y)
            if bars is not None:
                trace["error_y"] = bars
            traces.append(trace)
    title = with_note(title, interval_note(data, [y]))
    layout = dict(title=dict(text=title), xaxis=dict(title=dict(text=field_name(x))),
                  yaxis=dict(title=dict(text=metric_label(y))), template=_white_template(),
                  height=380, legend=dict(title=dict(text="strategy")))
    return dict(data=traces, layout=layout)


def sweep_figures(table: pd.DataFrame, parameters: list[str]) -> list[dict]:
    """One chart per (varied field, metric): metric vs field value, a line per strategy."""
    if table.empty:
        return []
    metrics = [c for c in SWEEP_METRICS if c in table.columns]
    figures = []
    for param in parameters:
        others = [p for p in parameters if p != param]
        dash = others[0] if others else None
        data, note = table.sort_values(param), ""
        if dash is not None and data[dash].nunique() > MAX_DASH_VALUES:
            # A line per value of a long second parameter is unreadable and slow to build.
            values = np.sort(data[dash].unique())
            kept = values[np.linspace(0, values.size - 1, MAX_DASH_VALUES).round().astype(int)]
            data = data[data[dash].isin(kept)]
            note = f" ({MAX_DASH_VALUES} of {values.size} values of {field_name(dash)})"
        figures += [sweep_line_figure(data, param, metric, dash,
                                      f"{metric_label(metric)} vs {field_name(param)}{note}")
                    for metric in metrics]
    return figures


def sweep_figure(table: pd.DataFrame, param: str, metric: str,
                 dash: str | None = None) -> go.Figure:
    """One metric of a sweep vs one varied field (`dash`: a second field), for the
    dashboard."""
    data = table.sort_values(param)
    return go.Figure(sweep_line_figure(data, param, metric, dash,
                                       f"{metric_label(metric)} vs {field_name(param)}"))


@functools.cache
def _white_template() -> dict:
    return pio.templates["plotly_white"].to_plotly_json()
