"""The capacity plan for people: named columns with units, rounded values, intervals."""

from __future__ import annotations

import pandas as pd

from planner.outputs.plan_table import people_plan_table
from planner.predict.intervals import ProfileErrors

ROW = dict(strategy="multi_lora", is_feasible=True, gpu="H100-SXM", num_gpus=4,
           tensor_parallel_size=1, num_replicas=4, cost_per_hour_usd=12.3456,
           cost_per_million_tokens_usd=0.123456, per_replica_rate_per_s=3.14159,
           max_num_seqs=256, max_loras=8, ttft_p99_s=0.123456, ttft_p99_s_min=0.12,
           ttft_p99_s_max=0.13, tpot_p99_s=0.0123, tpot_p99_s_min=0.012, tpot_p99_s_max=0.0125,
           e2e_p99_s=2.5, e2e_p99_s_min=2.4, e2e_p99_s_max=2.6, output_tokens_per_s=1234.5,
           output_tokens_per_s_min=1200.0, output_tokens_per_s_max=1300.0)


def test_columns_are_named_with_units_and_values_rounded_with_their_interval():
    # The engine took 2x the predicted p99 TTFT on every validated workload.
    errors = {"H100-SXM": ProfileErrors("h100-prof", {"ttft_p99_s": (-0.5, -0.5)})}
    plans = pd.DataFrame([ROW, dict(strategy="mol", is_feasible=False, reason="too slow")])
    table = people_plan_table(plans, errors)
    row = table.iloc[0]
    assert row["Deployment"] == "4 x H100-SXM (TP 1, 4 replicas)"
    assert row["Cost ($/h)"] == "12.35" and row["Cost ($/M output tokens)"] == "0.123"
    assert row["p99 TTFT (s)"] == "0.123 (0.24-0.26)"  # seeds 0.12-0.13, x2
    # No measured TPOT or output error: the seeds' spread alone, and says so.
    assert row["p99 TPOT (ms)"] == "12.3 (seeds 12-12.5)"
    assert row["Output (tok/s)"] == "1,234 (seeds 1,200-1,300)"
    assert row["p99 E2E (s)"] == "2.5 (seeds 2.4-2.6)"
    assert row["Interval (90%)"] == "seeds x measured error (2 workloads)"
    assert table.iloc[1]["Deployment"] == "no plan" and table.iloc[1]["Why"] == "too slow"
    assert not any("_" in c for c in table.columns)  # no raw snake_case names


def test_a_gpu_without_measured_error_says_so():
    table = people_plan_table(pd.DataFrame([ROW]), {})
    assert table.iloc[0]["Interval (90%)"] == "seeds only: no measured error"
    assert table.iloc[0]["p99 E2E (s)"] == "2.5 (seeds 2.4-2.6)"
    one_seed = {k: v for k, v in ROW.items() if not k.endswith(("_min", "_max"))}
    single = people_plan_table(pd.DataFrame([one_seed]), {}).iloc[0]
    assert single["p99 TTFT (s)"] == "0.123"  # nothing measured, no spread: the value alone
    validated = people_plan_table(pd.DataFrame([one_seed]), {
        "H100-SXM": ProfileErrors("p", {"ttft_p99_s": (0.0, 0.1)})}).iloc[0]
    assert validated["p99 E2E (s)"] == "2.5 (no measured error)"  # its validation lacks E2E
    assert validated["p99 TTFT (s)"].startswith("0.123 (0.")


def test_a_saved_plan_table_shows_the_intervals_it_was_written_with(tmp_path):
    from planner.outputs.interval_columns import with_intervals
    from planner.outputs.plan_table import NO_INTERVAL
    from planner.outputs.report import write_table
    from planner.outputs.saved import load_output_folder

    errors = {"H100-SXM": ProfileErrors("h100-prof", {"ttft_p99_s": (-0.5, -0.4, -0.3)})}
    plans = pd.DataFrame([ROW, dict(strategy="mol", is_feasible=False, reason="too slow")])
    live = people_plan_table(plans, errors)
    write_table(with_intervals(plans, errors), tmp_path / "tables" / "plans")
    saved = load_output_folder(tmp_path).tables["plans"]
    # Read back with no profile at hand: the same table, interval and its source included.
    pd.testing.assert_frame_equal(people_plan_table(saved), live)
    assert live.iloc[0]["Interval (90%)"] == "seeds x measured error (3 workloads)"
    old = people_plan_table(plans)  # a table written before the interval columns existed
    assert old.iloc[0]["p99 TTFT (s)"] == "0.123" and old.iloc[0]["Interval (90%)"] == NO_INTERVAL


def test_a_sentence_value_carries_its_unit_and_interval_or_says_no_measured_error():
    from planner.outputs.plan_table import interval_phrase

    row = dict(x_s=0.123, x_s_low=0.1, x_s_high=0.16, x_s_measured_error=True)
    assert interval_phrase(row, "x_s", "s") == "0.123 s (0.1-0.16)"
    seeds = dict(row, x_s_low=0.12, x_s_high=0.13, x_s_measured_error=False)
    assert interval_phrase(seeds, "x_s", "s") == "0.123 s (seeds 0.12-0.13; no measured error)"
    single = dict(row, x_s_low=0.123, x_s_high=0.123, x_s_measured_error=False)
    assert interval_phrase(single, "x_s", "ms", 1e3) == "123 ms (no measured error)"


def test_the_plan_headline_gives_the_p99_ttft_with_its_interval():
    from planner.jobs.dashboard import PlanTables, plan_headline
    from planner.scenario.loading import load_scenario

    scenario = load_scenario("scenarios/default.yaml")
    plans = pd.DataFrame([dict(ROW, gpu="H100-64GB"), dict(ROW, gpu="H200", strategy="mol")])
    headline = plan_headline(scenario, PlanTables(plans, pd.DataFrame(), pd.DataFrame()))
    # The fitted H100-64GB profile's held-out errors widen the seeds' 0.12-0.13.
    band = headline.split("p99 TTFT 0.123 s (")[1].split(")")[0]
    low, high = (float(x) for x in band.split("-"))
    assert low < 0.12 or high > 0.13
    scaled = plan_headline(scenario, PlanTables(plans.iloc[1:], pd.DataFrame(), pd.DataFrame()))
    assert "p99 TTFT 0.123 s (seeds 0.12-0.13; no measured error)" in scaled
