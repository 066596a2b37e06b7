"""The KV block manager: prefix hits, registration, and eviction in exact LRU order while it
holds blocks as ranges of keys, checked by hand and against a one-entry-per-block model."""

import itertools

import numpy as np
import pytest

from sim.memory.kv_blocks import (
    RUN_KEY_BITS,
    TRACE_NAMES,
    TRACE_NAMESPACES,
    KvBlockManager,
    KvCapacityError,
)


def _keys(runs: list[range]) -> list[int]:
    return [key for run in runs for key in run]


def test_prefix_cache_hits_then_lru_eviction():
    kv = KvBlockManager(num_blocks=4, block_size=16, enable_prefix_caching=True)
    kv.allocate(3)
    assert kv.register([range(0, 3)]) == [range(0, 3)]
    kv.release([range(0, 3)], 3)  # tail first: 2, then 1, then 0 become evictable
    assert (kv.num_free, kv.num_used, kv.num_cached) == (4, 0, 3)
    assert kv.lru_keys() == [2, 1, 0]
    assert kv.cached_prefix([range(0, 2), range(5, 6), range(2, 3)]) == [range(0, 2)]
    kv.acquire_cached([range(0, 1)])
    kv.allocate(2)  # one uncached block, then evict the LRU evictable block: 2
    assert kv.num_evictions == 1 and kv.cached_prefix([range(0, 3)]) == [range(0, 2)]
    with pytest.raises(KvCapacityError):
        kv.allocate(2)
    kv.check_invariants()


def test_shared_prefix_release_keeps_lru_order_tail_first():
    # Two sequences share blocks 0, 1; the first also holds 2, 3. Releasing it frees only its
    # own tail (3, then 2); the shared blocks follow (1, then 0) when the second one leaves.
    kv = KvBlockManager(num_blocks=6, block_size=16, enable_prefix_caching=True)
    kv.allocate(4)
    assert kv.register([range(0, 4)]) == [range(0, 4)]
    kv.acquire_cached([range(0, 2)])
    kv.allocate(1)  # the second sequence's private block
    kv.release([range(0, 4)], 4)
    assert (kv.num_used, kv.count_evictable([range(0, 4)])) == (3, 2)
    kv.release([range(0, 2)], 3)
    assert kv.lru_keys() == [3, 2, 1, 0]
    kv.allocate(3)  # 2 uncached free blocks, then evicts the LRU one: 3
    assert kv.cached_prefix([range(0, 4)]) == [range(0, 3)] and kv.num_evictions == 1
    kv.allocate(2)  # then 2 and 1
    assert kv.cached_prefix([range(0, 4)]) == [range(0, 1)]
    kv.acquire_cached([range(0, 1)])
    assert kv.num_free == 0
    kv.check_invariants()


def test_hits_split_pieces_in_place_and_evictions_cut_from_the_top():
    # One sequence released 0..9 (LRU 9..0) and another 20..24 (LRU 24..20). A hit on 3..5
    # leaves 9..6 and 2..0 where 9..0 was; evicting 6 blocks takes 9..6, then 2 and 1.
    kv = KvBlockManager(num_blocks=16, block_size=16, enable_prefix_caching=True)
    kv.allocate(15)
    kv.register([range(0, 10)])
    kv.register([range(20, 25)])
    kv.release([range(0, 10)], 10)
    kv.release([range(20, 25)], 5)
    kv.acquire_cached([range(3, 6)])
    assert kv.lru_keys() == [9, 8, 7, 6, 2, 1, 0, 24, 23, 22, 21, 20]
    kv.check_invariants()
    kv.allocate(7)  # 1 free, 6 evicted
    assert kv.lru_keys() == [0, 24, 23, 22, 21, 20] and kv.num_evictions == 6
    assert kv.cached_prefix([range(0, 10)]) == [range(0, 1)]
    assert kv.cached_prefix([range(3, 10)]) == [range(3, 6)]
    kv.release([range(3, 6)], 3)  # back as the most recent, tail first
    assert kv.lru_keys() == [0, 24, 23, 22, 21, 20, 5, 4, 3]
    kv.check_invariants()


def test_lru_order_survives_many_evictions_and_takes_from_the_middle():
    # Evicting one block at a time, far past the pool size, with hits taken out of the middle
    # of the LRU list and blocks released again: victims always leave oldest first.
    kv = KvBlockManager(num_blocks=8, block_size=16, enable_prefix_caching=True)
    released: list[int] = []  # LRU order the victims must follow
    kv.allocate(8)
    assert kv.register([range(8)]) == [range(8)]
    for key in range(7, -1, -1):  # one sequence per block, released in this order
        kv.release([range(key, key + 1)], 1)
        released.append(key)
    for step in range(200):
        hit = released[len(released) // 2]
        kv.acquire_cached([range(hit, hit + 1)])  # a prefix hit leaves the LRU list...
        released.remove(hit)
        kv.allocate(1)  # ...and the oldest evictable block goes
        victim = released.pop(0)
        assert kv.cached_prefix([range(victim, victim + 1)]) == [], step
        new = 100 + step
        assert kv.register([range(new, new + 1)]) == [range(new, new + 1)]
        kv.release([range(new, new + 1)], 1)
        kv.release([range(hit, hit + 1)], 1)  # ...and comes back as the most recent
        released += [new, hit]
        assert kv.lru_keys() == released, step
    assert kv.num_evictions == 200
    kv.check_invariants()


def test_registration_skips_cached_keys_and_disabled_cache_registers_nothing():
    kv = KvBlockManager(num_blocks=8, block_size=16, enable_prefix_caching=True)
    kv.allocate(3)
    assert kv.register([range(2, 3)]) == [range(2, 3)]
    kv.allocate(5)
    # Another sequence computed 0..4 too: key 2 is someone else's, its block stays uncached.
    assert kv.register([range(0, 5)]) == [range(0, 2), range(3, 5)]
    assert kv.num_cached == 5 and kv.register([range(0, 5)]) == []
    off = KvBlockManager(num_blocks=2, block_size=16, enable_prefix_caching=False)
    off.allocate(1)
    assert off.register([range(0, 1)]) == [] and off.cached_prefix([range(0, 1)]) == []


def _state_with_pieces() -> KvBlockManager:
    kv = KvBlockManager(num_blocks=16, block_size=16, enable_prefix_caching=True)
    kv.allocate(12)
    kv.register([range(0, 6), range(10, 14)])
    kv.release([range(0, 6)], 8)  # 0..5 evictable, 10..13 still held
    kv.check_invariants()
    return kv


@pytest.mark.parametrize("corrupt", ["overlap", "unlinked", "linked_held", "count", "run"])
def test_check_invariants_catches_each_broken_rule(corrupt):
    """The invariants the simulator's check mode asserts after every step: pieces sorted and
    disjoint within their run, exactly the unheld ones in the LRU list, counters that match."""
    kv = _state_with_pieces()
    (run,) = kv._pieces
    low, high = kv._pieces[run]
    if corrupt == "overlap":  # same sizes, but 5 now in both
        high.start, high.stop = 5, 9
    elif corrupt == "unlinked":  # an unheld piece missing from the LRU list
        kv._lru.next = kv._lru.prev = kv._lru
    elif corrupt == "linked_held":  # a held piece in the LRU list
        high.prev, high.next = low, kv._lru
        low.next = kv._lru.prev = high
    elif corrupt == "count":
        kv._num_evictable += 1
    else:  # a piece filed under another run
        kv._pieces[run + 1] = [kv._pieces[run].pop()]
    with pytest.raises(AssertionError):
        kv.check_invariants()


class PerBlockCache:
    """The rule, one entry per block (the manager's form before ranges): a key enters the
    LRU order when its last holder releases it, tail first, and leaves when taken or evicted."""

    def __init__(self, num_blocks: int):
        self.num_free_uncached = num_blocks
        self.refs: dict[int, int] = {}
        self.lru: dict[int, None] = {}  # insertion order is LRU order

    def cached_prefix(self, keys: list[int]) -> list[int]:
        hits = []
        for key in keys:
            if key not in self.refs:
                break
            hits.append(key)
        return hits

    def acquire_cached(self, keys: list[int]) -> None:
        for key in keys:
            self.lru.pop(key, None)
            self.refs[key] += 1

    def allocate(self, num_blocks: int) -> None:
        from_free = min(num_blocks, self.num_free_uncached)
        self.num_free_uncached -= from_free
        for key in list(self.lru)[:num_blocks - from_free]:
            del self.lru[key], self.refs[key]

    def register(self, keys: list[int]) -> list[int]:
        new = [key for key in keys if key not in self.refs]
        self.refs.update(dict.fromkeys(new, 1))
        return new

    def release(self, keys: list[int], num_blocks: int) -> None:
        self.num_free_uncached += num_blocks - len(keys)
        for key in reversed(keys):
            self.refs[key] -= 1
            if self.refs[key] == 0:
                self.lru[key] = None


def _run_keys(run: int, start: int, stop: int) -> range:
    base = (run << RUN_KEY_BITS) + 1000
    return range(base + start, base + stop)


@pytest.mark.parametrize("seed", range(6))
def test_range_cache_evicts_exactly_as_one_entry_per_block(seed):
    """Sequences on a few shared runs (a conversation's stream, or Mooncake-like pieces of
    several runs) admitted, registered and released in random order in a tight pool: the
    ranges give the same hits, registrations, free counts and LRU order, key for key, as
    the per-block rule after every operation (sharing, holes, partial evictions)."""
    rng = np.random.default_rng(seed)
    kv, model = KvBlockManager(40, 16, True), PerBlockCache(40)
    running: list[tuple[list[range], int]] = []
    num_holes = 0
    for step in range(400):
        if running and (rng.random() < 0.45 or kv.num_free < 12):
            runs, num_blocks = running.pop(int(rng.integers(len(running))))
            kv.release(runs, num_blocks)
            model.release(_keys(runs), num_blocks)
        else:
            # A run from block 0 (a stream), or from further in (a trace hash id at its place)
            num_runs = int(rng.integers(1, 3))
            runs = [_run_keys(int(run), start, start + int(rng.integers(1, 9)))
                    for run, start in zip(rng.choice(10, size=num_runs, replace=False),
                                          rng.integers(0, 4, num_runs), strict=True)]
            hits = kv.cached_prefix(runs)
            assert _keys(hits) == model.cached_prefix(_keys(runs)), step
            num_blocks = sum(map(len, runs)) + int(rng.integers(0, 3))  # some private blocks
            need = num_blocks - len(_keys(hits))
            if need + kv.count_evictable(hits) > kv.num_free:
                continue
            kv.acquire_cached(hits)
            model.acquire_cached(_keys(hits))
            kv.allocate(need)
            model.allocate(need)
            num_hits = len(_keys(hits))
            todo, keys = [], _keys(runs)[num_hits:]
            for run in runs:  # the runs past the hits, as block_key_runs cuts them
                rest = [key for key in run if key in keys]
                if rest:
                    todo.append(range(rest[0], rest[-1] + 1))
            new = kv.register(todo)
            assert _keys(new) == model.register(_keys(todo)), step
            num_holes += len(_keys(todo)) - len(_keys(new))
            running.append((hits + new, num_blocks))
        assert kv.lru_keys() == list(model.lru), step
        assert (kv.num_free_uncached, kv.num_cached) == (model.num_free_uncached,
                                                         len(model.refs)), step
        kv.check_invariants()
    assert kv.num_evictions > 100 and num_holes > 0  # evictions cut pieces; keys were taken


def _hash_seq(ids, per_id, namespace=2, seq_id=1):
    from sim.engine.sequence import Sequence

    return Sequence(seq_id=seq_id, hop="answer", adapter=0, kv_namespace=namespace,
                    num_prompt_tokens=400, num_output_tokens=1, submit_s=0.0,
                    num_stream_prompt_tokens=400, stream_id=9, hash_ids=ids,
                    hash_block_tokens=per_id)


def _names(seq, start, stop, block_size):
    """The definition: block j is (namespace, the hash id covering its first token, j)."""
    ids, per_id = seq.hash_ids, seq.hash_block_tokens
    last = min(400 // block_size, -(-len(ids) * per_id // block_size))
    return [(seq.kv_namespace, ids[j * block_size // per_id], j)
            for j in range(start, min(stop, last))]


@pytest.mark.parametrize("per_id", [64, 48, 40, 16, 8])
def test_trace_block_keys_are_one_to_one_with_block_names(per_id):
    """Keys of trace hash-id blocks are equal exactly where their names (namespace, hash id
    covering the block, block index) are, across sequences sharing prefixes, ids at other
    positions, ids below their position and ids past the computed range."""
    kv = KvBlockManager(num_blocks=64, block_size=16, enable_prefix_caching=True)
    rng = np.random.default_rng(per_id)
    prompts = [(7, 8, 9, 10, 11), (7, 8, 9, 12, 13), (3, 7, 8, 9), (0, 1, 2, 3, 4, 5, 6, 7),
               (5, 6, 2**40, 2**40 + 1, 9), (2**40, 2**40 + 1), (2, 3, 4, 5, 0, 1, 2)]
    prompts += [tuple(int(i) for i in rng.integers(0, 12, rng.integers(1, 9))) for _ in range(40)]
    key_of: dict[tuple, int] = {}
    name_of: dict[int, tuple] = {}
    for number, ids in enumerate(prompts):
        for namespace in (2, 3):
            seq = _hash_seq(ids, per_id, namespace, number)
            keys = [key for run in seq.block_key_runs(0, 30, 16, kv) for key in run]
            names = _names(seq, 0, 30, 16)
            assert len(keys) == len(names)
            for name, key in zip(names, keys, strict=True):
                assert key_of.setdefault(name, key) == key, name  # one key per name
                assert name_of.setdefault(key, name) == name, (key, name)  # one name per key
    with pytest.raises(ValueError, match="hash blocks"):
        _hash_seq((1, 2), per_id * 2).block_key_runs(0, 4, 16, kv)


@pytest.mark.parametrize("ids", [(7, 3, 2**40, 11, 5), (7, 8, 9, 12, 13, 6), (9, 10, 11, 12),
                                 (0, 1, 0)])
@pytest.mark.parametrize("per_id", [64, 48, 40, 16, 8])
def test_trace_block_key_runs_join_consecutive_ids_and_slice_consistently(per_id, ids):
    """A run of consecutive hash ids at consecutive positions is one range of keys; any span
    of blocks, in any order (the sequence slices a table built on first use when keys are
    computed) and for another pool's block size too, is the span of the whole prompt's keys."""
    seq = _hash_seq(ids, per_id)
    for block_size in (16, 8, 16):
        kv = KvBlockManager(num_blocks=64, block_size=block_size, enable_prefix_caching=True)
        whole = _keys(seq.block_key_runs(0, 60, block_size, kv))
        names = _names(seq, 0, 60, block_size)
        assert len(whole) == len(names)
        runs = seq.block_key_runs(0, 60, block_size, kv)
        chains = 1 + sum(b[1] - a[1] != b[2] * block_size // per_id - a[2] * block_size // per_id
                         for a, b in itertools.pairwise(names))
        assert len(runs) == chains, (runs, names)
        spans = [(start, stop) for start in range(0, 31, 3) for stop in range(start - 1, 32, 2)]
        for start, stop in spans:
            runs = seq.block_key_runs(start, stop, block_size, kv)
            assert _keys(runs) == whole[start:max(start, min(stop, len(whole)))], (start, stop)
            assert all(runs), (start, stop)  # no empty range
    numbered = any(not 0 <= i - p < 2**25 for p, i in enumerate(ids))  # some id - p
    assert (seq.hash_key_table is None) == numbered  # numbered keys: no table


@pytest.mark.parametrize("namespace", [-1, 0, 5, TRACE_NAMESPACES - 2, TRACE_NAMESPACES - 1])
def test_a_trace_hash_id_gets_one_key_whichever_way_it_is_asked(namespace):
    # A sequence keys its trace hash ids with trace_key_bases (many at once) or key_base (one
    # by one): the two must agree, or the same prompt misses its own cached blocks. Ids in
    # namespaces -1..62 below TRACE_NAMES get keys computed from (namespace, id), the same in
    # every manager and negative (never a numbered run's); any other is numbered in a table.
    names = (0, 7, TRACE_NAMES - 1, TRACE_NAMES)
    first, second = (KvBlockManager(num_blocks=4, block_size=16, enable_prefix_caching=True)
                     for _ in range(2))
    second.key_base(3, 99)  # a numbered run first: tables number runs in order of first use
    bases = first.trace_key_bases(namespace, names)
    assert bases == [first.key_base(namespace, name, True) for name in names]
    computed = namespace < TRACE_NAMESPACES - 1
    for name, base in zip(names, bases, strict=True):
        is_computed = computed and name < TRACE_NAMES
        assert (base < 0) == is_computed, (name, base)
        assert (second.key_base(namespace, name, True) == base) == is_computed, name
    assert first.computes_trace_keys(namespace, names[:3]) == computed
    assert not first.computes_trace_keys(namespace, names)
