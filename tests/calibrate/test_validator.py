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
