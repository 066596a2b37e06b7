"""Fewer SimPy events for the same simulation: what the engine does to save events must give
the results, bit for bit, of the one-event-per-thing way it replaces."""

import numpy as np
import pandas as pd
import pytest
from sim_configs import small_config

from sim.engine.replica import Replica
from sim.simulate import simulate
from sim.workload.generate import conversation_workload


def _notify_one_event_each(self, finished):
    """One event per finished sequence, each calling its `on_done` (the specification)."""
    for seq in finished:
        event = self.env.event()
        event.callbacks.append(lambda _event, seq=seq: seq.on_done(seq))
        event.succeed()


def _workload():
    # Short turns arriving close together, so that several sequences finish in one step and
    # each one's next hop or turn starts at once, on two replicas.
    return conversation_workload(
        np.random.default_rng(11), num_conversations=30, num_turns=4, num_domains=4,
        switch_probability=0.5, num_initial_context_tokens=200, num_user_tokens=30,
        num_reply_tokens=8, think_time_s=0.0, arrival_rate_per_s=300.0)


@pytest.mark.parametrize("mode", ("reference", "fast"))
@pytest.mark.parametrize("kind", ("multi_lora", "mol2", "multi_agent"))
def test_finished_sequences_notified_by_one_event_as_by_one_each(monkeypatch, mode, kind):
    num_replicas = 4 if kind == "multi_agent" else 2  # one per agent
    config = small_config(kind, max_num_seqs=16, num_replicas=num_replicas, mode=mode)
    batched = simulate(config, _workload())
    monkeypatch.setattr(Replica, "_notify", _notify_one_event_each)
    each = simulate(config, _workload())
    pd.testing.assert_frame_equal(batched.requests, each.requests, check_exact=True)
    pd.testing.assert_frame_equal(batched.turns, each.turns, check_exact=True)
    finished_together = batched.requests.groupby(["replica", "finish_s"]).size()
    assert finished_together.max() > 1  # a step that finished several: one event for them
