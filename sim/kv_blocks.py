"""Paged KV blocks with a prefix cache keyed by (KV namespace, block hash) and LRU eviction.

Blocks are counted, not named: a block is free, cached and unreferenced (evictable, kept in LRU
order), or held by sequences. A cached block carries a key; a sequence that finds a leading run
of its keys cached takes those blocks instead of computing them. Allocation takes uncached free
blocks first, then evicts the least recently released cached block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


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
        self._evictable: OrderedDict[Hashable, None] = OrderedDict()
        self.num_evictions = 0

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

    def count_cached_prefix(self, keys: list[Hashable | None]) -> int:
        """Leading keys found in the cache (stops at the first miss or uncacheable block)."""
        if not self.enable_prefix_caching:
            return 0
        found = list(map(self._refs.__contains__, keys))
        return found.index(False) if False in found else len(found)

    def count_evictable(self, keys: list[Hashable]) -> int:
        """How many of `keys` (all cached) sit unreferenced in the LRU list."""
        evictable = self._evictable
        return sum(map(evictable.__contains__, keys))

    def acquire_cached(self, keys: list[Hashable]) -> None:
        """Take a reference on cached blocks (a prefix hit)."""
        refs, evictable = self._refs, self._evictable
        for key in keys:
            count = refs[key]
            if count == 0:
                del evictable[key]
            refs[key] = count + 1

    def allocate(self, num_blocks: int) -> None:
        """Take `num_blocks` uncached blocks, evicting LRU cached blocks when needed."""
        if num_blocks > self.num_free:
            raise KvCapacityError(f"allocate({num_blocks}) with only {self.num_free} free")
        from_free = min(num_blocks, self.num_free_uncached)
        self.num_free_uncached -= from_free
        num_evict = num_blocks - from_free
        if num_evict:
            refs, pop = self._refs, self._evictable.popitem
            for _ in range(num_evict):
                del refs[pop(last=False)[0]]
            self.num_evictions += num_evict

    def register(self, key: Hashable) -> bool:
        """Give a held, fully computed block a cache key; False if the key is already cached."""
        if not self.enable_prefix_caching or key in self._refs:
            return False
        self._refs[key] = 1
        return True

    def release(self, keys: list[Hashable | None]) -> None:
        """Drop a sequence's blocks, tail first so that shared prefixes are evicted last."""
        num_uncached = keys.count(None)
        self.num_free_uncached += num_uncached
        if num_uncached == len(keys):
            return
        refs, evictable = self._refs, self._evictable
        for key in reversed(keys):
            if key is not None:
                count = refs[key] - 1
                refs[key] = count
                if not count:
                    evictable[key] = None

    def check_invariants(self) -> None:
        """Raise AssertionError when the accounting is inconsistent."""
        assert 0 <= self.num_free_uncached <= self.num_blocks, self.num_free_uncached
        assert 0 <= self.num_free <= self.num_blocks, self.num_free
        assert all(r >= 0 for r in self._refs.values())
        assert all(self._refs[k] == 0 for k in self._evictable)
