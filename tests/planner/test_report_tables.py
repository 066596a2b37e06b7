"""The run report's tables are for people: every column named with its unit (no snake_case),
values rounded, intervals beside predicted values, the analytical tables saying they have no
measured error; the raw tables stay the CSV/parquet files."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from tiny_report import run_report, tiny_report_scenario

from planner.outputs.people_columns import column_name, people_table

TINY = tiny_report_scenario("tiny_report", ("multi_lora",), num_seeds=1)


@pytest.mark.parametrize("column,values,expected", [
    ("switch_s", [0.0123, 0.5], ("Switch (ms)", 1e3)),
    ("switch_s", [0.5, 2.0], ("Switch (s)", 1.0)),
    ("kv_gib", [1.0], ("KV (GiB)", 1.0)),
    ("weights_gib_per_gpu", [1.0], ("Weights (GiB per GPU)", 1.0)),
    ("routing_share", [0.1], ("Routing (%)", 100.0)),
    ("num_kv_blocks", [3], ("KV blocks", 1.0)),
    ("context_tokens", [512], ("Context (tokens)", 1.0)),
    ("lora_s", [0.001], ("LoRA (ms)", 1e3)),
    ("median_ape", [0.1], ("Median APE (%)", 100.0)),
])
def test_a_column_is_named_from_its_unit_suffix(column, values, expected):
    assert column_name(column, pd.Series(values)) == expected


def test_people_table_rounds_scales_and_drops_what_says_nothing():
    raw = pd.DataFrame({"strategy": ["a", "b"], "kind": ["lora", "lora"], "model": ["m", "m"],
                        "context_tokens": [1024, 65536], "switch_s": [0.0123456, float("nan")],
                        "routing_share": [0.123456, 0.5], "mechanism": ["replay", "none"]})
    table = people_table(raw)
    assert list(table.columns) == ["Strategy", "Context (tokens)", "Switch (ms)", "Routing (%)",
                                   "Mechanism"]  # kind and the one-valued model dropped
    assert list(table["Context (tokens)"]) == ["1,024", "65,536"]
    assert list(table["Switch (ms)"]) == ["12.3", "-"]
    assert list(table["Routing (%)"]) == ["12.3", "50"]


def test_every_table_of_the_run_report_is_for_people(tmp_path):
    result = run_report(tmp_path, "tiny.yaml", TINY)  # asserts no point failed
    page = result.report_path.read_text(encoding="utf-8")
    headers = re.findall(r"<th>(.*?)</th>", page)
    raw = [h for h in headers if "_" in h and h not in ("python",)]  # versions table aside
    assert headers and not raw, raw
    assert "no measured error" in page  # the analytical sections say so
    # The plan's p99 TTFT carries the fitted H100-64GB profile's measured interval.
    assert "seeds x measured error (205 workloads)" in page
    # The raw tables keep every column, unrounded, and the stored intervals.
    plans = pd.read_parquet(tmp_path / "out" / "tiny_report" / "tables" / "plans.parquet")
    assert {"ttft_p99_s", "ttft_p99_s_low", "ttft_p99_s_high", "interval_source"} <= set(plans)
    assert (plans["interval_profile"] == "h100-64gb-vllm085-llama-3.1-8b").all()
    switch = pd.read_csv(tmp_path / "out" / "tiny_report" / "tables" / "switch_cost.csv")
    assert "switch_s" in switch
