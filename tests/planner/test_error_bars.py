"""The charts' error bars are the interval the tables print: interval columns written by the
planner from the profile's measured errors, drawn by the pure figure builders."""

from __future__ import annotations

import pandas as pd
import pytest

from planner.outputs.interval_columns import with_intervals
from planner.outputs.plan_figures import plan_latency_figure, sim_latency_figure
from planner.outputs.plan_table import people_plan_table
from planner.outputs.sim_figures import throughput_figure
from planner.predict.intervals import ProfileErrors

ERRORS = ProfileErrors("h100-test", {"ttft_p99_s": (-0.2, 0.0, 0.25),
                                     "throughput_tokens_per_s": (0.1, -0.1)})


def _plans() -> pd.DataFrame:
    return pd.DataFrame([
        dict(strategy="lora", gpu="H100", is_feasible=True, num_gpus=2, tensor_parallel_size=1,
             num_replicas=2, cost_per_hour_usd=6.0, max_num_seqs=64, max_loras=8,
             ttft_p99_s=0.5, ttft_p99_s_min=0.4, ttft_p99_s_max=0.6, output_tokens_per_s=900.0),
        dict(strategy="direft", gpu="L4", is_feasible=True, num_gpus=1, tensor_parallel_size=1,
             num_replicas=1, cost_per_hour_usd=1.0, max_num_seqs=64, max_loras=8,
             ttft_p99_s=0.8, ttft_p99_s_min=0.7, ttft_p99_s_max=1.0, output_tokens_per_s=300.0),
    ])


def test_plan_chart_error_bars_are_the_table_interval() -> None:
    plans = _plans()
    errors = {"H100": ERRORS, "L4": None}
    fig = plan_latency_figure(with_intervals(plans, errors, 0.9))
    table = people_plan_table(plans, errors, 0.9)
    for trace in fig.data:
        row = plans[plans["strategy"] == trace.name].iloc[0]
        cell = table[table["Strategy"] == trace.name]["p99 TTFT (s)"].iloc[0]
        band = cell.split("(")[1].rstrip(")").removeprefix("seeds ")
        low, high = (float(x) for x in band.split("-"))
        value = trace.y[0]
        assert value == pytest.approx(row["ttft_p99_s"])
        # The bar spans the interval the table prints (to the table's rounding).
        assert value - trace.error_y.arrayminus[0] == pytest.approx(low, rel=0.01)
        assert value + trace.error_y.array[0] == pytest.approx(high, rel=0.01)
    lora = next(t for t in fig.data if t.name == "lora")
    direft = next(t for t in fig.data if t.name == "direft")
    # The measured error widens the seeds' spread; without one the bar is the spread itself.
    assert lora.error_y.array[0] > 0.6 - 0.5 and lora.error_y.arrayminus[0] > 0.5 - 0.4
    assert direft.error_y.array[0] == pytest.approx(0.2)
    assert direft.error_y.arrayminus[0] == pytest.approx(0.1)
    assert "no measured error" in fig.layout.title.text
    assert "no measured error" in " ".join(direft.customdata[:, 0])


def test_sim_charts_error_bars_from_single_run_summary() -> None:
    summary = pd.DataFrame([dict(strategy="lora", ttft_p50_s=0.1, ttft_p99_s=0.5,
                                 output_tokens_per_s=1000.0, goodput_turns_per_s=2.0)])
    charted = with_intervals(summary, {"H100": ERRORS}, 0.9, default_gpu="H100")
    latency = sim_latency_figure(charted)
    p99 = latency.data[0]
    i = list(p99.x).index("TTFT p99")
    # No seeds' spread: the bar is the profile's measured band alone, 0.5 / (1 + e).
    assert p99.error_y.array[i] > 0 and p99.error_y.arrayminus[i] > 0
    assert 0.5 + p99.error_y.array[i] <= 0.5 / (1 - 0.2) + 1e-9
    p50 = list(p99.x).index("TTFT p50")  # no measured error for p50: no band, says so
    assert p99.error_y.array[p50] == 0
    tput = throughput_figure(charted)
    assert tput.data[0].error_y.array[0] > 0
    assert tput.data[1].error_y.array[0] == 0
    assert "no measured error" in tput.layout.title.text


def test_no_interval_columns_no_error_bars() -> None:
    summary = pd.DataFrame([dict(strategy="lora", ttft_p99_s=0.5, output_tokens_per_s=1.0,
                                 goodput_turns_per_s=1.0)])
    assert sim_latency_figure(summary).data[0].error_y.array is None
    assert throughput_figure(summary).data[0].error_y.array is None


def test_report_keeps_a_value_and_its_interval_on_one_line() -> None:
    from planner.outputs.report import ReportSection, render_html

    table = people_plan_table(_plans(), {"H100": ERRORS, "L4": None}, 0.9)
    page = render_html("t", "s", [ReportSection("Capacity plan", tables=[table])], "")
    cell = table["p99 TTFT (s)"].iloc[0]
    assert f"<span class=nw>{cell}</span>" in page


def _trials() -> pd.DataFrame:
    return pd.DataFrame([
        dict(strategy="lora", gpu="H100", cost_per_hour_usd=6.0, meets_slo=True,
             tensor_parallel_size=1, num_replicas=2, max_num_seqs=64, ttft_p99_s=0.5,
             tpot_p99_s=0.02, e2e_p99_s=2.0, e2e_p99_s_min=1.8, e2e_p99_s_max=2.4),
        dict(strategy="lora", gpu="L4", cost_per_hour_usd=2.0, meets_slo=False,
             tensor_parallel_size=1, num_replicas=2, max_num_seqs=64, ttft_p99_s=0.9,
             tpot_p99_s=0.05, e2e_p99_s=5.0, e2e_p99_s_min=4.0, e2e_p99_s_max=6.5),
    ])


def test_pareto_error_bars_are_the_trials_interval() -> None:
    from planner.outputs.plan_figures import pareto_figure

    errors = ProfileErrors("h100-test", {"e2e_p99_s": (-0.2, 0.0, 0.25)})
    charted = with_intervals(_trials(), {"H100": errors, "L4": None}, 0.9)
    fig = pareto_figure(charted)
    by_cost = {t.x[0]: t for t in fig.data}
    for _, row in charted.iterrows():
        trace = by_cost[row["cost_per_hour_usd"]]
        assert trace.y[0] == row["e2e_p99_s"]
        assert trace.y[0] + trace.error_y.array[0] == pytest.approx(row["e2e_p99_s_high"])
        assert trace.y[0] - trace.error_y.arrayminus[0] == pytest.approx(row["e2e_p99_s_low"])
    # The measured error widens the seeds' spread on H100; on L4 the bar is the spread.
    assert by_cost[6.0].error_y.array[0] > 2.4 - 2.0
    assert by_cost[2.0].error_y.array[0] == pytest.approx(1.5)
    assert "no measured error" in fig.layout.title.text
    assert pareto_figure(_trials()).data[0].error_y.array is None  # no interval columns


def test_sweep_lines_carry_the_interval_as_error_bars() -> None:
    from planner.outputs.sweep_figures import sweep_figure

    table = pd.DataFrame([
        dict(point="p1", context=512, strategy="lora", ttft_p99_s=0.5),
        dict(point="p2", context=4096, strategy="lora", ttft_p99_s=1.0)])
    charted = with_intervals(table, {"H100": ERRORS}, 0.9, default_gpu="H100")
    fig = sweep_figure(charted, "context", "ttft_p99_s")
    assert fig.layout.title.text.startswith("p99 TTFT (s) vs context")  # named, with its unit
    assert fig.layout.yaxis.title.text == "p99 TTFT (s)"
    [trace] = fig.data
    assert list(trace.x) == [512, 4096]
    highs = charted["ttft_p99_s_high"] - charted["ttft_p99_s"]
    assert list(trace.error_y.array) == pytest.approx(list(highs)) and min(highs) > 0
    assert sweep_figure(table, "context", "ttft_p99_s").data[0].error_y.array is None
