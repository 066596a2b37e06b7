"""Tables of variants for people: the Compare page's before/after change and a sweep's points,
with named columns and units, rounded values and the interval beside each value."""

from __future__ import annotations

import pandas as pd

from planner.jobs.dashboard import compare_summaries
from planner.outputs.interval_columns import with_intervals
from planner.outputs.variant_tables import people_change_table, people_sweep_table
from planner.predict.intervals import ProfileErrors

# The engine took 2x the predicted p99 TTFT on every validated workload.
ERRORS = ProfileErrors("h100-test", {"ttft_p99_s": (-0.5, -0.5)})


def _summary(ttft: float, tpot: float, tokens: float) -> pd.DataFrame:
    return pd.DataFrame([dict(strategy="lora", ttft_p99_s=ttft, tpot_p99_s=tpot,
                              output_tokens_per_s=tokens, slo_attainment=0.955)])


def test_the_change_table_names_metrics_with_units_and_shows_intervals():
    before, after = _summary(0.123456, 0.0123456, 1234.5), _summary(0.2, 0.0111, 1500.0)
    stacked, changes = compare_summaries(before, after)
    stacked = with_intervals(stacked, {"H100": ERRORS}, 0.9, default_gpu="H100")
    table = people_change_table(changes, stacked).set_index("Metric")
    assert list(table.columns) == ["Strategy", "Before", "After", "Change", "Change (%)"]
    ttft = table.loc["p99 TTFT (s)"]
    assert ttft["Before"] == "0.123 (0.247-0.247)"  # one run, x2: the measured band alone
    assert ttft["After"] == "0.2 (0.4-0.4)"
    assert ttft["Change"] == "+0.0765" and ttft["Change (%)"] == "+62%"
    tpot = table.loc["p99 TPOT (ms)"]  # in ms; the validation lacks TPOT and there is one run
    assert tpot["Before"] == "12.3 (no measured error)"
    assert tpot["Change"] == "-1.25" and tpot["Change (%)"] == "-10%"
    assert table.loc["Output (tok/s)", "Before"] == "1,234 (no measured error)"
    assert table.loc["SLO attainment (%)", "Change (%)"] == "+0.0%"
    assert not any("_" in m for m in table.index)  # no raw snake_case names


def test_the_sweep_table_names_the_varied_fields_and_marks_seed_only_bands():
    table = pd.DataFrame([
        {"point": "p1", "analysis.num_turn_context_tokens": 1024, "strategy": "lora",
         "gpu": "H100", "ttft_p99_s": 0.5, "ttft_p99_s_min": 0.4, "ttft_p99_s_max": 0.6,
         "decode_step_s": 0.0123},
        {"point": "p2", "analysis.num_turn_context_tokens": 4096, "strategy": "lora",
         "gpu": "L4", "ttft_p99_s": 0.5, "ttft_p99_s_min": 0.4, "ttft_p99_s_max": 0.6,
         "decode_step_s": 0.0234}])
    charted = with_intervals(table, {"H100": ERRORS, "L4": None}, 0.9)
    people = people_sweep_table(charted, ["analysis.num_turn_context_tokens"])
    assert list(people.columns) == ["num turn context tokens", "Strategy", "Decode step (ms)",
                                    "p99 TTFT (s)"]
    assert list(people["p99 TTFT (s)"]) == ["0.5 (0.8-1.2)", "0.5 (seeds 0.4-0.6)"]
    assert list(people["Decode step (ms)"]) == ["12.3", "23.4"]  # analytical: no interval
