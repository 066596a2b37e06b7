"""Run-level replay of agullo-dt serving runs (calibrate.gpu_runs) against measurements the fit
never saw: one light test-set run within a stated band."""

from __future__ import annotations

import pytest

from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
from calibrate.gpu_runs import load_serving_runs, predict_run
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY
from sim.cost.profile import load_profile


@pytest.fixture(scope="module")
def runs():
    return load_serving_runs(DATA_DIR / RUNS_SUMMARY)


def test_test_set_rows_carry_per_adapter_rates_and_ranks(runs):
    assert len(runs) == 820  # 990 rows, 170 without a result
    run = runs[0]
    assert len(run.adapter_rates) == len(run.adapter_ranks) == run.max_cpu_loras
    assert sum(run.adapter_rates) == pytest.approx(2.82, abs=0.01)


def test_a_light_held_out_run_replays_within_band(runs):
    # Llama-3.1-8B, max_loras 128, 128 adapters at 2.8 req/s (unsaturated). Band: throughput
    # within 10% (a 60 s window holds ~170 requests), TPOT p50 within 30% (the validation
    # doc's median for such runs is 15%: the fit saw no mixed prompt+decode LoRA steps).
    run = runs[0]
    coeffs = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").coefficients
    predicted = predict_run(run, coeffs, window_s=60.0)
    assert not predicted["is_saturated"]
    assert predicted["throughput_rps"] == pytest.approx(run.measured["throughput_rps"], rel=0.10)
    assert predicted["tpot_p50_s"] == pytest.approx(run.measured["tpot_p50_s"], rel=0.30)
