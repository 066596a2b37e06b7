"""The fast path equals the step-by-step reference bit for bit on bench_multilora's own
workloads (issue 25): real agullo-dt serving configurations, few to many adapters over few to
many slots, at 50, 100 and 150% of each configuration's simulated capacity, and a run stopped
at a measurement window (`simulation.window_s`) with its queue still full."""

import numpy as np
import pytest
from test_sim_fast_path import METRICS, assert_same_requests

from bench import bench_multilora as bm
from sim.simulate import simulate

CAPACITY_REQUESTS = 400
NUM_REQUESTS = 300


@pytest.fixture(scope="module")
def runs():
    configs = bm.load_run_configs(bm.data_file(bm.RUNS_CSV))
    return configs, bm.sharegpt_lengths(bm.data_file(bm.SHAREGPT_CSV))


@pytest.fixture(scope="module")
def capacities():
    return {}


def both_modes(config, workload):
    ref = simulate(config.model_copy(update={"mode": "reference"}), workload)
    fast = simulate(config.model_copy(update={"mode": "fast"}), workload)
    return ref, fast


@pytest.mark.parametrize("grid", [(16, 16), (320, 16), (128, 32), (384, 192)])
@pytest.mark.parametrize("load", [0.5, 1.0, 1.5])
def test_fast_equals_reference_across_configurations_and_loads(runs, capacities, grid, load):
    configs, lengths = runs
    cfg = bm.select(configs, [grid])[0]
    if grid not in capacities:
        capacities[grid] = bm._capacity(cfg, lengths, CAPACITY_REQUESTS, 8192)
    capacity = capacities[grid]
    workload = bm.workload(cfg, lengths, load * capacity, NUM_REQUESTS, seed=1)
    ref, fast = both_modes(bm.sim_config(cfg, 8192), workload)
    assert_same_requests(ref, fast)
    assert fast.stats["num_engine_events"] < ref.stats["num_engine_events"]
    if load > 1:  # above capacity the queue grows for the whole arrival span
        assert fast.timeseries["num_waiting"].max() > 20


def test_fast_equals_reference_when_stopped_at_the_window(runs):
    # 64 adapters over 16 slots at 9 requests/s (it serves about 6/s): the window closes with
    # requests waiting and running, which neither path simulates further.
    configs, lengths = runs
    cfg = bm.select(configs, [(64, 16)])[0]
    workload = bm.workload(cfg, lengths, 9.0, NUM_REQUESTS, seed=2)
    config = bm.sim_config(cfg, 8192)
    full = simulate(config, workload)
    done = np.unique(full.requests["finish_s"])  # SimPy stops before events at the window
    window_s = float(done[len(done) // 2] + done[len(done) // 2 + 1]) / 2
    windowed = config.model_copy(update={"bounds": config.bounds.model_copy(
        update={"window_s": window_s})})
    ref, fast = both_modes(windowed, workload)
    assert_same_requests(ref, fast)
    assert 0 < len(fast.requests) < len(full.requests)
    assert (fast.requests["finish_s"] < window_s).all()
    assert fast.summary["num_turns_unfinished_in_window"] > 0
    assert fast.stats["num_engine_steps"] < full.stats["num_engine_steps"]
    # The window changes nothing before it: what finished inside it, finished the same way.
    inside = full.requests[full.requests["finish_s"] < window_s]
    assert len(inside) == len(fast.requests)
    for col in METRICS:
        np.testing.assert_array_equal(np.sort(fast.requests[col]), np.sort(inside[col]))
