"""Figure builders turn result tables into plotly figures with one trace per strategy/series."""

import numpy as np
import pytest
from sim_configs import small_config

from planner.outputs import sim_figures as figures
from sim.simulate import simulate
from sim.workload.generate import conversation_workload


@pytest.fixture(scope="module")
def results():
    workload = conversation_workload(
        np.random.default_rng(0), num_conversations=4, num_turns=3, num_domains=4,
        switch_probability=0.5, num_initial_context_tokens=256, num_user_tokens=32,
        num_reply_tokens=16, think_time_s=0.1, arrival_rate_per_s=10.0)
    return {kind: simulate(small_config(kind), workload, timeseries_interval_s=0.0)
            for kind in ("multi_lora", "mol")}


def test_comparison_figures_have_a_trace_per_strategy(results):
    turns = figures.combine(results, "turns")
    assert len(figures.latency_cdf_figure(turns, "ttft_s").data) == 2
    breakdown = figures.hop_breakdown_figure(turns)
    assert {bar.name for bar in breakdown.data} == {
        "route", "prefill (handoff/replay)", "decode", "summary"}
    route = next(bar for bar in breakdown.data if bar.name == "route")
    assert route.y[list(route.x).index("mol")] > 0 == route.y[list(route.x).index("multi_lora")]
    assert len(figures.switch_cost_figure(turns).data) == 2
    gpu = {bar.name: bar for bar in figures.gpu_time_figure(turns).data}
    assert set(gpu) == set(figures.GPU_PIECES.values())
    routing = gpu["routing pass"]
    assert routing.y[list(routing.x).index("mol")] > 0 == \
        routing.y[list(routing.x).index("multi_lora")]
    summary = figures.summary_frame(results)
    assert list(summary["strategy"]) == ["multi_lora", "mol"]
    assert len(figures.throughput_figure(summary).data) == 2


def test_timeseries_figures(results):
    ts = figures.combine(results, "timeseries")
    assert len(figures.timeseries_figure(ts, "batch_size").data) == 2
    kv = results["mol"].kv_by_namespace
    names = {trace.name for trace in figures.kv_namespace_figure(kv).data}
    assert len(names) > 1 and all(n.startswith("adapter") for n in names)


def test_adapter_residency_follows_the_slots(results):
    ts = results["multi_lora"].timeseries
    masks = ts["resident_adapter_mask"]
    counts = masks.map(lambda m: bin(int(m)).count("1"))
    assert (counts == ts["num_resident_adapters"]).all() and masks.max() > 0
    fig = figures.adapter_residency_figure(ts[ts["replica"] == 0])
    assert sum(sum(row) for row in fig.data[0].z) == counts[ts["replica"] == 0].sum()
