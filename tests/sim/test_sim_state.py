"""Plain state objects on their own: KV blocks with the prefix cache, adapter slots, workload
generators."""

import numpy as np
import pytest

from sim.adapter_slots import AdapterSlots
from sim.kv_blocks import KvBlockManager, KvCapacityError
from sim.workloads import conversation_workload, popularity_domains, punica_workload


def test_prefix_cache_hits_then_lru_eviction():
    kv = KvBlockManager(num_blocks=4, block_size=16, enable_prefix_caching=True)
    kv.allocate(3)
    for key in ("a", "b", "c"):
        assert kv.register(key)
    kv.release(["a", "b", "c"])  # tail first: c, then b, then a become evictable
    assert (kv.num_free, kv.num_used, kv.num_cached) == (4, 0, 3)
    assert kv.count_cached_prefix(["a", "b", "x", "c"]) == 2
    kv.acquire_cached(["a"])
    kv.allocate(2)  # one uncached block, then evict the LRU evictable block: c
    assert kv.num_evictions == 1 and kv.count_cached_prefix(["a", "b"]) == 2
    assert kv.count_cached_prefix(["c"]) == 0
    with pytest.raises(KvCapacityError):
        kv.allocate(2)
    kv.check_invariants()


def test_shared_prefix_release_keeps_lru_order_tail_first():
    # Two sequences share blocks a, b; the first also holds c, d. Releasing it frees only its
    # own tail (d, then c); the shared blocks follow (b, then a) when the second one leaves.
    kv = KvBlockManager(num_blocks=6, block_size=16, enable_prefix_caching=True)
    kv.allocate(4)
    for key in ("a", "b", "c", "d"):
        assert kv.register(key)
    kv.acquire_cached(["a", "b"])
    kv.allocate(1)  # the second sequence's private block
    kv.release(["a", "b", "c", "d"])
    assert (kv.num_used, kv.count_evictable(["a", "b", "c", "d"])) == (3, 2)
    kv.release(["a", "b", None])
    kv.allocate(3)  # 2 uncached free blocks, then evicts the LRU one: d
    assert kv.count_cached_prefix(["a", "b", "c"]) == 3 and kv.num_evictions == 1
    kv.allocate(1)  # then c
    assert kv.count_cached_prefix(["a", "b", "c"]) == 2
    kv.allocate(1)  # then b
    assert kv.count_cached_prefix(["a", "b"]) == 1
    kv.acquire_cached(["a"])
    assert kv.num_free == 0
    kv.check_invariants()


def test_lru_order_survives_many_evictions_and_takes_from_the_middle():
    # Evicting one block at a time, far past the pool size, with hits taken out of the middle
    # of the LRU list and blocks released again: victims always leave oldest first.
    kv = KvBlockManager(num_blocks=8, block_size=16, enable_prefix_caching=True)
    released: list[int] = []  # LRU order the victims must follow
    kv.allocate(8)
    assert kv.register_new(list(range(8)))
    for key in range(7, -1, -1):  # one sequence per block, released in this order
        kv.release([key])
        released.append(key)
    for step in range(200):
        hit = released[len(released) // 2]
        kv.acquire_cached([hit])  # a prefix hit leaves the LRU list...
        released.remove(hit)
        kv.allocate(1)  # ...and the oldest evictable block goes
        victim = released.pop(0)
        assert kv.count_cached_prefix([victim]) == 0, step
        new = 100 + step
        assert kv.register(new)
        kv.release([new])
        kv.release([hit])  # ...and comes back as the most recent
        released += [new, hit]
    assert kv.num_evictions == 200
    assert all(kv.count_cached_prefix([key]) == 1 for key in released)
    kv.check_invariants()


def test_duplicate_registration_and_disabled_cache():
    kv = KvBlockManager(num_blocks=2, block_size=16, enable_prefix_caching=True)
    kv.allocate(2)
    assert kv.register("a") and not kv.register("a")
    off = KvBlockManager(num_blocks=2, block_size=16, enable_prefix_caching=False)
    off.allocate(1)
    assert not off.register("a") and off.count_cached_prefix(["a"]) == 0


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
    from sim.sequence import Sequence

    kv = KvBlockManager(num_blocks=64, block_size=16, enable_prefix_caching=True)
    common = dict(hop="answer", adapter=0, kv_namespace=0, num_prompt_tokens=64,
                  num_output_tokens=1, submit_s=0.0, num_stream_prompt_tokens=64)
    by_stream = Sequence(seq_id=1, stream_id=5, **common)
    by_hash = Sequence(seq_id=2, stream_id=5, hash_ids=(5,), hash_block_tokens=64, **common)
    stream_keys = by_stream.block_keys_between(0, 4, 16, kv.key_base)
    hash_keys = by_hash.block_keys_between(0, 4, 16, kv.key_base)
    assert len(stream_keys) == len(hash_keys) == 4
    assert not set(stream_keys) & set(hash_keys)


def test_trace_hash_keys_are_distinct_per_namespace_and_id_and_take_no_table_entry():
    """Trace hash ids in the usual range get keys computed from (namespace, id): every pair
    distinct (also across the edges of the range and against numbered runs), each run's
    blocks its own, and the run table stays empty (it held an entry per id: gigabytes at a
    million Mooncake requests)."""
    from sim.kv_blocks import RUN_KEY_BITS, TRACE_NAMES, TRACE_NAMESPACES

    kv = KvBlockManager(num_blocks=64, block_size=16, enable_prefix_caching=True)
    names = [0, 1, 2, TRACE_NAMESPACES, TRACE_NAMES - 1, TRACE_NAMES, 2**40, -1]
    namespaces = [-1, 0, 1, TRACE_NAMESPACES - 2, TRACE_NAMESPACES - 1, 1000]
    runs = {(ns, name): kv.key_base(ns, name, True) for ns in namespaces for name in names}
    # Numbered runs: streams, and trace ids outside the computed range.
    numbered = [(ns, n) for ns, n in runs if not (0 <= n < TRACE_NAMES
                                                  and -1 <= ns < TRACE_NAMESPACES - 1)]
    assert len(kv._run_ids) == len(numbered)
    computed = [base for run, base in runs.items() if run not in numbered]
    assert max(computed) + 2**RUN_KEY_BITS <= 0  # below every numbered run's keys (>= 0)
    runs.update({("stream", ns, n): kv.key_base(ns, n) for ns in namespaces for n in names[:4]})
    blocks = [base + j for base in runs.values() for j in (0, 1, 2**(RUN_KEY_BITS - 1) - 1)]
    assert len(set(blocks)) == len(blocks)
    assert all(-2**63 <= b < 2**63 for b in blocks)  # within a C long: fast ranges and hashes
    assert kv.key_base(1, 2, True) == runs[(1, 2)]  # the same run, the same keys
    assert kv.key_base(1000, 2, True) == runs[(1000, 2)]


def test_hash_ids_read_back_as_the_tuples_they_hold():
    from sim.workloads import HashIds

    per_turn = [(5, 6, 7), (), (8,), (2**70, 1), (9, 10)]
    ids = HashIds.of(per_turn)
    assert len(ids) == 5 and list(ids) == per_turn and ids[3] == (2**70, 1)
    assert all(type(i) is int for i in ids[0])
    assert list(ids.take(np.array([4, 0, 1, 0]))) == [(9, 10), (5, 6, 7), (), (5, 6, 7)]
    assert HashIds.of([(1, 2), (3,)]).ids.dtype == np.int64
