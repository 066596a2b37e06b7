"""A trace with unsorted timestamps is sorted before the capacity search cuts it: a search
point simulates the earliest requests, as the whole trace replays them."""

from __future__ import annotations

import numpy as np

from planner.predict.simulation import create_workload
from planner.scenario.loading import load_scenario
from planner.search.strategy_plan import with_rate, workload_shape

SCENARIO = """\
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB}
strategies: [{kind: base}]
workload: {kind: trace, path: trace.csv}
search: {max_turns_per_evaluation: 10}
"""


def test_a_search_point_cuts_the_earliest_requests_of_an_unsorted_trace(tmp_path):
    rng = np.random.default_rng(0)
    times = rng.permutation(40).astype(float)  # every arrival once, in shuffled file order
    rows = "".join(f"{t},{int(100 + t)},8\n" for t in times)
    (tmp_path / "trace.csv").write_text("timestamp,input_length,output_length\n" + rows)
    (tmp_path / "s.yaml").write_text(SCENARIO, encoding="utf-8")
    scenario = load_scenario(tmp_path / "s.yaml")
    point = with_rate(scenario, 1.0, workload_shape(scenario))
    workload = create_workload(point, 1, np.random.default_rng(0))
    assert workload.turn_user_tokens.tolist() == [100 + t for t in range(10)]
