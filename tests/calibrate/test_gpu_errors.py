"""What the replay of the agullo-dt serving runs takes from how they were measured
(calibrate.gpu_runs, calibrate.gpu_errors): ShareGPT's real lengths, the API server's tokenizer
load on each adapter's first request, the overloaded hour's backlog, and vLLM's own counters."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import numpy as np
import pytest

from calibrate.gpu_data.export import REPO_DATA
from calibrate.gpu_errors import ENGINE_METRICS, load_engine_metrics, measured_state
from calibrate.gpu_runs import (
    CLIENT_MAX_IN_FLIGHT,
    MAX_PROMPT_TOKENS,
    MAX_TOTAL_TOKENS,
    api_server_blocks,
    backlog,
    draw_lengths,
    load_serving_runs,
    run_workload,
    sharegpt_pairs,
    with_api_server_blocks,
)
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY, first_request_gaps


@pytest.fixture(scope="module")
def run():
    return load_serving_runs(DATA_DIR / RUNS_SUMMARY)[0]


def _quartile_ratio(x) -> float:
    q1, q3 = np.percentile(x, [25, 75])
    return q3 / q1


def test_sharegpt_lengths_keep_the_runs_means_and_the_clients_filter(run):
    rng = np.random.default_rng(0)
    prompt, output = draw_lengths(rng, 50_000, run)
    assert prompt.mean() == pytest.approx(run.mean_prompt_tokens, rel=0.03)
    assert output.mean() == pytest.approx(run.mean_output_tokens, rel=0.03)
    assert prompt.min() >= 4 and output.min() >= 4
    assert prompt.max() <= MAX_PROMPT_TOKENS and (prompt + output).max() <= MAX_TOTAL_TOKENS


def test_sharegpt_first_turns_are_wider_than_the_lognormal_once_assumed(run):
    rng = np.random.default_rng(0)
    prompt, output = draw_lengths(rng, 50_000, run)
    old_prompt, old_output = draw_lengths(rng, 50_000, run, "lognormal")
    assert _quartile_ratio(prompt) > 1.5 * _quartile_ratio(old_prompt)
    assert _quartile_ratio(output) > 1.5 * _quartile_ratio(old_output)
    pairs = sharegpt_pairs()
    assert len(pairs) > 10_000 and (pairs[:, 0] <= MAX_PROMPT_TOKENS).all()


def test_an_unknown_length_distribution_is_refused(run):
    with pytest.raises(ValueError, match="lengths='uniform'; allowed: sharegpt, lognormal"):
        draw_lengths(np.random.default_rng(0), 3, run, "uniform")


def test_each_adapters_first_request_waits_a_third_of_a_second_in_the_warmups():
    # The slice keeps each run's first 1,000 steps: the warm-up requests after the first, 101
    # steps each in the six runs of 100 output tokens (9 each), 201 in the two of 200 (4 each).
    gaps = first_request_gaps()
    assert len(gaps) == 6 * 9 + 2 * 4
    assert 0.25 < float(np.median(gaps)) < 0.40
    assert min(gaps) > 0.2


def test_tokenizer_loads_queue_behind_each_other(run):
    # Every adapter's first request within microseconds of the start: the loads run back to back.
    hot = replace(run, adapter_rates=(1e9,) * 3)
    blocks = api_server_blocks(hot, 0.5, np.random.default_rng(0))
    assert blocks[:, 1] == pytest.approx([0.0, 0.5, 1.0], abs=1e-6)
    assert blocks[:, 2] == pytest.approx([0.5, 1.0, 1.5], abs=1e-6)


def test_api_server_blocks_delay_the_share_of_requests_they_cover(run):
    ttft = np.full(200_000, 0.05)
    held = with_api_server_blocks(ttft, run, 0.3)
    assert (held >= ttft).all()
    # First requests (128 of ~10,100 an hour) plus requests arriving or getting their first
    # token inside one of the 128 loads of 0.3 s: about 1.3% + 1.1%.
    share = float((held > ttft).mean())
    assert 0.018 < share < 0.030
    assert np.percentile(held, 99) > 0.2
    assert (with_api_server_blocks(ttft, run, 0.0) == ttft).all()


def test_the_backlog_follows_the_adapters_rates(run):
    adapters = backlog(run, np.random.default_rng(0), 100_000)
    share = np.bincount(adapters, minlength=len(run.adapter_rates)) / 100_000
    rates = np.asarray(run.adapter_rates)
    assert share == pytest.approx(rates / rates.sum(), abs=0.002)
    assert CLIENT_MAX_IN_FLIGHT == 28232


def test_the_backlog_waits_ahead_of_the_window(run):
    plain = run_workload(run, 60.0, seed=0)
    queued = run_workload(run, 60.0, seed=0, num_backlog=500)
    assert queued.num_conversations == plain.num_conversations + 500
    assert (queued.conv_arrival_s[:500] == 0).all() and (queued.conv_arrival_s[500:] > 0).all()


def _cutter():
    path = REPO_DATA / "gpu" / "cut_agullo_engine_metrics.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engine_metrics_summarise_the_hours_steady_part():
    t = np.arange(0.0, 3630.0, 2.0)
    series = dict(time=t + 1000.0, num_running=np.where(t < 900, 0.0, 300.0),
                  num_waiting=t / 10, gpu_cache_usage_perc=np.full(t.size, 0.5),
                  num_preempted=t / 4)
    row = _cutter().summarize_run(series)
    assert row["running_median"] == 300 and row["kv_usage_median"] == 0.5
    assert row["preemptions_per_s"] == 0.25
    assert row["waiting_max"] == pytest.approx((3628 - 60) / 10, abs=0.2)
    # A series one poll longer than the others is cut to theirs.
    assert _cutter().summarize_run({**series, "time": np.append(series["time"], 1e9)}) == row
    # Ten minutes of samples hold no steady part.
    assert _cutter().summarize_run({k: v[:300] for k, v in series.items()}) is None


def test_measured_engine_state_of_a_test_run(run):
    metrics = load_engine_metrics(DATA_DIR / ENGINE_METRICS)
    assert len(metrics) > 800
    state = measured_state(metrics[run.run_id], run)
    assert 0 < state["kv_usage"] < 1 and state["running"] > 0
    # 12 running at 2.84 req/s of 196 tokens: one token each per 21.6 ms (its TPOT is 22.3 ms).
    assert state["token_interval_ms"] == pytest.approx(21.6, abs=0.3)


def test_an_overloaded_run_with_few_slots_fills_its_batch_behind_the_clients_backlog():
    # Llama-3.1-8B, 16 slots for 128 adapters, offered 207 req/s: vLLM held a median of about
    # 800 running requests (KV pool full) at 120 ms TPOT. Replayed from an empty engine the
    # adapters in slots run out of waiters and the batch stays small; behind the client's
    # in-flight requests it fills (band: within 40% of the measured TPOT, where the empty
    # replay is 3x fast; the profile prices these 2,048-token steps too cheaply, see
    # docs/gpu-errors.md).
    from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
    from calibrate.gpu_runs import replay_run
    from sim.cost.profile import load_profile

    run = load_serving_runs(DATA_DIR / RUNS_SUMMARY)[294]
    assert (run.max_loras, len(run.adapter_rates)) == (16, 128)
    coeffs = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").coefficients
    window = dict(window_s=90.0, warmup_s=30.0, lengths="sharegpt")
    empty_result, empty = replay_run(run, coeffs, num_backlog=0, **window)
    full_result, full = replay_run(run, coeffs, **window)
    assert empty["is_saturated"] and full["is_saturated"]

    def running(result):
        ts = result.timeseries
        return float(ts[ts["time_s"] > 30.0]["num_running"].median())

    assert running(full_result) > 3 * running(empty_result)
    assert full_result.stats["num_sequences_left"] > CLIENT_MAX_IN_FLIGHT
    assert empty["tpot_p50_s"] < 0.5 * run.measured["tpot_p50_s"]
    assert full["tpot_p50_s"] == pytest.approx(run.measured["tpot_p50_s"], rel=0.4)


def test_a_light_run_gets_no_backlog(run):
    from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
    from calibrate.gpu_runs import replay_run
    from sim.cost.profile import load_profile

    coeffs = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").coefficients
    result, scores = replay_run(run, coeffs, window_s=120.0, warmup_s=20.0)
    assert not scores["is_saturated"] and result.stats["num_sequences_left"] < 100
