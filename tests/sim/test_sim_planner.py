"""`planner.simulation.simulate_strategy`: a validated Scenario in, a SimResult out, for every
strategy of the shipped default scenario (shrunk to a few conversations)."""

import numpy as np
import pytest

from planner.loading import load_scenario
from planner.simulation import simulate_strategy, strategy_spec
from planner.workloads import ConversationWorkload, PunicaWorkload
from sim.workloads import punica_workload

SCENARIO = load_scenario("scenarios/default.yaml")
SMALL = SCENARIO.model_copy(update={"workload": ConversationWorkload(
    num_conversations=3, num_turns=3, num_initial_context_tokens=512, num_user_tokens=64,
    num_reply_tokens=32, think_time_s=1.0, arrival_rate_per_s=1.0)})


@pytest.mark.parametrize("index", range(len(SCENARIO.strategies)))
def test_every_default_strategy_simulates(index):
    result = simulate_strategy(SMALL, index)
    assert len(result.turns) == 9
    assert result.summary["num_turns"] == 9 and result.summary["ttft_p50_s"] > 0
    assert 0 <= result.summary["slo_attainment"] <= 1


def test_strategy_numbers_follow_the_scenario():
    kinds = {s.label: strategy_spec(SCENARIO, i) for i, s in enumerate(SCENARIO.strategies)}
    assert kinds["preft_lora_p"].is_decode_adapted is False
    assert kinds["preft_direft_p"].adapter_kind == "direft"
    assert kinds["mol2_outside_engine"].routing == "outside_engine"
    assert kinds["mol2_in_engine"].replay_window_tokens == 128  # the CED sliding window
    assert kinds["base"].adapter_kind == "none"
    # CED adapters sit only where the placement rule allows: no encoder layer carries one.
    assert min(layer for layer, _ in kinds["mol2_in_engine"].adapter_placements) >= 20


def test_multi_agent_gets_a_replica_per_agent_and_workload_reuse():
    index = next(i for i, s in enumerate(SCENARIO.strategies) if s.kind == "multi_agent")
    result = simulate_strategy(SMALL, index)
    assert result.stats["num_replicas"] == 4
    punica = SCENARIO.model_copy(update={"workload": PunicaWorkload(num_requests=20)})
    shared = punica_workload(np.random.default_rng(0), num_requests=20, num_adapters=4)
    one = simulate_strategy(punica, 1, workload=shared)
    two = simulate_strategy(punica, 1, workload=shared, mode="reference")
    assert one.turns["e2e_s"].tolist() == pytest.approx(two.turns["e2e_s"].tolist(), rel=1e-9)
