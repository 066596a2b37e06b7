"""A custom GPU spec works wherever a catalogue GPU does: the capacity plan of `molcap run`, a
search over it and catalogue GPUs, a sweep, and the dashboard's plan (a catalogue H100 given
64 GB: the plan point failed with KeyError: 'H100-SXM-64GB')."""

from __future__ import annotations

import pandas as pd
import yaml
from planner_helpers import molcap

from planner.jobs.dashboard import plan_scenario
from planner.scenario.loading import load_scenario
from planner.search.strategy_plan import plan_strategy
from sim.hardware.catalogue import GPUS

CUSTOM = "H100-SXM-64GB"


def _write(folder, **search) -> None:
    gpu = GPUS["H100-SXM"].model_dump(mode="json", exclude={"reported_memory_bytes"})
    del gpu["sources"]["reported_memory_bytes"]
    gpu.update(name=CUSTOM, hbm_bytes=64e9, price_per_hour_usd=2.0)
    document = dict(
        name="custom", model="qwen2.5-0.5b", hardware=dict(gpu=gpu),
        strategies=[{"kind": "base"}],
        workload=dict(kind="punica", num_requests=20, num_adapters=1, num_output_tokens=8,
                      arrival_rate_per_s=2.0),
        search=dict(max_turns_per_evaluation=20, num_seeds=1, **search))
    (folder / "s.yaml").write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def test_molcap_run_plans_on_a_custom_gpu(tmp_path):
    _write(tmp_path)
    done = molcap("run", "s.yaml", "--out", "out", "--workers", "1", cwd=tmp_path)
    assert done.returncode == 0 and "failed" not in done.stdout + done.stderr, done.stderr
    plans = pd.read_csv(tmp_path / "out" / "custom" / "tables" / "plans.csv")
    assert plans["gpu"].tolist() == [CUSTOM] and plans["is_feasible"].all()


def test_the_search_weighs_a_custom_gpu_against_catalogue_ones(tmp_path):
    _write(tmp_path, gpus=[CUSTOM, "H100-SXM"], exhaustive=True)
    scenario = load_scenario(tmp_path / "s.yaml")
    plan, _ = plan_strategy(scenario, 0)
    # Same speed, the custom one priced lower: it wins, and both were searched.
    assert plan.is_feasible and plan.chosen.deployment.gpu == CUSTOM
    assert {d.gpu for d in plan.capacities} == {CUSTOM, "H100-SXM"}


def test_a_sweep_simulates_a_custom_gpu(tmp_path):
    _write(tmp_path)
    (tmp_path / "sweep.yaml").write_text(
        "name: sw\nscenario: s.yaml\nevaluate: simulate\nparameters:\n"
        "  - {field: workload.arrival_rate_per_s, values: [1.0, 2.0]}\n", encoding="utf-8")
    done = molcap("sweep", "sweep.yaml", "--out", "out", "--backend", "inline", cwd=tmp_path)
    assert done.returncode == 0 and "2 rows, 0 failed points" in done.stdout, done.stderr


def test_the_dashboard_plans_a_custom_gpu(tmp_path):
    _write(tmp_path)
    tables = plan_scenario(load_scenario(tmp_path / "s.yaml"), tmp_path / "out")
    assert tables.errors == {} and tables.plans["gpu"].tolist() == [CUSTOM]
