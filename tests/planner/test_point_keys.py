"""Point keys follow everything that shapes a result: the scenario (a sweep's base scenario
too) and the model version of the code, so points cached by an older molcap, or for an edited
scenario, are recomputed rather than reused."""

from __future__ import annotations

from planner_helpers import TINY, write_tiny

import sim.version
from planner.jobs.run import run_scenario_file
from planner.jobs.strategy_points import scenario_tasks
from planner.jobs.sweep_spec import load_sweep
from planner.scenario.loading import load_scenario

SPEC = ("name: keys\nscenario: tiny.yaml\nparameters:\n"
        "  - {field: engine.max_num_seqs, values: [4, 8]}\n")


def sweep_keys(folder) -> list[str]:
    spec = folder / "sweep.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    return [p.key for p in load_sweep(spec)[1]]


def test_a_new_model_version_changes_every_key(tmp_path, monkeypatch):
    scenario = load_scenario(write_tiny(tmp_path))
    run_keys = [t.key for t in scenario_tasks(scenario, "sim")]
    old_sweep = sweep_keys(tmp_path)
    monkeypatch.setattr(sim.version, "MODEL_VERSION", sim.version.MODEL_VERSION + 1)
    assert not set(run_keys) & {t.key for t in scenario_tasks(scenario, "sim")}
    assert not set(old_sweep) & set(sweep_keys(tmp_path))


def test_points_of_an_older_model_version_are_recomputed(tmp_path, monkeypatch):
    path = write_tiny(tmp_path)
    computed = []
    run_scenario_file(path, tmp_path / "out", backend="inline",
                      on_progress=lambda done, total: computed.append(done))
    assert computed[-1] == 4
    computed.clear()
    run_scenario_file(path, tmp_path / "out", backend="inline",
                      on_progress=lambda done, total: computed.append(done))
    assert computed == []  # same code, same scenario: every point is reused
    monkeypatch.setattr(sim.version, "MODEL_VERSION", sim.version.MODEL_VERSION + 1)
    run_scenario_file(path, tmp_path / "out", backend="inline",
                      on_progress=lambda done, total: computed.append(done))
    assert computed[-1] == 4


def test_editing_a_sweeps_base_scenario_changes_its_keys(tmp_path):
    write_tiny(tmp_path)
    before = sweep_keys(tmp_path)
    write_tiny(tmp_path, text=TINY.replace("num_output_tokens: 8", "num_output_tokens: 9"))
    assert not set(before) & set(sweep_keys(tmp_path))
