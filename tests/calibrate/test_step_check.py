"""The validation replays' steps priced one by one: errors per kind of step and the host share."""

from __future__ import annotations

import pytest

from calibrate.recorder import samples_from_vllm_steps
from calibrate.step_check import check_steps, replay_steps
from engine_ext.vllm_plugin.step_timer import StepTiming
from sim.cost.cost_model import CostCoeffs, create_step_batch, predict_step
from sim.cost.layer_costs import create_layer_costs
from sim.hardware.catalogue import get_gpu, get_model

COEFFS = CostCoeffs(step_overhead_s=4e-3)
PROFILES = {"base": create_layer_costs(get_model("vllm-tiny-llama"), get_gpu("cpu"))}
# A prefill of 20 tokens, then two decode steps of that request.
STEPS = [((20,), (0,)), ((1,), (20,)), ((1,), (21,))]


def predicted(new, ctx) -> float:
    return predict_step(COEFFS, PROFILES["base"], create_step_batch(new, ctx,
                                                                    num_layers=4)).total_s


def timings(slowdown: float, host: float) -> list[StepTiming]:
    """Steps that take `slowdown` x their price; of that, `host` (a share) is spent after the
    runner returned, before the next step starts (the last step has no host part)."""
    out, t = [], 0.0
    for new, ctx in STEPS:
        full = slowdown * predicted(new, ctx)
        runner = full * (1 - host) if len(out) < len(STEPS) - 1 else full
        out.append(StepTiming(t, t + runner, new, ctx, (20,), (0,), cpu_start_s=t,
                              cpu_end_s=t + runner))
        t += full
    return out


def test_steps_taking_twice_their_price_are_priced_50_percent_under():
    run = replay_steps(timings(2.0, 0.25), group="base", prefill_only_ids=set())
    check = check_steps([run], COEFFS, PROFILES)
    rows = {r["kind"]: r for r in check["rows"]}
    assert rows["decode"]["num_steps"] == 2 and rows["prefill+mixed"]["num_steps"] == 1
    for r in rows.values():
        assert r["median_error"] == pytest.approx(-0.5)
        assert r["total_error"] == pytest.approx(-0.5)
    # Host work: a quarter of the first two steps, none of the last one.
    p = [predicted(n, c) for n, c in STEPS]
    assert check["host_share"] == pytest.approx(0.25 * (p[0] + p[1]) / sum(p))


def test_replay_steps_keep_the_recorders_samples():
    steps = timings(1.0, 0.0)
    run = replay_steps(steps, group="base", prefill_only_ids=set())
    expected = samples_from_vllm_steps(steps, group="base", prefill_only_ids=set(), tags={})
    assert run["samples"] == [s.to_json() for s in expected]
    assert check_steps([run], COEFFS, PROFILES)["host_share"] == pytest.approx(0.0)
