"""Step prices shared across runs of one process give exactly the prices of a fresh run, and
runs that differ in what a price depends on never share them."""

import numpy as np
import pandas as pd
from sim_configs import small_config

from sim.engine import step_pricer
from sim.simulate import simulate
from sim.workload.generate import conversation_workload


def _workload():
    return conversation_workload(
        np.random.default_rng(3), num_conversations=40, num_turns=3, num_domains=4,
        switch_probability=0.3, num_initial_context_tokens=512, num_user_tokens=64,
        num_reply_tokens=32, think_time_s=1.0, arrival_rate_per_s=4.0)


def test_shared_prices_equal_a_fresh_run_and_stay_apart_by_identity():
    config = small_config("multi_lora", max_num_seqs=16)
    slower = config.model_copy(update={"coeffs": config.coeffs.model_copy(
        update={"step_overhead_s": config.coeffs.step_overhead_s + 5e-3})})
    step_pricer._SHARED_NON_ATTENTION.clear()
    slower_alone = simulate(slower, _workload()).turns
    step_pricer._SHARED_NON_ATTENTION.clear()
    fresh = simulate(config, _workload()).turns
    slower_after = simulate(slower, _workload()).turns  # same model, other coefficients
    again = simulate(config, _workload())
    assert again.stats["num_predict_calls"] < 5  # priced from the shared table
    pd.testing.assert_frame_equal(fresh, again.turns)
    pd.testing.assert_frame_equal(slower_alone, slower_after)
    assert len(step_pricer._SHARED_NON_ATTENTION) == 2
