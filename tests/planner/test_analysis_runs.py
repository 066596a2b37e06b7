"""The routing-overhead comparison prices a decode run once per distinct input: strategies on
equal profiles share the run, and a profile that differs anywhere, even in one array element or
a field of a nested record, gets its own."""

import dataclasses

import numpy as np

from planner.predict.analysis import _DecodeRuns, routing_overhead
from planner.scenario.loading import load_resolved
from planner.scenario.resolved import create_strategy_costing
from sim.cost.phase_costs import decode_run_s

RUN = dict(num_tokens=100, num_context_tokens=4096, batch_size=8, num_distinct_adapters=4)


def _mol2_costings():
    resolved = load_resolved("scenarios/default.yaml")
    labels = [s.label for s in resolved.scenario.strategies]
    return [create_strategy_costing(resolved, labels.index(name))
            for name in ("mol2_in_engine", "mol2_outside_engine")]


def test_equal_profiles_share_a_run_and_return_the_same_float():
    first, second = _mol2_costings()
    # Equal by value, not the same object (resolution may share one: price a copy).
    copy = dataclasses.replace(second.profile)
    assert copy is not first.profile
    runs = _DecodeRuns()
    a = runs(first.coeffs, first.profile, **RUN)
    b = runs(second.coeffs, copy, **RUN)
    assert len(runs._runs) == 1
    assert a == b == decode_run_s(first.coeffs, first.profile, **RUN)


def test_a_profile_that_differs_anywhere_is_priced_on_its_own():
    costing, _ = _mol2_costings()
    p = costing.profile
    attention = p.dense_params_per_layer.copy()
    attention[len(attention) // 2] *= 2
    others = [dataclasses.replace(p, dense_params_per_layer=attention),
              dataclasses.replace(p, lora_grid=dataclasses.replace(
                  p.lora_grid, num_slots=p.lora_grid.num_slots + 1))]
    runs = _DecodeRuns()
    times = [runs(costing.coeffs, q, **RUN) for q in [p, *others]]
    assert len(runs._runs) == 3
    assert times == [decode_run_s(costing.coeffs, q, **RUN) for q in [p, *others]]


def test_the_comparison_rows_of_equal_profiles_agree():
    per_turn, _ = routing_overhead(load_resolved("scenarios/default.yaml"))
    turns = per_turn.set_index(["strategy", "decode_tokens_per_turn"])["direct_turn_s"]
    assert np.array_equal(turns["mol2_in_engine"].to_numpy(),
                          turns["mol2_outside_engine"].to_numpy())
