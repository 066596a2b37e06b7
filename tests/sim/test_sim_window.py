"""simulation.window_s: a run stops at its measurement window, reports the turns finished inside
it, fails with no bound error and does not simulate the rest."""

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError
from sim_configs import small_config

from sim.config import SimBounds
from sim.engine.replica import SimulationError
from sim.simulate import simulate
from sim.workload.generate import conversation_workload


def overloaded():
    """Conversations arriving faster than one replica serves them: the queue only grows."""
    return conversation_workload(
        np.random.default_rng(11), num_conversations=60, num_turns=3, num_domains=4,
        switch_probability=0.5, num_initial_context_tokens=400, num_user_tokens=60,
        num_reply_tokens=80, think_time_s=0.5, arrival_rate_per_s=30.0)


def with_bounds(config, **bounds):
    return config.model_copy(update={"bounds": SimBounds(**bounds)})


@pytest.mark.parametrize("mode", ("fast", "reference"))
def test_window_reports_exactly_the_turns_finished_inside_it(mode):
    config = small_config("multi_lora", max_num_seqs=8, num_kv_blocks=400, mode=mode)
    full = simulate(config, overloaded())
    window_s = 0.4 * full.summary["duration_s"]
    windowed = simulate(with_bounds(config, window_s=window_s), overloaded())
    # Everything before the window happens as in the whole run.
    inside = full.turns[full.turns["done_s"] < window_s].reset_index(drop=True)
    pd.testing.assert_frame_equal(windowed.turns, inside, check_exact=True)
    done = full.requests[full.requests["finish_s"] < window_s].reset_index(drop=True)
    pd.testing.assert_frame_equal(windowed.requests, done, check_exact=True)
    assert 0 < len(windowed.turns) < len(full.turns)
    summary = windowed.summary
    assert summary["window_s"] == window_s == windowed.stats["stopped_at_window_s"]
    assert summary["num_turns_unfinished_in_window"] == len(full.turns) - len(windowed.turns)
    assert summary["turns_per_s"] == len(windowed.turns) / window_s
    # The drain is not simulated.
    assert windowed.stats["num_engine_steps"] < full.stats["num_engine_steps"]


def test_window_stops_where_the_time_bound_would_fail():
    config = small_config("multi_lora", max_num_seqs=8, num_kv_blocks=400)
    bound_s = round(0.5 * simulate(config, overloaded()).summary["duration_s"], 3)
    with pytest.raises(SimulationError, match=f"max_simulated_time_s={bound_s} reached"):
        simulate(with_bounds(config, max_simulated_time_s=bound_s), overloaded())
    result = simulate(with_bounds(config, max_simulated_time_s=bound_s, window_s=bound_s),
                      overloaded())
    assert result.summary["num_turns_unfinished_in_window"] > 0


def test_window_with_nothing_finished_says_so():
    config = small_config("multi_lora", max_num_seqs=8)
    with pytest.raises(SimulationError, match="no turn finished inside the window"):
        simulate(with_bounds(config, window_s=1e-3), overloaded())


def test_window_past_the_time_bound_is_rejected():
    with pytest.raises(ValidationError, match="window_s=100.0 exceeds max_simulated_time_s=50"):
        SimBounds(max_simulated_time_s=50.0, window_s=100.0)
