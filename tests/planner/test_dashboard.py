"""planner.scenario.editing and planner.jobs.dashboard: the thin functions the dashboard calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.jobs.dashboard import (
    PlanJob,
    compare_summaries,
    plan_headline,
    plan_scenario,
    select_strategies,
    stored_plan,
    whatif_cut,
)
from planner.jobs.strategy_points import scenario_tasks
from planner.scenario.editing import field_spec, set_field, set_num_adapters
from planner.scenario.loading import ScenarioError, load_scenario, scenario_from_text
from sim.io.points import PointStore

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = (ROOT / "scenarios" / "default.yaml").read_text(encoding="utf-8")


def test_set_field_replaces_a_scalar_in_place_keeping_comments_and_anchors():
    text = set_field(DEFAULT, "workload.switch_probability", 0.75)
    changed = [(a, b) for a, b in zip(DEFAULT.splitlines(), text.splitlines(), strict=True)
               if a != b]
    assert changed == [("  switch_probability: 0.3", "  switch_probability: 0.75")]
    assert scenario_from_text(text).workload.switch_probability == 0.75


def test_set_field_adds_a_missing_key_under_its_block():
    text = set_field(DEFAULT, "hardware.router", "affinity")
    assert "&all_token_adapters" in text and "# Default scenario" in text
    assert len(text.splitlines()) == len(DEFAULT.splitlines()) + 1
    assert scenario_from_text(text).hardware.router == "affinity"


def test_set_field_rewrites_when_the_value_is_in_flow_style():
    text = "name: x\nstrategies: [{kind: base}]\nhardware: {gpu: H200}\n"
    assert scenario_from_text(set_field(text, "hardware.gpu", "H20")).hardware.gpu == "H20"


def test_set_field_on_broken_yaml_raises_the_located_error():
    with pytest.raises(ScenarioError, match="malformed YAML"):
        set_field("a: [1\n", "a", 2)


def test_set_num_adapters_resizes_every_adapter_strategy():
    scenario = scenario_from_text(set_num_adapters(DEFAULT, 6))
    counts = {s.label: len(getattr(s, "adapters", ())) for s in scenario.strategies}
    assert counts.pop("base") == 0 and set(counts.values()) == {6}
    assert scenario_from_text(set_num_adapters(DEFAULT, 2)).strategies[1].adapters[1].name == \
        "agent"


def test_field_spec_reads_bounds_and_description():
    spec = field_spec(load_scenario(ROOT / "scenarios" / "default.yaml"),
                      "workload.switch_probability")
    assert spec["ge"] == 0 and spec["le"] == 1 and "another domain" in spec["description"]


def test_whatif_cut_keeps_the_rate_and_shrinks_the_workload():
    scenario = load_scenario(ROOT / "scenarios" / "default.yaml")
    cut = select_strategies(whatif_cut(scenario, 120), ["mol", "multi_lora"])
    assert cut.workload.num_conversations == 20 and cut.workload.arrival_rate_per_s == 0.5
    assert [s.label for s in cut.strategies] == ["multi_lora", "mol"]
    with pytest.raises(ValueError, match="none of"):
        select_strategies(scenario, ["nope"])


TINY = """\
name: tiny
model: llama-3.1-8b
hardware: {gpu: H100-SXM}
strategies:
  - kind: multi_lora
    adapters: [{name: a, rank: 8}]
workload: {kind: conversations, num_conversations: 6, num_turns: 2,
  num_initial_context_tokens: 128, num_user_tokens: 16, num_reply_tokens: 16,
  think_time_s: 1.0, arrival_rate_per_s: 2.0}
slo: {ttft_p99_s: 10}
search: {tensor_parallel_sizes: [1], num_seeds: 1, max_turns_per_evaluation: 12,
  max_num_replicas: 2}
"""


def test_a_plan_job_plans_in_a_child_process_from_the_resolved_scenario(tmp_path):
    """The child (spawned, a fresh interpreter) receives the resolved scenario pickled."""
    scenario = scenario_from_text(TINY)
    job = PlanJob(scenario, tmp_path)
    job._process.join(timeout=600)
    assert job._process.exitcode == 0 and job.progress() == (1, 1)
    assert job.result().plans["is_feasible"].astype(bool).tolist() == [True]


def test_plans_share_the_points_store_of_molcap_run(tmp_path):
    scenario = scenario_from_text(TINY)
    assert stored_plan(scenario, tmp_path).num_missing == 1
    plan = plan_scenario(scenario, tmp_path)
    assert bool(plan.plans["is_feasible"].iloc[0])
    key = scenario_tasks(scenario, "plan")[0].key  # the key `molcap run` uses
    assert PointStore(tmp_path / "tiny" / "points").load(key)["status"] == "ok"
    again = stored_plan(scenario, tmp_path)
    assert again.num_missing == 0
    assert again.plans["cost_per_hour_usd"].iloc[0] == plan.plans["cost_per_hour_usd"].iloc[0]
    assert plan_headline(scenario, again).startswith("Plan: multi_lora on 1 x H100-SXM (TP=1")


def test_compare_summaries_gives_the_change_per_metric():
    import pandas as pd

    before = pd.DataFrame([{"strategy": "a", "ttft_p99_s": 1.0, "goodput_turns_per_s": 2.0}])
    after = pd.DataFrame([{"strategy": "a", "ttft_p99_s": 1.5, "goodput_turns_per_s": 1.0}])
    stacked, changes = compare_summaries(before, after)
    assert list(stacked["variant"]) == ["before", "after"]
    row = changes.set_index("metric").loc["ttft_p99_s"]
    assert row["change"] == 0.5 and row["relative_change"] == 0.5
