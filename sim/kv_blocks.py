"""Paged KV blocks with a prefix cache keyed by (KV namespace, block hash) and LRU eviction.

Blocks are counted, not named: a block is free, cached and unreferenced (evictable, kept in LRU
order), or held by sequences. A cached block carries a key; a sequence that finds a leading run
of its keys cached takes those blocks instead of computing them. Allocation takes uncached free
blocks first, then evicts the least recently released cached block.

A sequence's keys come in runs (a conversation's context is hundreds of blocks), so every
operation takes a whole list of keys and, in the usual case (all blocks new, all unshared),
updates the tables with C-level bulk calls; the per-key loop remains only for the mixed case and
does the same updates in the same order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from itertools import islice, takewhile


def _drain(iterator) -> None:
    """Run an iterator of side effects to its end at C speed."""
    deque(iterator, maxlen=0)


RUN_KEY_BITS = 32
"""Low bits of a block key: a run's offset (below 2**31) plus the block index (below 2**31)."""


TRACE_NAMESPACES = 64
TRACE_NAMES = (1 << 31) // TRACE_NAMESPACES
"""Trace hash ids below this, in namespaces -1..62, get keys computed from (namespace, id), all
within a C long (-2**63 and up); any other run is numbered in a table."""


class KvCapacityError(RuntimeError):
    """An allocation asked for more blocks than are free (a scheduler bug, not bad input)."""


class KvBlockManager:
    """Block accounting of one replica's KV pool."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.num_free_uncached = num_blocks
        self._refs: dict[Hashable, int] = {}
        # LRU order is insertion order: a key enters when its last holder releases it and
        # leaves when taken or evicted, never re-inserted while present. A plain dict keeps
        # that order like an OrderedDict, at a fraction of the cost per key.
        self._evictable: dict[Hashable, None] = {}
        self._num_holes = 0
        self._run_ids: dict[tuple[int, bool, int], int] = {}
        self.num_evictions = 0

    def key_base(self, namespace: int, name: int, is_trace_hash: bool = False) -> int:
        """Key of block 0 of the run named (namespace, name), a text stream or a trace hash id:
        block j of it is `key_base + j`. Plain ints hash and compare faster than tuples.
        Streams and trace hash ids are separate name spaces: a MoL hop keyed by conversation 5
        and an answer under trace hash id 5 in one adapter's KV are different text."""
        if is_trace_hash and 0 <= name < TRACE_NAMES and -1 <= namespace < TRACE_NAMESPACES - 1:
            # A trace names tens of millions of ids, most used once: a key computed from the
            # name needs no table entry (which cost more memory than the trace itself). These
            # keys are negative, so never equal to a numbered run's.
            code = name * TRACE_NAMESPACES + namespace + 1
            return -((code + 1) << RUN_KEY_BITS) + self._offset(code)
        run_ids = self._run_ids
        run = (namespace, is_trace_hash, name)
        run_id = run_ids.get(run)
        if run_id is None:
            run_id = run_ids[run] = len(run_ids)
        return (run_id << RUN_KEY_BITS) + self._offset(run_id)

    @staticmethod
    def _offset(code: int) -> int:
        # The run in the high bits keeps keys distinct; a scrambled offset in the low bits
        # spreads runs over the dicts' slots (which the low bits pick): with the block index
        # alone there, block j of every run would probe the same slot.
        return (code * 2654435761) % (1 << (RUN_KEY_BITS - 1))

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take (uncached free plus evictable cached)."""
        return self.num_free_uncached + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks held by sequences."""
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks carrying a cache key (held or evictable)."""
        return len(self._refs)

    def count_cached_prefix(self, keys) -> int:
        """Leading keys found in the cache (stops at the first miss or uncacheable block)."""
        if not self.enable_prefix_caching:
            return 0
        return len(list(takewhile(self._refs.__contains__, keys)))

    def cached_prefix(self, runs: list) -> list:
        """The leading keys of `runs` (key sequences, in order) found in the cache."""
        hits: list = []
        for run in runs:
            num = self.count_cached_prefix(run)
            hits.extend(run[:num])
            if num < len(run):
                break
        return hits

    def count_evictable(self, keys: list[Hashable]) -> int:
        """How many of `keys` (all cached) sit unreferenced in the LRU list."""
        evictable = self._evictable
        return sum(map(evictable.__contains__, keys))

    def acquire_cached(self, keys: list[Hashable]) -> None:
        """Take a reference on cached blocks (a prefix hit)."""
        refs, evictable = self._refs, self._evictable
        counts = list(map(refs.__getitem__, keys))
        num_idle = counts.count(0)
        if num_idle == len(counts):  # all unreferenced: a conversation's own earlier turn
            _drain(map(evictable.__delitem__, keys))
            refs.update(dict.fromkeys(keys, 1))
            return
        if num_idle:
            _drain(map(evictable.__delitem__,
                       [key for key, count in zip(keys, counts, strict=True) if count == 0]))
        refs.update(zip(keys, map((1).__add__, counts), strict=True))

    def allocate(self, num_blocks: int) -> None:
        """Take `num_blocks` uncached blocks, evicting LRU cached blocks when needed."""
        if num_blocks > self.num_free:
            raise KvCapacityError(f"allocate({num_blocks}) with only {self.num_free} free")
        from_free = min(num_blocks, self.num_free_uncached)
        self.num_free_uncached -= from_free
        num_evict = num_blocks - from_free
        if num_evict:
            evictable = self._evictable
            victims = list(islice(evictable, num_evict))  # least recently released first
            _drain(map(evictable.__delitem__, victims))
            _drain(map(self._refs.__delitem__, victims))
            self.num_evictions += num_evict
            # A dict leaves deleted entries in place until it grows, and iterating from the
            # front walks over them: copy it (same order) once its front holds more holes
            # than it has keys, so an eviction never walks far.
            self._num_holes += num_evict
            if self._num_holes > len(evictable):
                self._evictable = dict(evictable)
                self._num_holes = 0

    def register(self, key: Hashable) -> bool:
        """Give a held, fully computed block a cache key; False if the key is already cached."""
        if not self.enable_prefix_caching or key in self._refs:
            return False
        self._refs[key] = 1
        return True

    def register_new(self, keys: list[Hashable]) -> bool:
        """Register a run of keys at once when none is cached yet; False (and nothing done)
        otherwise, so that the caller registers them one by one."""
        refs = self._refs
        if not self.enable_prefix_caching or not refs.keys().isdisjoint(keys):
            return False
        refs.update(dict.fromkeys(keys, 1))
        return True

    def release(self, keys: list[Hashable | None]) -> None:
        """Drop a sequence's blocks, tail first so that shared prefixes are evicted last."""
        num_uncached = keys.count(None)
        self.num_free_uncached += num_uncached
        if num_uncached == len(keys):
            return
        refs, evictable = self._refs, self._evictable
        cached = [key for key in reversed(keys) if key is not None]
        counts = list(map(refs.__getitem__, cached))
        if counts.count(1) == len(counts):  # no other sequence shares them: all evictable
            refs.update(dict.fromkeys(cached, 0))
            evictable.update(dict.fromkeys(cached))
            return
        for key, count in zip(cached, counts, strict=True):
            refs[key] = count - 1
            if count == 1:
                evictable[key] = None

    def check_invariants(self) -> None:
        """Raise AssertionError when the accounting is inconsistent."""
        assert 0 <= self.num_free_uncached <= self.num_blocks, self.num_free_uncached
        assert 0 <= self.num_free <= self.num_blocks, self.num_free
        assert all(r >= 0 for r in self._refs.values())
        assert all(self._refs[k] == 0 for k in self._evictable)
