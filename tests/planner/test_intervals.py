"""Intervals on predicted numbers: the seeds' spread scaled by the measured held-out error of
the profile that priced them; "no measured error" when the profile has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.predict.intervals import (
    ProfileErrors,
    format_interval,
    load_profile_errors,
    metric_interval,
    profile_errors,
    slo_values,
    trial_intervals,
)


def _report(rows):
    return {"profile": "p", "rows": [dict(workload=w, metric=m, error=e) for w, m, e in rows]}


def test_known_validation_errors_give_the_expected_band(tmp_path):
    # Two workloads: the profile predicted p99 TTFT 50% low (the engine took 2x) and exactly.
    # measured / predicted is then 2.0 and 1.0; at confidence 0.5 the band is the 25th-75th
    # percentile of those two ratios: 1.25x-1.75x.
    report = _report([("a 1/s", "ttft_p99_s", -0.5), ("b 1/s", "ttft_p99_s", 0.0)])
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\n")
    (tmp_path / "p.validation.json").write_text(json.dumps(report))
    errors = load_profile_errors(profile)
    interval = metric_interval("ttft_p99_s", 0.1, 0.09, 0.12, errors, confidence=0.5)
    assert interval.low == pytest.approx(0.09 * 1.25)
    assert interval.high == pytest.approx(0.12 * 1.75)
    assert interval.has_measured_error
    assert format_interval("ttft_p99_s", interval) == "0.1 s (0.11-0.21)"
    full = metric_interval("ttft_p99_s", 0.1, 0.1, 0.1, errors, confidence=1.0)
    assert (full.low, full.high) == pytest.approx((0.1, 0.2))


def test_throughput_errors_come_from_workloads_of_the_predictions_arrival_kind():
    report = _report([("x offline", "throughput_tokens_per_s", 0.25),
                      ("y 12/s", "throughput_tokens_per_s", -0.02)])
    offline = profile_errors(report, offline=True)
    assert offline.errors == {"throughput_tokens_per_s": (0.25,)}
    # Predicted 25% high: the engine delivers 0.8x; output tokens/s shares the error.
    interval = metric_interval("output_tokens_per_s", 1000.0, 1000.0, 1000.0, offline)
    assert (interval.low, interval.high) == pytest.approx((800.0, 800.0))
    # An open-loop prediction (the planner's, verify's) is priced by the open-loop workloads:
    # the offline capacity error would push its band off the offered load it serves.
    open_loop = profile_errors(report)
    assert open_loop.errors == {"throughput_tokens_per_s": (-0.02,)}
    interval = metric_interval("output_tokens_per_s", 1000.0, 1000.0, 1000.0, open_loop)
    assert interval.low == pytest.approx(1000.0 / 0.98)


def test_an_open_loop_scenarios_pricing_errors_leave_out_the_offline_throughput():
    from planner.predict.intervals import pricing_errors
    from planner.scenario.loading import load_scenario
    from sim.cost.profile import PROFILES_DIR

    scenarios = Path(__file__).resolve().parents[2] / "scenarios"
    errors = pricing_errors(load_scenario(scenarios / "verify_cpu.yaml"), "cpu", scenarios)
    shipped = json.loads((PROFILES_DIR / "cpu-vllm-tiny-llama.validation.json").read_text())
    expected = [r["error"] for r in shipped["rows"] if r["metric"] == "throughput_tokens_per_s"
                and "offline" not in r["workload"]]
    assert expected and errors.errors["throughput_tokens_per_s"] == pytest.approx(tuple(expected))


def test_a_profile_without_validation_says_no_measured_error(tmp_path):
    profile = tmp_path / "q.yaml"
    profile.write_text("name: q\n")
    assert load_profile_errors(profile) is None and load_profile_errors(None) is None
    interval = metric_interval("e2e_p99_s", 2.0, 1.9, 2.2, None)
    assert (interval.low, interval.high, interval.has_measured_error) == (1.9, 2.2, False)
    assert format_interval("e2e_p99_s", interval) == "2 s (seeds 1.9-2.2; no measured error)"


def test_slo_values_at_a_confidence_never_go_below_the_point_estimate():
    # A profile that over-predicts latency (engine 0.5x) must not make the SLO check laxer.
    errors = ProfileErrors("p", {"ttft_p99_s": (1.0,), "e2e_p99_s": (-0.5,)})
    mean, low, high = ({"ttft_p99_s": 1.0, "e2e_p99_s": 1.0, "output_tokens_per_s": 10.0},
                       {"ttft_p99_s": 0.9, "e2e_p99_s": 0.9, "output_tokens_per_s": 9.0},
                       {"ttft_p99_s": 1.1, "e2e_p99_s": 1.1, "output_tokens_per_s": 11.0})
    checked = slo_values(mean, low, high, errors, 0.9)
    assert checked["ttft_p99_s"] == 1.0  # 1.1 x 0.5 = 0.55 is below the mean: the mean stays
    assert checked["e2e_p99_s"] == pytest.approx(2.2)  # 1.1 x 2
    assert checked["output_tokens_per_s"] == 10.0  # not a latency: unchanged
    assert slo_values(mean, low, high, errors, None) == mean
    assert set(trial_intervals(mean, low, high, errors)) == set(mean)


def test_the_shipped_cpu_profile_has_its_measured_errors_beside_it():
    from sim.cost.profile import PROFILES_DIR

    errors = load_profile_errors(PROFILES_DIR / "cpu-vllm-tiny-llama.yaml")
    assert errors is not None and errors.profile == "cpu-vllm-tiny-llama"
    assert len(errors.errors["ttft_p99_s"]) >= 10


def test_a_plan_row_prints_each_p99_with_its_interval_and_the_confidence_cost():
    from planner.predict.intervals import plan_row_text

    row = dict(ttft_p99_s=0.123, ttft_p99_s_min=0.12, ttft_p99_s_max=0.13, tpot_p99_s=0.01,
               e2e_p99_s=2.0, confidence_extra_gpus=2)
    errors = ProfileErrors("p", {"ttft_p99_s": (-0.5,), "e2e_p99_s": (0.0,)})
    assert plan_row_text(row, errors, 0.9) == (
        "p99 TTFT 0.123 s (0.24-0.26), p99 TPOT 0.01 s (no measured error), p99 E2E 2 s (2-2) "
        "(90% intervals); the confidence costs +2 GPUs over the point estimate")
    spread = dict(tpot_p99_s=0.01, tpot_p99_s_min=0.009, tpot_p99_s_max=0.012)
    assert plan_row_text(spread, errors, 0.9) == (
        "p99 TPOT 0.01 s (seeds 0.009-0.012; no measured error) (90% intervals)")
    assert plan_row_text({"e2e_p99_s": 2.0}, None, 0.9) == (
        "p99 E2E 2 s (2-2) (90% intervals; no measured error: seeds only)")


def test_a_plan_priced_by_the_h100_64gb_profile_prints_a_measured_interval():
    # The fitted H100-64GB profile carries its held-out serving-run errors (TTFT and TPOT
    # came out low on those runs, so the interval reaches above the point estimate); the
    # scaled profiles carry none and say so.
    from planner.predict.intervals import plan_row_text, pricing_errors
    from planner.scenario.loading import load_scenario

    scenario = load_scenario("scenarios/default.yaml")
    row = dict(ttft_p99_s=0.5, tpot_p99_s=0.05)
    h100 = pricing_errors(scenario, "H100-64GB")
    assert h100 is not None and h100.profile == "h100-64gb-vllm085-llama-3.1-8b"
    text = plan_row_text(row, h100, 0.9)
    assert "no measured error" not in text
    ttft_high = float(text.split("p99 TTFT 0.5 s (")[1].split(")")[0].split("-")[1])
    assert ttft_high > 0.5
    scaled = pricing_errors(scenario, "H200")
    assert scaled is None
    assert "no measured error: seeds only" in plan_row_text(row, scaled, 0.9)


def test_the_h100_validation_beside_the_profile_is_the_one_the_gpu_validation_wrote():
    from calibrate.gpu_validate import DOCS, profile_validation
    from sim.cost.profile import PROFILES_DIR

    shipped = json.loads((PROFILES_DIR / "h100-64gb-vllm085-llama-3.1-8b.validation.json")
                         .read_text(encoding="utf-8"))
    result = json.loads((DOCS / "validation-gpu.json").read_text(encoding="utf-8"))
    assert shipped == json.loads(json.dumps(profile_validation(result)))
    assert not any(r["metric"].startswith("throughput") for r in shipped["rows"])
