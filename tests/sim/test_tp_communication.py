"""The tensor-parallel communication term: zero at TP 1, two fitted all-reduces per layer of the
step's activations where a fit covers the TP degree, the ring formula elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cost.cost_model import CostCoeffs, create_step_batch, predict_step
from sim.cost.layer_costs import create_layer_costs
from sim.cost.tp_communication import AllReduceFit, tensor_parallel_communication_s
from sim.hardware.catalogue import get_gpu, get_model

ARCH = get_model("llama-3.1-8b")
GPU = get_gpu("H100-SXM")


def _fit(tp: int, latency_s: float, bandwidth: float) -> AllReduceFit:
    return AllReduceFit(tensor_parallel_size=tp, interconnect="nvlink", latency_s=latency_s,
                        bandwidth_bytes_per_s=bandwidth, source="test")


FITTED = CostCoeffs(all_reduce_fits=(_fit(2, 10e-6, 300e9), _fit(4, 30e-6, 250e9),
                                     _fit(8, 40e-6, 200e9)))


def _communication_s(coeffs: CostCoeffs, tp: int, num_tokens: int) -> float:
    profile = create_layer_costs(ARCH, GPU, tp)
    batch = create_step_batch([1] * num_tokens, [100] * num_tokens, num_layers=ARCH.num_layers)
    return predict_step(coeffs, profile, batch).communication_s


def test_zero_at_tp_1_with_or_without_fits():
    assert _communication_s(FITTED, 1, 64) == 0.0
    assert _communication_s(CostCoeffs(), 1, 64) == 0.0


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_two_fitted_all_reduces_per_layer_of_the_steps_activations(tp):
    fit = next(f for f in FITTED.all_reduce_fits if f.tensor_parallel_size == tp)
    num_bytes = 64 * ARCH.hidden_size * 2
    expected = ARCH.num_layers * 2 * (fit.latency_s + num_bytes / fit.bandwidth_bytes_per_s)
    assert _communication_s(FITTED, tp, 64) == pytest.approx(expected, rel=1e-12)


def test_grows_with_tp_and_with_tokens():
    by_tp = [_communication_s(FITTED, tp, 64) for tp in (1, 2, 4, 8)]
    assert by_tp == sorted(by_tp) and len(set(by_tp)) == 4
    by_tokens = [_communication_s(FITTED, 8, n) for n in (1, 16, 256, 2048)]
    assert by_tokens == sorted(by_tokens) and len(set(by_tokens)) == 4


def test_a_degree_without_a_fit_keeps_the_ring_formula_bit_for_bit():
    ring = CostCoeffs(communication_efficiency=0.6, communication_latency_s=3e-5)
    only_tp2 = ring.model_copy(update={"all_reduce_fits": (_fit(2, 1e-6, 1e12),)})
    tokens = np.array([64.0] * ARCH.num_layers)
    link = GPU.nvlink_bandwidth_bytes_per_s
    by_hand = 2 * (2 * (4 - 1) / 4 * tokens * ARCH.hidden_size * 2 / (link * 0.6) + 3e-5)
    assert _communication_s(only_tp2, 4, 64) == float(by_hand.sum())
    assert _communication_s(ring, 4, 64) == float(by_hand.sum())
    assert _communication_s(only_tp2, 2, 64) != _communication_s(ring, 2, 64)


def test_a_fit_of_another_interconnect_is_not_used():
    pcie = AllReduceFit(tensor_parallel_size=2, interconnect="pcie", latency_s=1.0,
                        bandwidth_bytes_per_s=1e9, source="test")
    assert _communication_s(CostCoeffs(all_reduce_fits=(pcie,)), 2, 8) == \
        _communication_s(CostCoeffs(), 2, 8)


def test_layers_without_tokens_pay_no_all_reduce():
    fit = _fit(2, 10e-6, 300e9)
    tokens = np.array([8.0, 0.0, 8.0, 0.0])
    seconds = tensor_parallel_communication_s(
        tp=2, hidden_size=1024, tokens_per_layer=tokens, fit=fit, link_bytes_per_s=1.0,
        efficiency=1.0, latency_s=0.0)
    assert seconds == pytest.approx(2 * 2 * (10e-6 + 8 * 1024 * 2 / 300e9))


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("base", ["fitted", "ring"])
def test_latency_per_gpu_adds_b_times_tp_to_every_all_reduce(tp, base):
    coeffs = FITTED if base == "fitted" else CostCoeffs(communication_latency_s=3e-5)
    per_gpu = coeffs.model_copy(update={"communication_latency_per_gpu_s": 7e-6})
    num_reduces = 2 * ARCH.num_layers
    added = _communication_s(per_gpu, tp, 64) - _communication_s(coeffs, tp, 64)
    assert added == pytest.approx(num_reduces * 7e-6 * tp, rel=1e-9)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_latency_per_gpu_of_zero_is_the_old_price_bit_for_bit(tp):
    assert CostCoeffs().communication_latency_per_gpu_s == 0.0
    tokens = np.array([64.0, 0.0, 3.0])
    num_bytes = tokens * 1024 * 2
    fit = _fit(tp, 1e-5, 3e11)
    old_fitted = 2 * (fit.latency_s + num_bytes / fit.bandwidth_bytes_per_s) * (tokens > 0)
    old_ring = 2 * (2 * (tp - 1) / tp * num_bytes / (450e9 * 0.7) + 2e-5) * (tokens > 0)
    kwargs = dict(tp=tp, hidden_size=1024, tokens_per_layer=tokens, link_bytes_per_s=450e9,
                  efficiency=0.7, latency_s=2e-5, latency_per_gpu_s=0.0)
    assert tensor_parallel_communication_s(fit=fit, **kwargs) == float(old_fitted.sum())
    assert tensor_parallel_communication_s(fit=None, **kwargs) == float(old_ring.sum())


def test_latency_per_gpu_is_paid_only_by_layers_with_tokens():
    tokens = np.array([8.0, 0.0, 8.0, 0.0])
    kwargs = dict(tp=4, hidden_size=1024, tokens_per_layer=tokens, fit=_fit(4, 1e-5, 3e11),
                  link_bytes_per_s=1.0, efficiency=1.0, latency_s=0.0)
    added = (tensor_parallel_communication_s(latency_per_gpu_s=5e-6, **kwargs)
             - tensor_parallel_communication_s(**kwargs))
    assert added == pytest.approx(2 * 2 * 5e-6 * 4)
