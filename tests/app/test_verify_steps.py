"""A verify run's own engine steps priced one by one on the coefficients that priced its
prediction: steps made to take a known multiple of their price read back as that multiple,
with the host share and the runner's wall over CPU time they were given."""

from __future__ import annotations

import pytest
from tiny_verify import tiny_verify_scenario

from app.verify import price_steps
from calibrate.recorder import StepSample
from calibrate.verify_samples import layer_costs_from_json
from planner.outputs.verify_report import steps_line
from planner.scenario.loading import load_scenario
from planner.scenario.resolved import as_resolved
from planner.verify.prepare import layer_costs_json
from sim.cost.cost_model import predict_step

SLOWDOWN, HOST_SHARE, WALL_OVER_CPU = 2.0, 0.1, 1.5


def test_steps_at_twice_their_price_read_as_twice_with_their_host_share(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_verify_scenario("tiny_steps", "steps priced", 20, "e2e_p99_s: 60.0"))
    scenario = load_scenario(path)
    costs = layer_costs_json(scenario, 0)
    layer_costs = layer_costs_from_json(costs)
    coeffs = as_resolved(scenario).coeffs("cpu")
    # Decode steps of 1-3 sequences on adapter 0, and one prefill of 40 tokens.
    shapes = [((1,) * n, tuple(range(40, 40 + n))) for n in (1, 2, 3)] + [((40,), (0,))]
    steps, runner, runner_wall = [], [], []
    for new, ctx in shapes:
        sample = StepSample("verify:multi_lora", new, ctx, (0,) * len(new),
                            tuple(n > 1 for n in new), 0.0, is_prompt=tuple(n > 1 for n in new))
        price = predict_step(coeffs, layer_costs, sample.batch(layer_costs.num_layers)).total_s
        measured = SLOWDOWN * price
        steps.append(dict(sample.to_json(), measured_s=measured))
        runner.append((1 - HOST_SHARE) * measured)
        runner_wall.append(WALL_OVER_CPU * runner[-1])
    record = dict(steps=steps, runner_s=runner, runner_wall_s=runner_wall, layer_costs=costs)
    check = price_steps(record, scenario, "cpu")
    decode, prefill = check["rows"]
    assert decode["kind"] == "decode" and decode["num_steps"] == 3
    assert 1 / (1 + decode["median_error"]) == pytest.approx(SLOWDOWN)
    assert 1 / (1 + prefill["median_error"]) == pytest.approx(SLOWDOWN)
    assert check["host_share"] == pytest.approx(HOST_SHARE)
    assert check["runner_wall_over_clock"] == pytest.approx(WALL_OVER_CPU)
    [line] = steps_line(dict(step_check=check, clock="wall", device="cpu"))
    assert "decode x2.00 (3 steps)" in line and "host work between steps 10%" in line
    assert "engine thread's CPU seconds" in line and "wall time 1.50x its CPU time" in line
    # A run stored before runner times were kept: nothing to say, not a made-up share.
    assert price_steps(dict(record, runner_s=None), scenario, "cpu") == {}
