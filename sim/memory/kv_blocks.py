"""Paged KV blocks with a prefix cache keyed by block keys and LRU eviction, held as ranges.

Blocks are counted, not named: a block is free, cached and unreferenced (evictable, kept in LRU
order), or held by sequences. A cached block carries a key; a sequence that finds a leading run
of its keys cached takes those blocks instead of computing them. Allocation takes uncached free
blocks first, then evicts the least recently released cached block.

Keys are ints and a run (a conversation's text stream, a trace hash id) names its blocks with
consecutive keys, so every operation takes ranges of keys, and the cache holds "pieces": ranges
of cached keys whose blocks share one reference count. The evictable pieces form a linked LRU
list; a sequence releases its blocks tail first, so a piece is evicted from its highest key
down, and a piece released right after the piece above it joins it. Splitting a piece where a
range starts or ends keeps each piece's place in that order, so evictions happen in the same
order, block for block, as with one entry per block: a 150-block turn costs a few piece
operations instead of 150 dict entries.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from operator import attrgetter

RUN_KEY_BITS = 32
"""Low bits of a block key: a run's offset (below 2**31) plus the block index (below 2**31).
The high bits name the run: a range of keys never spans two (`key >> RUN_KEY_BITS`)."""


TRACE_NAMESPACES = 64
TRACE_NAMES = (1 << 31) // TRACE_NAMESPACES
"""Trace runs (a hash id less its position in the prompt, see `sim.engine.sequence`) below this, in
namespaces -1..62, get keys computed from (namespace, name), all within a C long (-2**63 and
up); any other run is numbered in a table."""

_SCRAMBLE = 2654435761
_OFFSET_MASK = (1 << (RUN_KEY_BITS - 1)) - 1
"""A run's keys start at a scrambled offset below 2**31 (the run in the high bits keeps them
distinct): it spread runs over dict slots when the cache held a dict entry per block, and is
kept so that keys stay what they were."""

_start = attrgetter("start")


class KvCapacityError(RuntimeError):
    """An allocation asked for more blocks than are free (a scheduler bug, not bad input)."""


class _Piece:
    """Cached keys start..stop-1 with `refs` holders each; unreferenced ones sit in the LRU
    list (prev/next), to be evicted from stop-1 down."""

    __slots__ = ("start", "stop", "refs", "prev", "next")

    def __init__(self, start: int, stop: int, refs: int):
        self.start, self.stop, self.refs = start, stop, refs
        self.prev = self.next = self


class KvBlockManager:
    """Block accounting of one replica's KV pool."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.num_free_uncached = num_blocks
        self.num_evictions = 0
        self._pieces: dict[int, list[_Piece]] = {}
        """Run (key >> RUN_KEY_BITS) -> its cached pieces, sorted and disjoint."""
        self._lru = _Piece(0, 0, -1)
        """Sentinel of the circular LRU list: next is the oldest evictable piece."""
        self._num_cached = 0
        self._num_evictable = 0
        self._run_bases: dict[tuple[int, bool, int], int] = {}
        """(namespace, is_trace_hash, name) of each numbered run -> its key_base."""
        self._hash_block_tokens = 0
        """Tokens per trace hash id of the sequences keyed here (one value: see
        `check_hash_block_tokens`)."""

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
            return ((code * _SCRAMBLE) & _OFFSET_MASK) - ((code + 1) << RUN_KEY_BITS)
        bases = self._run_bases
        run = (namespace, is_trace_hash, name)
        base = bases.get(run)
        if base is None:  # runs are numbered in order of first use
            run_id = len(bases)
            base = bases[run] = (run_id << RUN_KEY_BITS) + self._offset(run_id)
        return base

    def check_hash_block_tokens(self, hash_block_tokens: int) -> None:
        """Sequences name a block under trace hash ids by (namespace, id - the id's position in
        the prompt, block index), one to one with (namespace, id, block index) only while the
        tokens per hash id are the same for all of them (one workload per pool)."""
        if self._hash_block_tokens != hash_block_tokens:
            if self._hash_block_tokens:
                raise ValueError(f"trace hash blocks of {hash_block_tokens} tokens in a KV pool "
                                 f"keyed with {self._hash_block_tokens}-token hash blocks")
            self._hash_block_tokens = hash_block_tokens

    @staticmethod
    def computes_trace_keys(namespace: int, names: tuple[int, ...]) -> bool:
        """Whether the keys of these trace hash ids are computed from (namespace, id) alone,
        the same in every manager and at any time (none needs a table entry)."""
        return bool(names) and -1 <= namespace < TRACE_NAMESPACES - 1 and 0 <= min(names) and \
            max(names) < TRACE_NAMES

    def trace_key_bases(self, namespace: int, names: tuple[int, ...]) -> list[int]:
        """`key_base(namespace, name, True)` of each trace hash id in `names`."""
        if self.computes_trace_keys(namespace, names):  # all computed: no call per id
            codes = [name * TRACE_NAMESPACES + namespace + 1 for name in names]
            return [((code * _SCRAMBLE) & _OFFSET_MASK) - ((code + 1) << RUN_KEY_BITS)
                    for code in codes]
        return [self.key_base(namespace, name, True) for name in names]

    @staticmethod
    def _offset(code: int) -> int:
        return (code * _SCRAMBLE) & _OFFSET_MASK

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take (uncached free plus evictable cached)."""
        return self.num_free_uncached + self._num_evictable

    @property
    def num_used(self) -> int:
        """Blocks held by sequences."""
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks carrying a cache key (held or evictable)."""
        return self._num_cached

    def cached_prefix(self, runs: list[range]) -> list[range]:
        """The leading keys of `runs` (ranges of keys, in order) found in the cache, as ranges:
        stops at the first key not cached."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        for run in runs:
            end = start = run.start
            for piece in self._pieces.get(start >> RUN_KEY_BITS, ()):
                if piece.stop <= end:
                    continue
                if piece.start > end:
                    break
                end = piece.stop
            end = min(end, run.stop)
            if end > start:
                hits.append(range(start, end))
            if end < run.stop:
                break
        return hits

    def count_evictable(self, runs: list[range]) -> int:
        """How many keys of `runs` (all cached) sit unreferenced in the LRU list."""
        num = 0
        for run in runs:
            for piece in self._pieces[run.start >> RUN_KEY_BITS]:
                if piece.refs == 0 and piece.stop > run.start and piece.start < run.stop:
                    num += min(piece.stop, run.stop) - max(piece.start, run.start)
        return num

    def acquire_cached(self, runs: list[range]) -> None:
        """Take a reference on cached blocks (a prefix hit)."""
        for run in runs:
            pieces = self._pieces[run.start >> RUN_KEY_BITS]
            if len(pieces) == 1 and pieces[0].start == run.start and pieces[0].stop == run.stop:
                first, stop = 0, 1  # the run is one whole piece (the usual case)
            else:
                first, stop = self._isolate(pieces, run.start, run.stop)
            for piece in pieces[first:stop]:
                if piece.refs == 0:
                    piece.prev.next, piece.next.prev = piece.next, piece.prev
                    self._num_evictable -= piece.stop - piece.start
                piece.refs += 1

    def allocate(self, num_blocks: int) -> None:
        """Take `num_blocks` uncached blocks, evicting LRU cached blocks when needed."""
        if num_blocks <= self.num_free_uncached:  # the usual case: no eviction
            self.num_free_uncached -= num_blocks
            return
        if num_blocks > self.num_free:
            raise KvCapacityError(f"allocate({num_blocks}) with only {self.num_free} free")
        from_free = min(num_blocks, self.num_free_uncached)
        self.num_free_uncached -= from_free
        num_evict = num_blocks - from_free
        if not num_evict:
            return
        self.num_evictions += num_evict
        self._num_evictable -= num_evict
        self._num_cached -= num_evict
        lru = self._lru
        while num_evict:
            piece = lru.next
            size = piece.stop - piece.start
            if size > num_evict:  # evict its top keys (released last, so the LRU ones)
                piece.stop -= num_evict
                return
            num_evict -= size
            lru.next = piece.next  # one at a time: a dropped chain would be cyclic garbage
            piece.next.prev = lru
            run = piece.start >> RUN_KEY_BITS
            pieces = self._pieces[run]
            if len(pieces) == 1:
                del self._pieces[run]
            else:
                pieces.remove(piece)

    def register(self, runs: list[range]) -> list[range]:
        """Give held, fully computed blocks their keys, except keys already cached (those
        blocks stay uncached); the ranges of keys registered, in order."""
        if not self.enable_prefix_caching:
            return []
        registered, pieces_of = [], self._pieces
        for run in runs:
            if not run:
                continue
            key = run.start >> RUN_KEY_BITS
            pieces = pieces_of.get(key)
            if pieces is None:  # a run not cached yet (a fresh trace hash id)
                pieces_of[key] = [_Piece(run.start, run.stop, 1)]
                registered.append(run)
                continue
            last = pieces[-1]
            if last.stop <= run.start:  # past every cached key of its run (the usual case)
                if last.refs == 1 and last.stop == run.start:
                    last.stop = run.stop
                else:
                    pieces.append(_Piece(run.start, run.stop, 1))
                registered.append(run)
                continue
            gaps, position = [], run.start
            for piece in pieces:
                if piece.stop <= position:
                    continue
                if piece.start >= run.stop:
                    break
                if piece.start > position:
                    gaps.append((position, piece.start))
                position = piece.stop
            if position < run.stop:
                gaps.append((position, run.stop))
            registered += [self._add_held(pieces, start, stop) for start, stop in gaps]
        self._num_cached += sum(map(len, registered))
        return registered

    def _add_held(self, pieces: list[_Piece], start: int, stop: int) -> range:
        """A new piece start..stop-1 held once; it joins a held-once piece that ends at start."""
        index = bisect_right(pieces, start, key=_start)
        left = pieces[index - 1] if index else None
        if left is not None and left.refs == 1 and left.stop == start:
            left.stop = stop
        else:
            pieces.insert(index, _Piece(start, stop, 1))
        return range(start, stop)

    def release(self, runs: list[range], num_blocks: int) -> None:
        """Drop a sequence's `num_blocks` blocks, of which `runs` (ranges of keys, in block
        order) are cached: tail first, so that shared prefixes are evicted last."""
        self.num_free_uncached += num_blocks - sum(map(len, runs))
        lru, pieces_of = self._lru, self._pieces
        for run in reversed(runs):
            pieces = pieces_of[run.start >> RUN_KEY_BITS]
            if len(pieces) == 1:
                piece = pieces[0]
                if piece.start == run.start and piece.stop == run.stop:  # the usual case
                    piece.refs -= 1  # the run is one whole piece, alone in its run
                    if not piece.refs:  # no piece above it in its run to join: to the tail
                        self._num_evictable += piece.stop - piece.start
                        tail = lru.prev
                        piece.prev, piece.next = tail, lru
                        tail.next = lru.prev = piece
                    continue
            first, stop = self._isolate(pieces, run.start, run.stop)
            for index in range(stop - 1, first - 1, -1):
                piece = pieces[index]
                piece.refs -= 1
                if piece.refs:
                    continue
                self._num_evictable += piece.stop - piece.start
                tail = lru.prev
                if tail.start == piece.stop and index + 1 < len(pieces) and \
                        pieces[index + 1] is tail:  # continues the tail piece downwards
                    tail.start = piece.start
                    del pieces[index]
                else:
                    piece.prev, piece.next = tail, lru
                    tail.next = lru.prev = piece

    def _isolate(self, pieces: list[_Piece], start: int, stop: int) -> tuple[int, int]:
        """Split pieces where keys start and stop fall inside them; the index span of the
        pieces then covering start..stop-1 (all cached)."""
        first = bisect_right(pieces, start, key=_start) - 1
        if pieces[first].start < start:
            self._split(pieces, first, start)
            first += 1
        end = first
        while end < len(pieces) and pieces[end].start < stop:
            if pieces[end].stop > stop:
                self._split(pieces, end, stop)
            end += 1
        return first, end

    @staticmethod
    def _split(pieces: list[_Piece], index: int, key: int) -> None:
        """Cut pieces[index] before `key`: the keys below become their own piece at `index`,
        right after the keys above in the LRU order (evicted later, as each key was)."""
        high = pieces[index]
        low = _Piece(high.start, key, high.refs)
        high.start = key
        pieces.insert(index, low)
        if high.refs == 0:
            low.prev, low.next = high, high.next
            high.next.prev = low
            high.next = low

    def lru_keys(self) -> list[int]:
        """Every evictable key, least recently released (next to be evicted) first."""
        keys = []
        piece = self._lru.next
        while piece is not self._lru:
            keys.extend(range(piece.stop - 1, piece.start - 1, -1))
            piece = piece.next
        return keys

    def check_invariants(self) -> None:
        """Raise AssertionError when the accounting is inconsistent."""
        assert 0 <= self.num_free_uncached <= self.num_blocks, self.num_free_uncached
        assert 0 <= self.num_free <= self.num_blocks, self.num_free
        num_cached = 0
        idle = []
        for run, pieces in self._pieces.items():
            assert pieces, run
            for piece, after in itertools.pairwise(pieces):
                assert piece.stop <= after.start, (piece.start, piece.stop, after.start)
            for piece in pieces:
                assert piece.start < piece.stop and piece.refs >= 0, (piece.start, piece.refs)
                assert piece.start >> RUN_KEY_BITS == (piece.stop - 1) >> RUN_KEY_BITS == run
                num_cached += piece.stop - piece.start
                if piece.refs == 0:
                    idle.append(piece)
        linked, piece = [], self._lru.next
        while piece is not self._lru:
            assert piece.next.prev is piece, piece.start
            linked.append(piece)
            piece = piece.next
        assert sorted(map(id, linked)) == sorted(map(id, idle)), "LRU list != unheld pieces"
        assert num_cached == self._num_cached, (num_cached, self._num_cached)
        assert sum(p.stop - p.start for p in idle) == self._num_evictable
        assert self.num_free_uncached + self._num_cached <= self.num_blocks
