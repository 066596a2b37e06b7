"""The validator's pure parts: summaries of turn records, comparison rows, goals, the table."""

from __future__ import annotations

import pytest

from calibrate import validator as v


def records(scale: float = 1.0) -> list[dict]:
    # Two requests: arrivals 0 and 1 s, first tokens 0.5 and 1.2 s, finishes 1.5 and 2.2 s,
    # 11 output tokens each, prompts of 100 tokens.
    return [dict(arrival_s=0.0, first_token_s=0.5 * scale, finish_s=1.5 * scale,
                 num_output_tokens=11, num_prompt_tokens=100),
            dict(arrival_s=1.0, first_token_s=1.0 + 0.2 * scale, finish_s=1.0 + 1.2 * scale,
                 num_output_tokens=11, num_prompt_tokens=100)]


def test_summary_counts_from_arrival():
    s = v.summarize_turns(records())
    assert s["throughput_tokens_per_s"] == pytest.approx(222 / 2.2)
    assert s["ttft_p50_s"] == pytest.approx(0.35)  # TTFTs 0.5 and 0.2
    assert s["tpot_p50_s"] == pytest.approx(0.1)  # (finish - first) / 10 tokens
    assert s["e2e_p99_s"] == pytest.approx(1.2 + 0.3 * 0.99)  # E2Es 1.5 and 1.2


def test_compare_reports_median_spread_and_signed_error():
    runs = [v.summarize_turns(records(s)) for s in (1.0, 1.1, 1.2)]
    predicted = v.summarize_turns(records(1.1))
    rows = {r["metric"]: r for r in v.compare("w offline", runs, predicted)}
    assert rows["ttft_p50_s"]["error"] == pytest.approx(0.0)
    assert rows["ttft_p50_s"]["run_spread"] == pytest.approx(0.2 / 1.1)
    assert rows["ttft_p50_s"]["num_runs"] == 3


def test_goals_count_throughput_only_where_the_engine_was_saturated():
    runs = [v.summarize_turns(records())]
    wrong = {k: 2 * x for k, x in v.summarize_turns(records()).items()}
    rows = v.compare("lora 12/s", runs, wrong) + v.compare("lora offline", runs, runs[0])
    goals = {g["family"]: g for g in v.goal_summary(rows)}
    assert goals["throughput"]["median_abs_error"] == 0.0 and goals["throughput"]["meets_goal"]
    assert goals["tpot"]["median_abs_error"] == pytest.approx(0.5)  # both workloads count
    assert not goals["tpot"]["meets_goal"]


def test_drift_factor_is_the_reference_probes_measured_over_priced_seconds():
    # Steps measured 3 + 5 = 8 ms, priced 2 + 2 = 4 ms: the machine runs at half the speed.
    assert v.drift_factor([0.003, 0.005], [0.002, 0.002]) == pytest.approx(2.0)


def test_drift_scaling_multiplies_latencies_and_divides_throughput():
    predicted = {"throughput_tokens_per_s": 100.0, "ttft_p50_s": 0.2, "e2e_p99_s": 1.0}
    assert v.scale_prediction(predicted, 1.25) == pytest.approx(
        {"throughput_tokens_per_s": 80.0, "ttft_p50_s": 0.25, "e2e_p99_s": 1.25})
    # Open loop, below saturation, the throughput is the offered load: it stays.
    assert v.scale_prediction(predicted, 1.25, is_saturated=False)[
        "throughput_tokens_per_s"] == pytest.approx(100.0)


def test_compare_scales_each_run_by_its_own_drift_factor():
    runs = [v.summarize_turns(records(1.2)), v.summarize_turns(records(1.0))]
    predicted = v.summarize_turns(records(1.0))
    rows = {r["metric"]: r for r in v.compare("w 12/s", runs, predicted, drifts=[1.2, 1.2])}
    # TTFT p50 predicted 0.35 s, measured 0.42 and 0.35 s (median 0.385): raw -9.1%. Each run
    # against 0.35 x its own factor (0.42 both): 0 and +20%, median +10% (scaling the median
    # run instead would give 0.42 / 0.385 - 1 = +9.1%).
    assert rows["ttft_p50_s"]["error"] == pytest.approx(0.35 / 0.385 - 1)
    assert rows["ttft_p50_s"]["error_drift_scaled"] == pytest.approx(0.10)
    assert rows["ttft_p50_s"]["drift_factor"] == pytest.approx(1.2)
    scaled = {g["family"]: g for g in v.goal_summary(list(rows.values()), "error_drift_scaled")}
    assert scaled["tpot"]["median_abs_error"] == pytest.approx(0.10)
    unscaled = v.compare("w 12/s", runs, predicted)
    assert v.goal_summary(unscaled, "error_drift_scaled") == []
