"""Golden scenarios: each small `scenarios/sim_*.yaml` simulates every strategy under its fixed
seed to the summary checked in under `tests/sim/golden/<name>.json`.

When the model changes on purpose, regenerate the summaries and review the diff:

    MOLCAP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/sim/test_sim_golden.py
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from planner.predict.simulation import simulate_strategy
from planner.scenario.loading import load_scenario

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = sorted((REPO / "scenarios").glob("sim_*.yaml"))
UPDATE = os.environ.get("MOLCAP_UPDATE_GOLDEN") == "1"
REL_TOL = 1e-6
"""Room for floating-point differences across numpy builds, far below any model change."""


def summaries(path: Path) -> dict[str, dict]:
    """Summary of every strategy of the scenario file, by strategy label."""
    scenario = load_scenario(path)
    return {s.label: simulate_strategy(scenario, i, scenario_dir=path.parent).summary
            for i, s in enumerate(scenario.strategies)}


def differences(expected: dict, got: dict, where: str) -> list[str]:
    """Readable mismatches between two summaries (keys and values)."""
    out = [f"{where}: key {k!r} {'missing' if k in expected else 'unexpected'}"
           for k in sorted(set(expected) ^ set(got))]
    for key in sorted(set(expected) & set(got)):
        want, have = expected[key], got[key]
        if not math.isclose(want, have, rel_tol=REL_TOL, abs_tol=1e-12):
            out.append(f"{where}.{key}: expected {want!r}, got {have!r}")
    return out


def test_there_are_golden_scenarios():
    assert len(SCENARIOS) >= 3
    assert {p.stem for p in SCENARIOS} <= {p.stem for p in GOLDEN.glob("*.json")} or UPDATE


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_golden_summary(path):
    got = summaries(path)
    golden = GOLDEN / f"{path.stem}.json"
    if UPDATE:
        golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    expected = json.loads(golden.read_text(encoding="utf-8"))
    problems = [f"{path.stem}: strategies {sorted(expected)} != {sorted(got)}"] \
        if set(expected) != set(got) else []
    for label in sorted(set(expected) & set(got)):
        problems += differences(expected[label], got[label], f"{path.stem}.{label}")
    assert not problems, "\n".join(problems[:20])


def test_differences_reports_a_changed_value():
    assert differences({"ttft_p50_s": 1.0}, {"ttft_p50_s": 1.0 + 1e-9}, "s") == []
    assert differences({"ttft_p50_s": 1.0}, {"ttft_p50_s": 1.001}, "s") == [
        "s.ttft_p50_s: expected 1.0, got 1.001"]
    assert differences({"a": 1}, {"b": 1}, "s") == ["s: key 'a' missing", "s: key 'b' unexpected"]
