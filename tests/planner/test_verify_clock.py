"""The clock rule of `molcap verify`: a measurement is compared with an interval only on the
clock that interval was measured on. The shipped CPU profile's validation timed the engine
thread's CPU seconds, so verify times that clock unless told otherwise, and a run on another
clock is said to be no like-for-like check instead of being counted against the interval."""

from __future__ import annotations

import json

import pytest

from app.verify import VerifyOptions, resolve_clock
from planner.outputs.verify_report import strategy_table, within_line
from planner.predict.intervals import ProfileErrors, load_profile_errors, profile_errors
from planner.scenario.schema import SloConfig
from planner.verify.checks import default_clock, strategy_entry
from sim.cost.profile import PROFILES_DIR

# Two requests: TTFT 0.1 and 0.3 s, 9 output tokens 0.8 s after the first.
RECORDS = [dict(arrival_s=0.0, first_token_s=t, finish_s=t + 0.8, num_output_tokens=9,
                num_prompt_tokens=10) for t in (0.1, 0.3)]
ERRORS_CPU = ProfileErrors("p", {"ttft_p50_s": (-0.5, 0.0)}, clock="cpu")


def _entry(clock: str, errors: ProfileErrors | None = ERRORS_CPU) -> dict:
    record = dict(strategy="s", clock=clock, records=RECORDS, measured={"ttft_p50_s": 0.2},
                  predicted={"ttft_p50_s": 0.15})
    return strategy_entry(record, {}, True, SloConfig(ttft_p99_s=1.0), errors)


def test_the_shipped_cpu_profile_is_validated_on_the_cpu_clock_and_verify_defaults_to_it():
    errors = load_profile_errors(PROFILES_DIR / "cpu-vllm-tiny-llama.yaml")
    assert errors is not None and errors.clock == "cpu"
    assert default_clock(errors, "cpu") == "cpu"
    assert resolve_clock(VerifyOptions(), errors, "cpu").clock == "cpu"
    # Asked for, the wall clock is kept (and then said to be no like-for-like check).
    assert resolve_clock(VerifyOptions(clock="wall"), errors, "cpu").clock == "wall"


def test_a_validation_naming_no_clock_is_wall_time_and_no_validation_follows_the_device():
    report = {"profile": "g", "rows": [dict(workload="w", metric="ttft_p50_s", error=0.1)]}
    assert profile_errors(report).clock == "wall"
    assert profile_errors(dict(report, clock="cpu")).clock == "cpu"
    assert default_clock(None, "cpu") == "cpu" and default_clock(None, "cuda") == "wall"


def test_the_cpu_clock_is_refused_on_a_gpu():
    with pytest.raises(ValueError, match="--clock cpu.*use --clock wall"):
        resolve_clock(VerifyOptions(clock="cpu"), None, "cuda")


def test_a_run_on_the_intervals_clock_is_counted_against_it():
    entry = _entry("cpu")
    assert entry["interval_clock"] == "cpu" and entry["is_like_for_like"]
    assert "measured inside the predicted 90% interval: 1 of 1 metrics" in within_line(entry)
    assert "on the cpu clock like this run" in within_line(entry)
    assert "interval (90%, cpu clock)" in strategy_table(entry)


def test_a_run_on_another_clock_is_said_to_be_no_like_for_like_check():
    entry = _entry("wall")
    assert entry["interval_clock"] == "cpu" and not entry["is_like_for_like"]
    line = within_line(entry)
    assert "not a like-for-like check" in line and "measured inside" not in line
    assert "interval is of the cpu clock" in line and "timed on the wall clock" in line
    assert "`--clock cpu`" in line
    assert "interval (90%, cpu clock)" in strategy_table(entry)


def test_without_a_measured_error_there_is_no_interval_and_no_clock_to_match():
    entry = _entry("wall", errors=None)
    assert entry["interval_clock"] is None and entry["is_like_for_like"]
    assert "no interval" in within_line(entry)


def test_the_validation_file_beside_a_profile_carries_its_clock(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\n")
    (tmp_path / "p.validation.json").write_text(json.dumps(
        {"profile": "p", "clock": "cpu",
         "rows": [dict(workload="w", metric="tpot_p50_s", error=-0.2)]}))
    assert load_profile_errors(profile).clock == "cpu"
