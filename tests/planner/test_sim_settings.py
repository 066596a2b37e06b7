"""Scenario settings the simulator honours: the cluster's request router, the simulation bounds,
ServeGen adapter popularity for traces without an adapter column, and the contextual-MoL head
size. Each has a located error for a bad value and a simulation that follows it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.predict.simulation import create_workload, simulate_strategy, strategy_spec
from planner.scenario.loading import ScenarioError, load_scenario, scenario_from_text
from planner.scenario.workloads import ConversationWorkload, TraceWorkload
from sim.engine.replica import SimulationError
from sim.workload.traces import TRACES_DIR, servegen_popularity

BASE = """\
name: settings
strategies:
  - kind: multi_lora
    adapters:
      - {name: a, rank: 16}
      - {name: b, rank: 16}
      - {name: c, rank: 16}
      - {name: d, rank: 16}
workload: {kind: punica, num_requests: 30, num_adapters: 4, num_output_tokens: 8}
"""
AZURE = str(TRACES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
AZURE_COLUMNS = ("columns: {arrival_time: TIMESTAMP, num_input_tokens: ContextTokens, "
                 "num_output_tokens: GeneratedTokens}")


def only_message(tmp_path: Path, text: str, needle: str, field: str) -> str:
    """Load a bad file; its single message must start `FILE:LINE: field: ` at `needle`'s line."""
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert len(info.value.messages) == 1, info.value.messages
    prefix = f"{path}:{line}: {field}: "
    assert info.value.messages[0].startswith(prefix), (prefix, info.value.messages[0])
    return info.value.messages[0][len(prefix):]


def test_bad_router_is_located(tmp_path):
    text = BASE + "hardware: {num_replicas: 2, router: random}\n"
    message = only_message(tmp_path, text, "router: random", "hardware.router")
    assert "'random'" in message and "least_outstanding" in message


def test_bad_simulation_bound_is_located(tmp_path):
    text = BASE + "simulation:\n  max_engine_steps: 0\n"
    message = only_message(tmp_path, text, "max_engine_steps: 0", "simulation.max_engine_steps")
    assert "greater than or equal to 1 (given: 0)" in message


def test_servegen_popularity_with_an_adapter_column_is_located(tmp_path):
    text = BASE.replace(
        "workload: {kind: punica, num_requests: 30, num_adapters: 4, num_output_tokens: 8}",
        f"workload:\n  kind: trace\n  path: {AZURE}\n  popularity: servegen\n"
        f"  columns: {{adapter: ContextTokens}}")
    message = only_message(tmp_path, text, "workload:", "workload.trace")
    assert "popularity='servegen'" in message and "columns.adapter='ContextTokens'" in message


def test_bad_head_size_is_located(tmp_path):
    text = """\
    model: ced-40
    hardware: {gpu: H200, num_gpus_per_replica: 8, tensor_parallel_size: 8}
    strategies:
      - kind: contextual_mol
        adapters: [{name: a, rank: 16, target_modules: [q_proj]}]
        num_head_params: 0
    """
    message = only_message(tmp_path, text, "num_head_params: 0",
                           "strategies.0.num_head_params")
    assert "(given: 0)" in message


@pytest.mark.parametrize("router", ("round_robin", "least_outstanding"))
def test_the_simulation_follows_the_router(router):
    # One short request a second: each has finished before the next arrives.
    text = BASE.replace("num_output_tokens: 8}", "num_output_tokens: 8, arrival_rate_per_s: 1}")
    scenario = scenario_from_text(text + f"hardware: {{num_replicas: 3, router: {router}}}\n")
    replicas = simulate_strategy(scenario, 0).turns.sort_values("arrival_s")["replica"]
    if router == "round_robin":
        assert replicas.tolist() == [i % 3 for i in range(30)]
    else:  # every replica idle at each arrival: the first one wins the tie
        assert replicas.tolist() == [0] * 30
    assert simulate_strategy(scenario, 0, router="affinity").stats["num_replicas"] == 3


def test_the_simulation_stops_at_the_scenario_bounds():
    steps = scenario_from_text(BASE + "simulation: {max_engine_steps: 5}\n")
    with pytest.raises(SimulationError, match=r"simulation\.max_engine_steps=5 reached"):
        simulate_strategy(steps, 0)
    time = scenario_from_text(BASE + "simulation: {max_simulated_time_s: 0.01}\n")
    with pytest.raises(SimulationError, match=r"simulation\.max_simulated_time_s=0\.01 .* "
                                              r"unfinished"):
        simulate_strategy(time, 0)


def test_servegen_popularity_weights_the_trace_adapters():
    scenario = scenario_from_text(BASE)
    trace = dict(kind="trace", path=AZURE, max_requests=4000, columns=dict(
        arrival_time="TIMESTAMP", num_input_tokens="ContextTokens",
        num_output_tokens="GeneratedTokens"), time_unit="datetime")
    counts = {}
    for popularity in ("uniform", "servegen"):
        point = scenario.model_copy(update={"workload": TraceWorkload(
            **trace, popularity=popularity)})
        domains = create_workload(point, 4, np.random.default_rng(0)).turn_domain
        counts[popularity] = np.bincount(domains, minlength=4) / domains.size
    weights = servegen_popularity(4)
    np.testing.assert_allclose(counts["servegen"], weights / weights.sum(), atol=0.03)
    assert np.abs(counts["servegen"] - counts["uniform"]).max() > 0.05


def test_the_contextual_head_size_reaches_the_routing_time():
    default = load_scenario("scenarios/default.yaml")
    index = next(i for i, s in enumerate(default.strategies) if s.kind == "contextual_mol")
    small = default.model_copy(update={"workload": ConversationWorkload(
        num_conversations=2, num_turns=2, num_initial_context_tokens=256, num_user_tokens=32,
        num_reply_tokens=16, think_time_s=1.0, arrival_rate_per_s=1.0)})
    big_head = default.strategies[index].model_copy(update={"num_head_params": 10**10})
    big = small.model_copy(update={"strategies": (
        *small.strategies[:index], big_head, *small.strategies[index + 1:])})
    assert strategy_spec(small, index).num_head_params == 2 * 5120 * 1024
    assert strategy_spec(big, index).num_head_params == 10**10
    route_small = simulate_strategy(small, index).turns["route_s"].mean()
    route_big = simulate_strategy(big, index).turns["route_s"].mean()
    assert route_big > route_small + 1e-3  # 20 GB of head weights read per decision


def window_scenario():
    """30 requests at once, 4 at a time, and a window that ends between two batches."""
    text = BASE + "engine: {max_num_seqs: 4}\n"
    done = np.unique(simulate_strategy(scenario_from_text(text), 0).turns["done_s"])
    window_s = round(float(done[3] + done[4]) / 2, 6)  # 4 batches of 4 done inside
    return scenario_from_text(text + f"simulation: {{window_s: {window_s}}}\n"), window_s


def test_the_simulation_stops_at_the_scenario_window():
    scenario, window_s = window_scenario()
    result = simulate_strategy(scenario, 0)
    assert result.summary["window_s"] == window_s
    assert result.summary["num_turns_unfinished_in_window"] == 30 - len(result.turns) == 14
    assert (result.turns["done_s"] < window_s).all()


def test_window_past_the_time_bound_is_located(tmp_path):
    text = BASE + "simulation:\n  max_simulated_time_s: 10\n  window_s: 20\n"
    message = only_message(tmp_path, text, "simulation:", "simulation")
    assert "window_s=20.0 exceeds max_simulated_time_s=10.0" in message


def test_the_report_says_when_runs_stopped_at_the_window():
    from planner.jobs.run import _sim_sections

    scenario, window_s = window_scenario()
    result = simulate_strategy(scenario, 0)
    windowed = pd.DataFrame([{"strategy": "multi_lora", **result.summary}])
    assert f"stopped at simulation.window_s = {window_s:g} s" in _sim_sections(
        windowed, pd.DataFrame(), pd.DataFrame(), scenario)[0].text
    whole = windowed.drop(columns=["window_s", "num_turns_unfinished_in_window"])
    assert "window" not in _sim_sections(whole, pd.DataFrame(), pd.DataFrame(), scenario)[0].text
