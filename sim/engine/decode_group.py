"""The decoding sequences of one engine's batch, kept as one group: state per batch, not per
sequence, so that an engine event costs what changes, not the batch size.

A sequence past its prompt decodes `adv` tokens in every step until it finishes, so the group
keeps one token counter `tick` for all its members: a member's generated tokens are
`tick - base` (capped at its outputs) and its computed tokens `prompt - 1 + generated` (one
token, the last sampled, is pending). A member's fields are written back (`leave`) when it
leaves the group: when it finishes, or when the engine needs every sequence as plain state
(`dissolve`). Between those, two heaps say which members need attention at a tick: the tick
at which a member's computed tokens outgrow its KV blocks, and the tick at which it finishes.
Each step's decode seconds per member (its share) are added once, to one running sum for the
group kept exactly (an integer count of 2**-100 s); a member that leaves adds the exact sum of
the shares since it joined to its own exact sum (`add_decode_busy`). So a member's busy time
costs O(1) whatever the steps it ran, and is the same float whether its shares came one step at
a time, a run at once, inside the group or outside it. Members stay in running (admission)
order, the order of a plan's decodes, so that the step pricer sums their attention in the same
order.
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import heapify, heappop, heappush

import numpy as np

from sim.engine.sequence import Sequence

SHARE_UNITS_PER_S = 1 << 100
"""The exact running sum of shares counts units of 2**-100 s: every share of 2**-47 s (7e-15 s)
or more is a whole number of them (a float's last bit is at most 2**-52 of its value), so the
sum is exact; a smaller share loses its bits below the unit, the same in both paths."""
SHARE_SCALE = float(SHARE_UNITS_PER_S)
_SECONDS_PER_UNIT = 1.0 / SHARE_SCALE
MIN_SIZE_BY_EXPONENT, MAX_SIZE_BY_EXPONENT = 64, 1 << 10
"""`share_units` sums an array this long through its floats' mantissas and exponents."""


def add_decode_busy(seq: Sequence, units: int) -> None:
    """Add `units` (of 2**-100 s) to `seq`'s decode busy time, its exact sum rounded once: the
    same however its shares were grouped (step by step, a run at once, a group membership)."""
    seq.busy_decode_units += units
    # float() rounds the exact sum once; scaling by a power of two is exact.
    seq.busy_decode_s = float(seq.busy_decode_units) * _SECONDS_PER_UNIT


def share_units(seconds) -> int:
    """Exact sum of shares (a float or an array of them), in units of 2**-100 s: each share's
    `int(share * SHARE_SCALE)`, summed."""
    if isinstance(seconds, float):
        return int(seconds * SHARE_SCALE)
    seconds = np.asarray(seconds, dtype=float)
    if MIN_SIZE_BY_EXPONENT <= seconds.size <= MAX_SIZE_BY_EXPONENT:
        # share = m * 2**(e - 53), m a 53-bit integer: in units, m << (e + 47), whole when
        # e >= -47 (shares of 2**-48 s or more). Summed per exponent in int64 (at most 2**10
        # values of under 2**53), then shifted: a few numpy calls, not a big int a share.
        mantissas, exponents = np.frexp(seconds)
        low = int(exponents.min())
        if low >= -47:
            whole = (mantissas * 2.0**53).astype(np.int64)
            return sum(int(whole[exponents == e].sum()) << (e + 47)
                       for e in range(low, int(exponents.max()) + 1))
    return sum(map(int, (seconds * SHARE_SCALE).tolist()))


class _Member:
    __slots__ = ("base", "order", "share_start", "token")

    def __init__(self, base: int, order: int, share_start: int, token: int):
        self.base, self.order, self.share_start, self.token = base, order, share_start, token


class DecodeGroup:
    """Decoding sequences of one engine, advanced together by a token counter."""

    def __init__(self, block_size: int, tokens_per_step: int):
        self.block_size, self.adv = block_size, tokens_per_step
        self.tick = 0
        self.members: list[Sequence] = []
        """In running order."""
        self.orders: list[int] = []
        """Each member's running order (ascending)."""
        self.context_offsets: list[int] = []
        """Each member's computed tokens minus `tick`."""
        self._offsets_array: np.ndarray | None = None  # of context_offsets, until they change
        self._end_contexts: list[int] = []
        """Each member's computed tokens once it has finished (prompt - 1 + outputs)."""
        self._ends_array: np.ndarray | None = None  # of _end_contexts, until they change
        self.adapters: dict[int, int] = {}
        """Members per adapter, over members whose decode is adapted."""
        self.num_adapted = 0
        self._info: dict[Sequence, _Member] = {}
        self._block_heap: list[tuple[int, int, int, Sequence]] = []
        """(tick at which the member needs another block, order, token, member)."""
        self._finish_heap: list[tuple[int, int, int, Sequence]] = []
        """(tick at which the member finishes, order, token, member)."""
        self._share_units = 0
        """Every share added so far, summed exactly (`SHARE_UNITS_PER_S`)."""
        self._num_tokens = 0  # memberships so far: a heap entry of an older one is stale

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self._info

    def join(self, seq: Sequence, order: int) -> None:
        """Add a decoding sequence (one pending token) that ran as plain state until now."""
        self._num_tokens += 1
        base = self.tick - seq.num_generated_tokens
        info = _Member(base, order, self._share_units, self._num_tokens)
        self._info[seq] = info
        i = bisect_left(self.orders, order)
        self.members.insert(i, seq)
        self.orders.insert(i, order)
        self.context_offsets.insert(i, seq.num_computed_tokens - self.tick)
        self._end_contexts.insert(i, seq.num_prompt_tokens - 1 + seq.num_output_tokens)
        self._offsets_array = self._ends_array = None
        if seq.is_decode_adapted and seq.adapter >= 0:
            self.adapters[seq.adapter] = self.adapters.get(seq.adapter, 0) + 1
            self.num_adapted += 1
        heappush(self._finish_heap, (base + seq.num_output_tokens, order, info.token, seq))
        self._push_block_tick(seq, info)

    def join_all(self, seqs: list[Sequence], orders: list[int]) -> None:
        """`join` each of `seqs` (with its running order), in that order. Into an empty group
        (after a dissolve, the whole batch) they are laid out at once and the heaps rebuilt,
        rather than inserted one by one; the entries, and so what the heaps give, are the
        same."""
        if self.members or len(seqs) < 2:
            for seq, order in zip(seqs, orders, strict=True):
                self.join(seq, order)
            return
        tick, info = self.tick, self._info
        share_start = self._share_units
        adapters = self.adapters
        joined = []
        for seq, order in zip(seqs, orders, strict=True):
            self._num_tokens += 1
            member = info[seq] = _Member(tick - seq.num_generated_tokens, order, share_start,
                                         self._num_tokens)
            joined.append((order, seq, member))
            if seq.is_decode_adapted and seq.adapter >= 0:
                adapters[seq.adapter] = adapters.get(seq.adapter, 0) + 1
                self.num_adapted += 1
        joined.sort(key=lambda entry: entry[0])
        self.members[:] = [seq for _, seq, _ in joined]
        self.orders[:] = [order for order, _, _ in joined]
        self.context_offsets[:] = [seq.num_computed_tokens - tick for _, seq, _ in joined]
        self._end_contexts[:] = [seq.num_prompt_tokens - 1 + seq.num_output_tokens
                                 for _, seq, _ in joined]
        self._offsets_array = self._ends_array = None
        self._finish_heap += [(m.base + seq.num_output_tokens, order, m.token, seq)
                              for order, seq, m in joined]
        heapify(self._finish_heap)
        self._block_heap += [self._block_entry(seq, m) for _, seq, m in joined]
        heapify(self._block_heap)

    def _block_entry(self, seq: Sequence, info: _Member) -> tuple[int, int, int, Sequence]:
        # Computed tokens prompt - 1 + tick - base exceed the blocks held from this tick on.
        tick = seq.num_blocks * self.block_size - seq.num_prompt_tokens + 2 + info.base
        return tick, info.order, info.token, seq

    def _push_block_tick(self, seq: Sequence, info: _Member) -> None:
        heappush(self._block_heap, self._block_entry(seq, info))

    def _generated(self, seq: Sequence, info: _Member, tick: int) -> int:
        return min(seq.num_output_tokens, tick - info.base)

    def _pop_due(self, heap: list, tick: int) -> list[Sequence]:
        """Members whose entry in `heap` is at or before `tick` (stale entries dropped)."""
        due, info = [], self._info
        while heap and heap[0][0] <= tick:
            _, _, token, seq = heappop(heap)
            member = info.get(seq)
            if member is not None and member.token == token:
                due.append(seq)
        return due

    def step_block_needs(self) -> list[tuple[Sequence, int]]:
        """(member, blocks) each member lacks for the next step's tokens, nonzero ones only.
        Takes them off the block heap: `add_blocks` must follow (or `dissolve`)."""
        info, adv, bs, tick = self._info, self.adv, self.block_size, self.tick
        needs = []
        for seq in self._pop_due(self._block_heap, tick + adv):
            generated = tick - info[seq].base
            new = min(adv, seq.num_output_tokens - generated)
            end = seq.num_prompt_tokens - 1 + generated + new
            needs.append((seq, -(-end // bs) - seq.num_blocks))
        return needs

    def add_blocks(self, needs: list[tuple[Sequence, int]]) -> None:
        """Extend each member's blocks by its (unallocated) need and re-arm its heap entry."""
        heap, info, bs = self._block_heap, self._info, self.block_size
        for seq, need in needs:  # `_push_block_tick` inlined: a few per member per step
            if need > 0:
                seq.num_blocks += need
            member = info[seq]
            heappush(heap, (seq.num_blocks * bs - seq.num_prompt_tokens + 2 + member.base,
                            member.order, member.token, seq))

    def advance(self, num_tokens: int) -> tuple[int, list[Sequence]]:
        """Every member decodes `num_tokens` more (capped at its outputs): extend the blocks of
        those whose computed tokens outgrew them; return the blocks added (to allocate) and the
        members that finished, in running order (still members: `leave` them)."""
        self.tick += num_tokens
        tick, info, bs = self.tick, self._info, self.block_size
        # A run of a block's worth of tokens takes every member past a block edge: walk them
        # and rebuild the heap at once rather than pop and push each.
        if num_tokens >= bs:
            due = self.members
            self._block_heap = []
        else:
            due = self._pop_due(self._block_heap, tick)
        added, entries = 0, []
        for seq in due:  # `_generated` and `_block_entry` inlined: every member of a long run
            member = info[seq]
            prompt, blocks = seq.num_prompt_tokens, seq.num_blocks
            need = -(-(prompt - 1 + min(seq.num_output_tokens, tick - member.base)) // bs) \
                - blocks
            if need > 0:
                added += need
                blocks = seq.num_blocks = blocks + need
            entries.append((blocks * bs - prompt + 2 + member.base, member.order, member.token,
                            seq))
        if due is self.members:
            self._block_heap = entries
            heapify(entries)
        else:
            heap = self._block_heap
            for entry in entries:
                heappush(heap, entry)
        finished = self._pop_due(self._finish_heap, tick)
        finished.sort(key=lambda s: info[s].order)
        return added, finished

    def min_remaining(self) -> int:
        """Fewest output tokens a member has left."""
        heap, info = self._finish_heap, self._info
        while True:  # drop stale entries off the top
            end, _, token, seq = heap[0]
            member = info.get(seq)
            if member is not None and member.token == token:
                return end - self.tick
            heappop(heap)

    def contexts(self, extra: list[Sequence]) -> np.ndarray:
        """Context tokens of the members, then of `extra` (plain decodes after them)."""
        if self._offsets_array is None:
            self._offsets_array = np.array(self.context_offsets, dtype=np.int64)
        contexts = self._offsets_array + self.tick
        if extra:
            contexts = np.append(contexts, [s.num_computed_tokens for s in extra])
        return contexts

    def run_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`rows` as three int64 arrays (outputs left, computed tokens, blocks held), from the
        kept offsets and ends: only the blocks are read off the members."""
        computed = self.contexts([])
        if self._ends_array is None:
            self._ends_array = np.array(self._end_contexts, dtype=np.int64)
        held = np.fromiter((seq.num_blocks for seq in self.members), np.int64,
                           count=len(self.members))
        return self._ends_array - computed, computed, held

    def rows(self) -> list[tuple[int, int, int]]:
        """(outputs left, computed tokens, blocks held) of each member, in running order."""
        tick, info = self.tick, self._info
        rows = []
        for seq in self.members:
            generated = tick - info[seq].base
            rows.append((seq.num_output_tokens - generated,
                         seq.num_prompt_tokens - 1 + generated, seq.num_blocks))
        return rows

    def add_share(self, seconds) -> None:
        """Every member's share of one step's decode seconds (or an array of steps' shares)."""
        self._share_units += share_units(seconds)

    def add_units(self, units: int) -> None:
        """Every member's shares, already summed exactly (`share_units`)."""
        self._share_units += units

    def _busy_since(self, member: _Member) -> int:
        """The exact sum of the shares added since `member` joined (units of 2**-100 s)."""
        return self._share_units - member.share_start

    def leave(self, seq: Sequence) -> None:
        """Write the member's state back to its fields and remove it."""
        member = self._info.pop(seq)
        generated = self._generated(seq, member, self.tick)
        seq.num_generated_tokens = generated
        seq.num_computed_tokens = seq.num_prompt_tokens - 1 + generated
        add_decode_busy(seq, self._busy_since(member))
        i = bisect_left(self.orders, member.order)
        del self.members[i], self.orders[i], self.context_offsets[i], self._end_contexts[i]
        self._offsets_array = self._ends_array = None
        if seq.is_decode_adapted and seq.adapter >= 0:
            self.num_adapted -= 1
            if self.adapters[seq.adapter] == 1:
                del self.adapters[seq.adapter]
            else:
                self.adapters[seq.adapter] -= 1

    def dissolve(self) -> None:
        """Every member back to plain state (the engine walks the batch itself this step):
        `leave` for all at once."""
        tick, info = self.tick, self._info
        for seq in self.members:
            member = info[seq]
            generated = min(seq.num_output_tokens, tick - member.base)
            seq.num_generated_tokens = generated
            seq.num_computed_tokens = seq.num_prompt_tokens - 1 + generated
            add_decode_busy(seq, self._busy_since(member))
        info.clear()
        self.members.clear()
        self.orders.clear()
        self.context_offsets.clear()
        self._end_contexts.clear()
        self._offsets_array = self._ends_array = None
        self.adapters.clear()
        self.num_adapted = 0
        self._block_heap.clear()
        self._finish_heap.clear()
