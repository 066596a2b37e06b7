"""The work term of the LoRA kernels' computing programs fitted on light serving runs'
measured steps (calibrate.gpu_work_fit): a synthetic round trip recovers a known term, and the
fit's rows leave out every run the validation scores."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.gpu_errors import priced_decode_step_ms
from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
from calibrate.gpu_runs import load_serving_runs
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY
from calibrate.gpu_work_fit import (
    HELD_OUT_EVERY,
    MAX_FIT_TOKENS,
    MAX_STEP_TOKENS,
    fit_working_mac,
    fitting_rows,
    priced_mixed_step_ms,
)
from sim.cost.profile import load_profile

SHIPPED = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").coefficients
# One token of one adapter in a 220-token step (split-K 8) on Llama-3.1-8B: 8 x 224 shrink
# and 12,288 expand programs, 2,248,146,944 multiply-accumulates (tests/sim/test_lora_kernels).
PROGRAMS_220, MACS_220 = 8 * 224 + 12288, 2_248_146_944


def refit(mac: float):
    """What the step fit does with the term held at `mac`: its 220-token LoRA steps keep their
    price, so the per-program cost gives up what the work term takes."""
    program = SHIPPED.lora_working_program_s - mac * MACS_220 / PROGRAMS_220
    return SHIPPED.model_copy(update=dict(lora_working_mac_s=mac,
                                          lora_working_program_s=program))


@pytest.fixture(scope="module")
def runs():
    return {r.run_id: r for r in load_serving_runs(DATA_DIR / RUNS_SUMMARY)}


@pytest.fixture(scope="module")
def rows():
    return fitting_rows(SHIPPED)


def test_the_fit_rows_are_light_and_never_the_validations(rows):
    held = {r.run_id for r in load_serving_runs(DATA_DIR / RUNS_SUMMARY)[::HELD_OUT_EVERY]}
    assert len(rows) > 100
    assert not held & {r["run_id"] for r in rows}
    assert max(r["step_tokens"] for r in rows) < MAX_FIT_TOKENS


def test_a_known_work_term_is_recovered_from_steps_priced_with_it(rows, runs):
    truth = 6e-14
    synthetic = []
    for row in rows[:: max(1, len(rows) // 15)]:
        price, _ = priced_mixed_step_ms(runs[row["run_id"]], refit(truth), row["running"],
                                        row["num_prompts"])
        synthetic.append({**row, "measured_interval_ms": price})
    mac, coeffs, summary = fit_working_mac(refit, synthetic, runs)
    assert mac == pytest.approx(truth, rel=0.02)
    assert coeffs.lora_working_mac_s == mac and summary["median_abs_error"] < 0.01
    assert summary["median_log_error_at_zero"] < 0


def test_light_steps_priced_under_their_measurement_keep_the_term_at_zero(rows, runs):
    cheaper = [{**r, "measured_interval_ms": 1.5 * r["priced_step_ms"]} for r in rows[:5]]
    mac, _, summary = fit_working_mac(refit, cheaper, runs)
    assert mac == 0.0 and np.isclose(summary["median_log_error_at_zero"], np.log(1.5))


def test_a_step_at_the_measured_composition_mixes_decodes_and_prompts(runs):
    run = next(iter(runs.values()))
    from sim.cost.cost_model import CostCoeffs

    coeffs = CostCoeffs()
    # No prompt: the decode step of priced_decode_step_ms.
    alone, tokens = priced_mixed_step_ms(run, coeffs, 40, 0.0)
    assert alone == pytest.approx(priced_decode_step_ms(run, coeffs, 40)) and tokens == 40
    # Half a prompt per step: half the steps hold one, the mean of the two prices.
    one, one_tokens = priced_mixed_step_ms(run, coeffs, 40, 1.0)
    half, half_tokens = priced_mixed_step_ms(run, coeffs, 40, 0.5)
    assert one > alone and one_tokens == 40 + round(run.mean_prompt_tokens)
    assert half == pytest.approx((alone + one) / 2) and half_tokens == (40 + one_tokens) / 2
    # Prompts beyond the budget are cut to it.
    _, full = priced_mixed_step_ms(run, coeffs, 1000, 100.0)
    assert full == MAX_STEP_TOKENS
