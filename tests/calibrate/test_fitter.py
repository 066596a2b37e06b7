"""The fitter recovers known coefficients from samples generated with them."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.fitter import fit, predict_samples
from calibrate.recorder import StepSample, split_held_out
from sim.cost.cost_model import CostCoeffs
from sim.cost.layer_costs import create_layer_costs
from sim.hardware.catalogue import get_gpu, get_model

ARCH = get_model("vllm-tiny-llama")
GPU = get_gpu("cpu")
TRUE = CostCoeffs(gemm_flops_efficiency=0.3, attention_flops_efficiency=0.2,
                  memory_bandwidth_efficiency=0.5, step_overhead_s=3e-3,
                  per_sequence_overhead_s=4e-5, lora_slice_launch_s=2e-5,
                  lora_token_gather_share=1.0, lora_launch_overhead_s=1e-4,
                  lora_per_adapter_overhead_s=0.0)
TERMS = ("gemm_flops_efficiency", "attention_flops_efficiency", "memory_bandwidth_efficiency",
         "step_overhead_s", "per_sequence_overhead_s", "lora_slice_launch_s",
         "lora_token_gather_share")
PLACEMENTS = [(i, m) for i in range(4) for m in ("q_proj", "v_proj", "o_proj", "down_proj")]
PROFILES = {
    "base": create_layer_costs(ARCH, GPU),
    "lora": create_layer_costs(ARCH, GPU, adapter_kind="lora", adapter_rank=8,
                                adapter_placements=PLACEMENTS),
}


def synthetic_samples(coeffs: CostCoeffs, noise: float, seed: int = 0) -> list[StepSample]:
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(160):
        group = ("base", "lora")[i % 2]
        n = int(rng.integers(1, 32))
        is_prefill = i % 3 == 0
        new = rng.integers(16, 400, n) if is_prefill else np.ones(n, int)
        ctx = np.zeros(n, int) if is_prefill else rng.integers(1, 480, n)
        ids = rng.integers(0, 8, n) if group == "lora" else -np.ones(n, int)
        sample = StepSample(group, tuple(new.tolist()), tuple(ctx.tolist()),
                            tuple(ids.tolist()), tuple((ids >= 0).tolist()), 1.0,
                            tags={"probe": i // 4})
        true = predict_samples(coeffs, [sample], PROFILES)[0]
        samples.append(StepSample(**{**sample.__dict__,
                                     "measured_s": true * (1 + noise * rng.standard_normal())}))
    return samples


# The fit starts from the defaults on the fitted terms and the true values elsewhere.
START = TRUE.model_copy(update={t: getattr(CostCoeffs(), t) for t in TERMS})


def test_fit_recovers_known_coefficients():
    train, test = split_held_out(synthetic_samples(TRUE, noise=0.0))
    result = fit(train, TERMS, PROFILES, start=START, held_out=test)
    for term in TERMS:
        assert getattr(result.coeffs, term) == pytest.approx(getattr(TRUE, term), rel=0.02), term
    test_rows = [r for r in result.errors if r["split"] == "test" and r["group"] == "all"]
    assert test_rows and test_rows[0]["mape"] < 1e-3 and test_rows[0]["r2"] > 0.999


def test_fit_with_noise_reports_error_and_stays_close():
    train, test = split_held_out(synthetic_samples(TRUE, noise=0.05, seed=1))
    result = fit(train, TERMS, PROFILES, start=START, held_out=test)
    for term in TERMS:  # within four standard errors of the truth, and the errors are finite
        error = abs(getattr(result.coeffs, term) - getattr(TRUE, term))
        assert 0 < result.stderr[term] < abs(getattr(TRUE, term)), term
        assert error < 4 * result.stderr[term], (term, error, result.stderr[term])
    test_mape = next(r["mape"] for r in result.errors if r["split"] == "test"
                     and r["group"] == "all")
    assert 0.01 < test_mape < 0.1  # the noise shows up as error, not as a perfect fit


def test_fit_rejects_unknown_terms():
    with pytest.raises(ValueError, match="unknown coefficients"):
        fit(synthetic_samples(TRUE, 0.0)[:4], ("warp_speed",), PROFILES)


def test_adapter_load_fit_recovers_overhead_and_bandwidth_efficiency():
    from calibrate.fitter import fit_adapter_loads

    overhead, efficiency = 2e-3, 0.25
    rng = np.random.default_rng(0)
    loads = [dict(kind="activate", num_bytes=int(b),
                  seconds=overhead + b / (GPU.pcie_bandwidth_bytes_per_s * efficiency))
             for b in rng.integers(10**5, 10**7, 30)]
    loads += [dict(kind="load", num_bytes=10**6, seconds=0.05)] * 3
    coeffs, summary = fit_adapter_loads(loads, GPU)
    assert coeffs["adapter_load_overhead_s"] == pytest.approx(overhead, rel=1e-6)
    assert coeffs["adapter_load_bandwidth_efficiency"] == pytest.approx(efficiency, rel=1e-6)
    assert summary["load"]["num_loads"] == 3 and summary["load"]["median_s"] == 0.05
    assert summary["activate"]["fit_mape"] < 1e-6
    assert fit_adapter_loads(loads[-3:], GPU)[0] == {}  # no activations: nothing to fit


def test_thinning_keeps_every_kind_of_step_and_few_decodes_per_batch_probe():
    from calibrate.fitter import step_kind, thin_decode_steps

    def sample(new, **tags):
        n = len(new)
        return StepSample("lora", tuple(new), (5,) * n, (0,) * n, (True,) * n, 1e-3, tags=tags)

    batch = [sample([40] * 4, probe=1)] + [sample([1] * 4, probe=1) for _ in range(11)]
    staggered = [sample([1, 1], probe=2, stagger=2) for _ in range(9)] + [
        sample([40, 1], probe=2, stagger=2)]
    kept = thin_decode_steps(batch + staggered, keep=4)
    assert [step_kind(s) for s in kept].count("prefill") == 1
    assert sum(1 for s in kept if step_kind(s) == "decode" and "stagger" not in s.tags) == 4
    assert sum(1 for s in kept if s.tags.get("stagger")) == 10  # staggered probes untouched
    assert kept[1] is batch[1] and kept[4] is batch[-1]  # evenly spaced, both ends kept


def test_bucket_scales_weigh_a_small_bucket_like_a_large_one():
    from calibrate.fitter import _bucket_scales

    small = [StepSample("base", (100,), (0,), (-1,), (False,), 0.1)] * 4
    large = [StepSample("base", (1,), (50,), (-1,), (False,), 0.01)] * 64
    medians, weights = _bucket_scales(small + large, np.array([0.1] * 4 + [0.01] * 64))
    assert medians[0] == 0.1 and medians[-1] == 0.01  # errors relative to the bucket's median
    # Each bucket's summed squared weight is its size times its weight squared: equal.
    assert 4 * weights[0] ** 2 == pytest.approx(64 * weights[-1] ** 2)


def test_soft_l1_residuals_are_quadratic_near_zero_and_linear_far_out():
    from calibrate.fitter import soft_l1_residuals

    r = soft_l1_residuals(np.array([0.0, 0.01, 0.75, -0.75]), scale=0.25)
    assert r[0] == 0.0
    assert r[1] == pytest.approx(0.01, rel=1e-3)  # |e| << c: the residual is e
    # e = 3c: loss 2 c² (sqrt(10) - 1) = 0.27028, residual its square root, signed.
    assert r[2] == pytest.approx(0.519885, rel=1e-5) and r[3] == -r[2]


def test_a_few_steps_slowed_3x_do_not_silence_the_lora_engines_fixed_cost():
    # 1 in 40 steps took 3x its price (a neighbour job held the core). Squared residuals (the
    # fit before) put lora_slice_launch_s at 2.5x the truth; the soft-L1 loss keeps these
    # terms within 30% of it.
    samples = synthetic_samples(TRUE, noise=0.0)
    slowed = [StepSample(**{**s.__dict__, "measured_s": 3 * s.measured_s}) if i % 40 == 7 else s
              for i, s in enumerate(samples)]
    result = fit(slowed, TERMS, PROFILES, start=START)
    for term in ("lora_slice_launch_s", "lora_token_gather_share", "step_overhead_s",
                 "gemm_flops_efficiency"):
        assert getattr(result.coeffs, term) == pytest.approx(getattr(TRUE, term), rel=0.3), term
