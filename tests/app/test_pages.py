"""Every page of the dashboard under Streamlit's AppTest on the default scenario."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import yaml

from sim.hardware.catalogue import GPUS
from tests.app.conftest import no_exceptions, open_app, texts

CHART_PAGES = {
    "pages/2_latency.py": [
        "Throughput and goodput (turns within the SLOs)",
        "Simulated latency on the scenario's hardware",
        "Distribution of time to first token",
        "Where a turn's time goes (mean per turn)",
        "Time to first token after routing"],
    "pages/3_memory.py": [
        "KV blocks in use (blocks) over time",
        "Preemptions so far (count) over time",
        "KV blocks held by running sequences, per copy",
        "Adapters holding KV on the GPU over time",
        "Adapters in the GPU slots over time (one replica)",
        "Adapters in GPU slots (count) over time",
        "Adapter loads so far (count) over time"],
    "pages/4_switching.py": [
        "Cost of one domain switch (handoff vs bounded replay vs re-prefill)",
        "Routing overhead vs reply length (one decision per turn)",
        "Routing and switching overhead vs decision frequency",
        "KV memory per conversation",
        "Decode step time vs adapter mix (multi-LoRA vs PreFT)"],
}
"""The charts each page draws, by title, in order."""


def _summary(at):
    """The overview's people table (named columns, rounded values) with its turns/s as numbers."""
    table = at.dataframe[0].value.set_index("Strategy")
    turns = table["Turns (/s)"].str.replace(",", "").astype(float)
    return table.assign(turns_per_s=turns)


def test_overview_opens_on_the_default_scenario_with_results(in_workdir):
    at = open_app()
    no_exceptions(at)
    assert at.title[0].value == "molcap what-if: default"
    headline = texts(at.success) + texts(at.info)
    assert any("strategies meet the SLOs" in line for line in headline), headline
    summary = _summary(at)
    assert len(summary) == 9 and (summary["turns_per_s"] > 0).all()
    assert len(at.get("plotly_chart")) == 2


def test_changing_a_knob_changes_the_text_and_the_results(in_workdir):
    at = open_app()
    before = _summary(at)
    at.sidebar.number_input(key="knob:workload.arrival_rate_per_s").set_value(3.0).run()
    no_exceptions(at)
    assert "  arrival_rate_per_s: 3.0" in at.session_state["scenario_text"].splitlines()
    assert "# Default scenario" in at.session_state["scenario_text"]  # comments kept
    after = _summary(at)
    assert after.loc["multi_lora", "turns_per_s"] > 1.3 * before.loc["multi_lora", "turns_per_s"]
    assert any("At 3 conversations/s" in line for line in texts(at.success) + texts(at.info))


def test_narrowing_the_strategies(in_workdir):
    at = open_app()
    at.sidebar.multiselect(key="knob:strategies").set_value(["multi_lora", "mol"]).run()
    assert list(_summary(at).index) == ["multi_lora", "mol"]


def _array(value) -> np.ndarray:
    """A trace's x/y/z as Plotly's JSON holds it: a list, or base64 bytes with a dtype."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value)


def _charts(at) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def _traces(chart: dict) -> dict[str, dict[str, np.ndarray]]:
    return {t.get("name"): {axis: _array(t[axis]) for axis in ("x", "y", "z") if axis in t}
            for t in chart["data"]}


@pytest.mark.parametrize("page,titles", CHART_PAGES.items())
def test_chart_pages_draw_their_charts_from_data(in_workdir, page, titles):
    at = open_app(page)
    no_exceptions(at)
    charts = _charts(at)
    # A bar chart's error-bar note is a subtitle under its title.
    assert [c["layout"]["title"]["text"].split("<br>")[0] for c in charts] == titles
    for chart in charts:
        assert chart["data"], chart["layout"]["title"]
        for trace in chart["data"]:
            data = [_array(trace[axis]) for axis in ("y", "z") if axis in trace]
            assert data and all(d.size > 0 for d in data), (chart["layout"]["title"], trace)


def test_latency_bars_are_the_summary_numbers(in_workdir):
    at = open_app("pages/2_latency.py")
    [summary] = [d.value for d in at.dataframe]  # for people; the raw one is a download
    assert {b.label for b in at.get("download_button")} == {"sim_summary.csv",
                                                           "sim_summary.parquet"}
    bars = _traces(_charts(at)[0])
    for name, column in (("output tokens/s", "Output (tok/s)"),
                         ("goodput turns/s (right axis)", "Goodput (turns/s)")):
        assert list(bars[name]["x"]) == list(summary["Strategy"])
        shown = summary[column].str.split(" ").str[0].str.replace(",", "").astype(float)
        # The table rounds to three digits (whole numbers from 1,000 up).
        np.testing.assert_allclose(bars[name]["y"], shown.to_numpy(), rtol=5e-3)
    # Error bars on every bar, from the planner's interval columns; a profile without a
    # measured error says so (a single run has no seeds' spread: zero-length bars).
    chart = _charts(at)[0]
    for trace in chart["data"]:
        plus = _array(trace["error_y"]["array"])
        assert plus.size == len(summary) and (plus >= 0).all()
        if not plus.any():
            assert "no measured error" in chart["layout"]["title"]["text"]


def test_kv_in_use_stays_within_each_strategys_pool(in_workdir):
    # The memory page's KV-in-use lines (one per strategy and replica) against the pool sizes
    # in its own memory table: a chart fed the wrong column or scaled wrongly would cross them.
    at = open_app("pages/3_memory.py")
    memory = at.dataframe[0].value.set_index("Strategy")  # for people: named, rounded
    pools = memory["KV blocks"].str.replace(",", "").astype(int)
    lines = _traces(_charts(at)[0])
    assert {name.split(" / ")[0] for name in lines} == set(pools.index)
    for name, line in lines.items():
        assert 0 <= line["y"].min() and line["y"].max() <= pools[name.split(" / ")[0]], name
    assert max(line["y"].max() for line in lines.values()) > 0


def test_switch_cost_lines_are_the_switch_table(in_workdir):
    at = open_app("pages/4_switching.py")
    table = at.dataframe[0].value  # for people: switch cost in s or ms to three digits
    [switch] = [c for c in table.columns if c in ("Switch (s)", "Switch (ms)")]
    assert {"Strategy", "Context (tokens)", "Mechanism"} <= set(table.columns)
    lines = _traces(_charts(at)[0])
    assert lines
    for name, line in lines.items():
        rows = table[(table["Strategy"] == name) & (table[switch] != "-")]
        context = rows["Context (tokens)"].str.replace(",", "").astype(int).to_numpy()
        np.testing.assert_array_equal(line["x"], context)
        scale = 1e3 if switch == "Switch (ms)" else 1.0
        switch_s = rows[switch].str.replace(",", "").astype(float).to_numpy() / scale
        np.testing.assert_allclose(line["y"], switch_s, rtol=5e-3)


def test_a_knob_value_the_scenario_rejects_shows_the_located_error_inline(in_workdir):
    at = open_app()
    at.sidebar.number_input(key="knob:workload.num_initial_context_tokens").set_value(
        1_000_000).run()
    no_exceptions(at)
    inline = texts(at.sidebar.error)
    assert any("scenarios/default.yaml:" in m and "workload.num_turns: requests reach" in m
               for m in inline), inline
    assert any("does not validate" in m for m in texts(at.error))


def test_calibration_says_the_default_gpu_is_priced_by_a_scaled_profile(in_workdir):
    at = open_app("pages/8_calibration.py")  # the default scenario: H200, no GPU data of its own
    no_exceptions(at)
    assert any("scaled from H100 measurements" in m and "not measured on H200" in m
               for m in texts(at.info))
    assert not texts(at.success) and not texts(at.warning)
    table = at.dataframe[0].value
    assert "gemm_flops_efficiency" in set(table["coefficient"])
    # The validation rows are the markdown table for people plus raw downloads, no dump.
    assert len(at.dataframe) == 1
    assert {b.label for b in at.get("download_button")} == {"validation.csv",
                                                           "validation.parquet"}


def custom_gpu_scenario() -> str:
    """A scenario on a GPU no shipped profile covers: a catalogue H100 renamed and given 64 GB."""
    gpu = GPUS["H100-SXM"].model_dump(mode="json", exclude={"reported_memory_bytes"})
    del gpu["sources"]["reported_memory_bytes"]
    gpu.update(name="my-gpu", hbm_bytes=64e9)
    return yaml.safe_dump(dict(
        name="custom_gpu", model="qwen2.5-0.5b", hardware=dict(gpu=gpu),
        strategies=[{"kind": "base"}],
        workload=dict(kind="punica", num_requests=8, num_adapters=1, num_output_tokens=8,
                      arrival_rate_per_s=1.0)), sort_keys=False)


def test_calibration_says_assumed_defaults_for_a_gpu_without_a_profile(in_workdir):
    path = in_workdir / "scenarios" / "custom_gpu.yaml"
    path.write_text(custom_gpu_scenario(), encoding="utf-8")
    at = open_app("pages/8_calibration.py", scenario="scenarios/custom_gpu.yaml")
    no_exceptions(at)
    assert any("assumed defaults" in m and "my-gpu" in m for m in texts(at.warning))
    assert not texts(at.info) and not texts(at.success)


def test_compare_variants_shows_the_change(in_workdir):
    at = open_app("pages/6_compare.py")
    no_exceptions(at)
    at.number_input(key="compare_value:workload.arrival_rate_per_s").set_value(2.0).run()
    changes = at.dataframe[0].value
    # For people: metrics by name with units, each value rounded with its interval beside it.
    assert list(changes.columns) == ["Strategy", "Metric", "Before", "After", "Change",
                                     "Change (%)"]
    assert not any("_" in m for m in changes["Metric"])
    rate = changes[(changes["Metric"] == "Output (tok/s)")
                   & (changes["Strategy"] == "multi_lora")].iloc[0]

    def number(cell: str) -> float:
        return float(cell.split(" ")[0].replace(",", ""))

    assert number(rate["After"]) > 1.3 * number(rate["Before"])
    assert rate["Change (%)"].startswith("+") and rate["Change (%)"].endswith("%")
    # The default scenario's H200 profile is scaled, with no measured error: no band shown.
    ttft = changes[changes["Metric"] == "p99 TTFT (s)"]
    assert ttft["Before"].str.fullmatch(r"[\d.]+").all(), list(ttft["Before"])
    assert len(at.get("plotly_chart")) >= 4


PROFILED = """\
name: profiled
model: vllm-tiny-llama
hardware: {gpu: cpu, profile: cpu-vllm-tiny-llama}
engine: {max_num_seqs: 8, max_loras: 2, block_size: 32, version: 0.32.0}
strategies:
  - kind: multi_lora
    adapters: [{name: a, rank: 8}, {name: b, rank: 8}]
workload: {kind: conversations, num_conversations: 4, num_turns: 2,
  num_initial_context_tokens: 64, num_user_tokens: 16, num_reply_tokens: 16,
  think_time_s: 1.0, arrival_rate_per_s: 1.0}
"""


def test_calibration_names_the_fitted_profile_that_priced_the_numbers(in_workdir):
    path = in_workdir / "scenarios" / "profiled.yaml"
    path.write_text(PROFILED, encoding="utf-8")
    at = open_app(scenario="scenarios/profiled.yaml")
    no_exceptions(at)
    assert any("Priced by profile cpu-vllm-tiny-llama" in c for c in texts(at.caption))
    at.switch_page("pages/8_calibration.py").run()
    assert any("fitted cost profile `cpu-vllm-tiny-llama`" in m for m in texts(at.success))
