"""Scale: a burst of requests all arriving at time 0 holds plain records, not a SimPy process
(generator frames, events) per request; cost grows linearly with the number of requests."""

import gc
import tracemalloc

import numpy as np
from sim_configs import small_config

from sim.simulate import simulate
from sim.strategies.turns import Turn
from sim.workload.generate import punica_workload

MAX_BYTES_PER_REQUEST = 2000
"""Sequence, turn records and result rows fit in this; a process per request needed ~2.5 kB."""


def _run(num_requests: int):
    config = small_config("multi_lora", max_num_seqs=64).model_copy(
        update={"check_invariants": False})
    workload = punica_workload(np.random.default_rng(0), num_requests=num_requests,
                               num_adapters=4, num_output_tokens=4)
    return simulate(config, workload)


def test_a_burst_at_time_zero_stays_small_per_request():
    _run(10)  # imports and one-off tables out of the measurement
    tracemalloc.start()
    try:
        result = _run(5000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result.requests) == 5000
    assert peak / 5000 < MAX_BYTES_PER_REQUEST, peak / 5000


def test_engine_work_grows_linearly_with_requests():
    small, large = _run(1000).stats, _run(4000).stats
    assert large["num_engine_events"] <= 4.2 * small["num_engine_events"]
    assert large["num_engine_steps"] <= 4.2 * small["num_engine_steps"]


def test_finished_turns_are_freed_without_the_cyclic_collector():
    # The run pauses the cyclic collector, so a reference cycle would keep every turn alive.
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        _run(500)
        alive = sum(isinstance(o, Turn) for o in gc.get_objects())
    finally:
        if was_enabled:
            gc.enable()
    # At most the last batch survives (the stopped replica process still holds its final plan).
    assert alive <= 64
