"""Plain state objects on their own: block keys, adapter slots, workload generators (the KV
block manager's own tests are in test_kv_blocks.py)."""

import numpy as np
import pytest

from sim.memory.adapter_slots import AdapterSlots
from sim.memory.kv_blocks import KvBlockManager
from sim.workload.generate import conversation_workload, popularity_domains, punica_workload


def test_adapter_slots_pin_load_and_evict():
    slots = AdapterSlots(max_loras=2, max_cpu_loras=2, load_s=[0.1, 0.2, 0.3])
    assert slots.activate(0) == 0.1 and slots.activate(0) == 0.0
    assert slots.activate(1) == 0.2
    assert not slots.can_activate(2)  # both slots pinned
    slots.release(1)
    assert slots.can_activate(2) and slots.activate(2) == 0.3
    assert slots.resident == (0, 2)
    assert (slots.num_loads, slots.num_cold_loads) == (3, 3)
    slots.release(2)
    # Adapter 1 left the GPU but stays in the 2-entry CPU cache (loading 2 evicted the CPU's
    # least recent entry, adapter 0): a warm load.
    assert slots.activate(1) == 0.2 and slots.resident == (0, 1)
    assert (slots.num_loads, slots.num_cold_loads) == (4, 3)


def test_punica_mixes():
    rng = np.random.default_rng(0)
    assert (popularity_domains(rng, 100, 8, "identical") == 0).all()
    distinct = popularity_domains(rng, 96, 8, "distinct")
    assert (np.bincount(distinct) == 12).all()
    skewed = np.bincount(popularity_domains(rng, 20_000, 8, "skewed"), minlength=8)
    # Zipf(1) over 8: adapter 0 has weight 1/H_8 = 0.368, adapter 1 half of that.
    assert skewed[0] / 20_000 == pytest.approx(1 / sum(1 / k for k in range(1, 9)), abs=0.01)
    assert skewed[1] / skewed[0] == pytest.approx(0.5, abs=0.03)
    w = punica_workload(rng, num_requests=5000, num_adapters=4, max_prompt_tokens=64)
    assert w.turn_user_tokens.min() >= 1 and w.turn_user_tokens.max() <= 64
    assert (w.conv_arrival_s == 0).all()
    # Lognormal(0.8) median is scale * 1 + loc = 17 tokens.
    assert np.median(w.turn_user_tokens) == pytest.approx(17, abs=1)


def test_conversations_walk_domains_and_grow_context():
    rng = np.random.default_rng(1)
    w = conversation_workload(rng, num_conversations=400, num_turns=5, num_domains=4,
                              switch_probability=0.3, num_initial_context_tokens=100,
                              num_user_tokens=10, num_reply_tokens=20, think_time_s=2.0)
    domains = w.turn_domain.reshape(400, 5)
    switch_rate = (np.diff(domains, axis=1) != 0).mean()
    assert switch_rate == pytest.approx(0.3, abs=0.03)
    assert w.max_context_tokens() == 100 + 5 * 30
    think = w.turn_think_s.reshape(400, 5)
    assert (think[:, 0] == 0).all() and think[:, 1:].mean() == pytest.approx(2.0, rel=0.1)


def test_stream_and_trace_hash_blocks_never_share_keys():
    """A MoL hop's blocks are named by its conversation, an answer's under a trace by hash ids:
    in one adapter's KV, conversation 5 and hash id 5 are different text."""
    from sim.engine.sequence import Sequence

    kv = KvBlockManager(num_blocks=64, block_size=16, enable_prefix_caching=True)
    common = dict(hop="answer", adapter=0, kv_namespace=0, num_prompt_tokens=64,
                  num_output_tokens=1, submit_s=0.0, num_stream_prompt_tokens=64)
    by_stream = Sequence(seq_id=1, stream_id=5, **common)
    by_hash = Sequence(seq_id=2, stream_id=5, hash_ids=(5,), hash_block_tokens=64, **common)
    stream_keys = [k for run in by_stream.block_key_runs(0, 4, 16, kv) for k in run]
    hash_keys = [k for run in by_hash.block_key_runs(0, 4, 16, kv) for k in run]
    assert len(stream_keys) == len(hash_keys) == 4
    assert not set(stream_keys) & set(hash_keys)


def test_trace_hash_keys_are_distinct_per_namespace_and_id_and_take_no_table_entry():
    """Trace hash ids in the usual range get keys computed from (namespace, id): every pair
    distinct (also across the edges of the range and against numbered runs), each run's
    blocks its own, and the run table stays empty (it held an entry per id: gigabytes at a
    million Mooncake requests)."""
    from sim.memory.kv_blocks import RUN_KEY_BITS, TRACE_NAMES, TRACE_NAMESPACES

    kv = KvBlockManager(num_blocks=64, block_size=16, enable_prefix_caching=True)
    names = [0, 1, 2, TRACE_NAMESPACES, TRACE_NAMES - 1, TRACE_NAMES, 2**40, -1]
    namespaces = [-1, 0, 1, TRACE_NAMESPACES - 2, TRACE_NAMESPACES - 1, 1000]
    runs = {(ns, name): kv.key_base(ns, name, True) for ns in namespaces for name in names}
    # Numbered runs: streams, and trace ids outside the computed range.
    numbered = [(ns, n) for ns, n in runs if not (0 <= n < TRACE_NAMES
                                                  and -1 <= ns < TRACE_NAMESPACES - 1)]
    assert len(kv._run_bases) == len(numbered)
    computed = [base for run, base in runs.items() if run not in numbered]
    assert max(computed) + 2**RUN_KEY_BITS <= 0  # below every numbered run's keys (>= 0)
    runs.update({("stream", ns, n): kv.key_base(ns, n) for ns in namespaces for n in names[:4]})
    blocks = [base + j for base in runs.values() for j in (0, 1, 2**(RUN_KEY_BITS - 1) - 1)]
    assert len(set(blocks)) == len(blocks)
    assert all(-2**63 <= b < 2**63 for b in blocks)  # within a C long: fast ranges and hashes
    assert kv.key_base(1, 2, True) == runs[(1, 2)]  # the same run, the same keys
    assert kv.key_base(1000, 2, True) == runs[(1000, 2)]


def test_hash_ids_read_back_as_the_tuples_they_hold():
    from sim.workload.generate import HashIds

    per_turn = [(5, 6, 7), (), (8,), (2**70, 1), (9, 10)]
    ids = HashIds.of(per_turn)
    assert len(ids) == 5 and list(ids) == per_turn and ids[3] == (2**70, 1)
    assert all(type(i) is int for i in ids[0])
    assert list(ids.take(np.array([4, 0, 1, 0]))) == [(9, 10), (5, 6, 7), (), (5, 6, 7)]
    assert HashIds.of([(1, 2), (3,)]).ids.dtype == np.int64
