"""Hostile sweep specs get located errors before anything runs: a grid too large to run is
refused from its sizes, without expanding it."""

from __future__ import annotations

import pytest
from planner_helpers import write_tiny

from planner.jobs.sweep_spec import MAX_SWEEP_POINTS, load_sweep
from planner.scenario.loading import ScenarioError


def test_a_huge_grid_is_refused_from_its_sizes(tmp_path):
    write_tiny(tmp_path)
    seeds = ", ".join(str(i) for i in range(3000))
    seqs = ", ".join(str(i) for i in range(1, 3001))
    spec = tmp_path / "huge.yaml"
    spec.write_text(f"name: huge\nscenario: tiny.yaml\nparameters:\n"
                    f"  - {{field: seed, values: [{seeds}]}}\n"
                    f"  - {{field: engine.max_num_seqs, values: [{seqs}]}}\n", encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        load_sweep(spec)
    (message,) = info.value.messages
    assert message.startswith(f"{spec}:3: parameters: ") and "9000000 points" in message
    assert str(MAX_SWEEP_POINTS) in message
