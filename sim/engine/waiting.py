"""The waiting queue of one engine: FCFS order, and the same sequences filed by adapter.

Once every GPU slot is pinned by a running sequence, only waiters of a pinned adapter (or of no
adapter) can start, and vLLM's scheduler skips the others. Filed by adapter, the first such
waiters are found from the heads of the pinned adapters' queues, without walking the waiters
that would be skipped. Every entry carries a key that orders the whole queue: appended
sequences take increasing keys, sequences put back at the front (preempted) decreasing ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from heapq import heapify

from sim.engine.sequence import Sequence


class WaitingQueue:
    """Waiting sequences in FCFS order, also filed by adapter."""

    def __init__(self):
        self._order: deque[tuple[int, Sequence]] = deque()
        """(key, sequence) in FCFS order; entries of sequences taken from the middle stay
        until they reach the front (stale: the sequence's key in `_keys` differs or is gone)."""
        self._by_adapter: dict[int, deque[tuple[int, Sequence]]] = {}
        """Adapter -> its live (key, sequence) entries in FCFS order; no empty deques."""
        self._keys: dict[Sequence, int] = {}
        self._next_back = 0
        self._next_front = -1

    def __len__(self) -> int:
        return len(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __iter__(self):
        """Waiting sequences in FCFS order."""
        keys = self._keys
        return (seq for key, seq in self._order if keys.get(seq) == key)

    def append(self, seq: Sequence) -> None:
        """Queue `seq` last."""
        key = self._next_back
        self._next_back += 1
        self._file((key, seq))
        self._order.append((key, seq))

    def appendleft(self, seq: Sequence) -> None:
        """Queue `seq` first."""
        key = self._next_front
        self._next_front -= 1
        entry = (key, seq)
        self._keys[seq] = key
        queue = self._by_adapter.get(seq.adapter)
        if queue is None:
            self._by_adapter[seq.adapter] = deque((entry,))
        else:
            queue.appendleft(entry)
        self._order.appendleft(entry)

    def _file(self, entry: tuple[int, Sequence]) -> None:
        key, seq = entry
        self._keys[seq] = key
        queue = self._by_adapter.get(seq.adapter)
        if queue is None:
            self._by_adapter[seq.adapter] = deque((entry,))
        else:
            queue.append(entry)

    def first(self) -> Sequence:
        """The first waiting sequence."""
        order, keys = self._order, self._keys
        while keys.get(order[0][1]) != order[0][0]:
            order.popleft()
        return order[0][1]

    def popleft(self) -> Sequence:
        """Remove and return the first waiting sequence."""
        seq = self.first()
        self._order.popleft()
        self.remove_first_of(seq.adapter)
        return seq

    def first_of(self, adapter: int) -> Sequence:
        """The first waiting sequence of `adapter` (which has one)."""
        return self._by_adapter[adapter][0][1]

    def remove_first_of(self, adapter: int) -> int | None:
        """Remove the first waiting sequence of `adapter`; the key of its next one, if any."""
        queue = self._by_adapter[adapter]
        _, seq = queue.popleft()
        del self._keys[seq]
        if queue:
            return queue[0][0]
        del self._by_adapter[adapter]
        return None

    def heads(self, adapters: Collection[int], also: int) -> list[tuple[int, int]]:
        """(key, adapter) of the first waiter of each of `adapters` and of `also` that has
        one, as a heap; walks the shorter of `adapters` and the adapters with waiters."""
        by_adapter = self._by_adapter
        if len(by_adapter) <= len(adapters):
            heads = [(queue[0][0], a) for a, queue in by_adapter.items()
                     if a in adapters or a == also]
        else:
            heads = [(queue[0][0], a) for a in (*adapters, also)
                     if (queue := by_adapter.get(a))]
        heapify(heads)
        return heads
