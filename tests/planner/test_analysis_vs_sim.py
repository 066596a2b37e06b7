"""The analytical tables agree with a simulation of the same case: KV one conversation holds
(one copy per adapter visited where KV depends on the adapter, one shared copy on decoder-side
CED adapters) and the cost of one switch."""

import numpy as np
import pytest

from planner.predict.analysis import kv_per_conversation, switch_cost
from planner.predict.simulation import simulate_strategy
from planner.scenario.schema import Scenario
from sim.cost.memory_model import window_state_bytes_per_seq
from sim.workload.generate import Workload

CONTEXT = 4096
ADAPTERS = [{"name": f"d{i}"} for i in range(3)]


def scenario(strategy, model="llama-3.1-8b", gpu="H100-SXM", tp=1):
    return Scenario.model_validate(dict(
        model=model, hardware=dict(gpu=gpu, num_gpus_per_replica=tp, tensor_parallel_size=tp),
        engine=dict(max_num_seqs=8), strategies=[strategy],
        analysis=dict(context_tokens=[CONTEXT], adapters_visited=[1, 3],
                      decode_tokens_per_turn=[16], decision_every_tokens=[16],
                      distinct_adapters=[1], decode_batch_size=1, num_query_tokens=1)))


def one_conversation(domains, think_s=100.0):
    """One conversation of 1-token turns after CONTEXT tokens, each turn alone on the GPU."""
    n = len(domains)
    return Workload(
        conv_arrival_s=np.zeros(1), conv_first_turn=np.zeros(1, int),
        conv_num_turns=np.array([n]), conv_initial_tokens=np.array([CONTEXT]),
        turn_domain=np.array(domains), turn_user_tokens=np.ones(n, int),
        turn_reply_tokens=np.ones(n, int), turn_think_s=np.r_[0.0, np.full(n - 1, think_s)])


CASES = {
    "multi_lora": ({"kind": "multi_lora", "adapters": ADAPTERS}, {}),
    "mol2_ced": ({"kind": "mol2", "adapters": ADAPTERS, "router_accuracy": 1.0},
                 dict(model="ced-40", gpu="H200", tp=8)),
}


@pytest.mark.parametrize("case", CASES)
def test_kv_per_conversation_matches_the_blocks_the_simulation_keeps(case):
    strategy, hw = CASES[case]
    s = scenario(strategy, **hw)
    table = kv_per_conversation(s).set_index("adapters_visited")["kv_gib"]
    result = simulate_strategy(s, 0, workload=one_conversation([0, 1, 2]),
                               timeseries_interval_s=0.0)
    mem = s.engine.memory(s.model_arch, s.hardware.gpu_spec, s.hardware.tensor_parallel_size,
                          uses_lora=True)
    # The last sample: the third turn's answer still running, the earlier copies cached.
    held = result.timeseries["kv_blocks_occupied"].iloc[-1]
    held_gib = held * mem.block_size * mem.kv_bytes_per_token_per_gpu / 2**30
    # The CED window lives outside the paged pool (the memory model reserves it per sequence).
    window = window_state_bytes_per_seq(s.model_arch) / 2**30
    copies = 3 if case == "multi_lora" else 1
    assert held_gib == pytest.approx(table[3] - copies * window, rel=0.01)
    assert table[3] == pytest.approx(copies * table[1], rel=0.01)


@pytest.mark.parametrize("case", CASES)
def test_switch_cost_matches_the_simulated_switch(case):
    strategy, hw = CASES[case]
    s = scenario(strategy, **hw)
    analytical = switch_cost(s)["switch_s"].iloc[0]
    same = simulate_strategy(s, 0, workload=one_conversation([0, 0])).turns.iloc[1]
    switched = simulate_strategy(s, 0, workload=one_conversation([0, 1])).turns.iloc[1]
    # The analytical switch leaves out loading the target adapter (its own table).
    simulated = ((switched.ttft_s - switched.route_s - switched.adapter_load_s)
                 - (same.ttft_s - same.route_s - same.adapter_load_s))
    assert simulated == pytest.approx(analytical, rel=SWITCH_TOLERANCE[case])


SWITCH_TOLERANCE = {"multi_lora": 0.005, "mol2_ced": 0.03}
"""Relative gap allowed between the simulated and the analytical switch. A re-prefill is priced
the same way by both (seen: 0.06%). A bounded replay is priced by the analysis as the replay
added to the turn's step; the simulation also splits the CED window's re-encode across that
step's chunks, so the two differ by the step's shared overhead (seen: 2.2%)."""


@pytest.mark.parametrize("window", ("recompute", "kept"))
@pytest.mark.parametrize("case", CASES)
def test_the_direct_turn_matches_a_simulated_turn_with_the_right_adapter(case, window):
    # The routing table's direct turn (prefill the user turn after the context, with the CED
    # encoder's re-encode of C[-W:] unless it keeps its window, then decode the reply alone).
    from planner.predict.analysis import routing_overhead
    _, hw = CASES[case]
    fixed_route = {"kind": "multi_lora", "adapters": ADAPTERS}  # the right adapter, no router
    s = scenario(fixed_route, **hw)
    s = s.model_copy(update=dict(
        engine=s.engine.model_copy(update=dict(ced_encoder_window=window)),
        analysis=s.analysis.model_copy(update=dict(num_turn_context_tokens=CONTEXT + 2))))
    direct = routing_overhead(s)[0]["direct_turn_s"].iloc[0]
    workload = one_conversation([0, 0])
    workload = Workload(**{**workload.__dict__, "turn_reply_tokens": np.array([1, 16])})
    second = simulate_strategy(s, 0, workload=workload).turns.iloc[1]
    assert second.e2e_s == pytest.approx(direct, rel=0.02)
