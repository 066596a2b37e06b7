"""Adapter residency: max_loras GPU slots (LRU, pinned while a sequence runs) over a host cache.

A step can hold at most max_loras distinct adapters because a running sequence pins its
adapter's slot. Loading an adapter into a slot is a warm load when the host cache (vLLM's
max_cpu_loras, LRU) holds it: its bytes over PCIe only. An adapter the cache does not hold is
a cold load: read from its files into the cache first, then copied over PCIe; it may evict the
cache's least recently used adapter, whose next load is cold again. vLLM's server loads its
registered adapters (`--lora-modules`) into the host cache at start-up, in order, so a replica
may start with the first max_cpu_loras of them cached (`num_preloaded`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

NO_ADAPTER = -1


class AdapterSlots:
    """GPU slots and CPU cache of one replica."""

    def __init__(self, max_loras: int, max_cpu_loras: int, load_s: list[float],
                 disk_load_s: list[float] | None = None, num_preloaded: int = 0):
        """`load_s[a]`: seconds of copying adapter `a` from the host cache into a slot;
        `disk_load_s[a]`: seconds of loading it into the host cache first, on a cold load
        (none: free); adapters 0 .. `num_preloaded` - 1 (at most max_cpu_loras) start cached."""
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self._load_s = load_s
        self._disk_load_s = disk_load_s
        self._gpu: OrderedDict[int, int] = OrderedDict()  # adapter -> sequences pinning it
        self._cpu: OrderedDict[int, None] = OrderedDict.fromkeys(
            range(min(num_preloaded, max_cpu_loras)))
        self.num_pinned = 0
        """Adapters pinned by at least one sequence."""
        self.num_loads = 0
        self.num_cold_loads = 0

    @property
    def resident(self) -> tuple[int, ...]:
        """Adapters in GPU slots, least recently used first."""
        return tuple(self._gpu)

    def is_resident(self, adapter: int) -> bool:
        """Whether `adapter` already sits in a GPU slot."""
        return adapter in self._gpu

    @property
    def is_saturated(self) -> bool:
        """Every slot is pinned: only sequences of `pinned` adapters (or none) can start."""
        return self.num_pinned >= self.max_loras

    @property
    def pinned(self) -> Collection[int]:
        """The pinned adapters, when `is_saturated` (then every resident one is pinned)."""
        return self._gpu.keys()

    def can_activate(self, adapter: int) -> bool:
        """Whether a sequence using `adapter` could start now: a slot is free or holds an
        unpinned adapter, or `adapter` is resident."""
        return adapter == NO_ADAPTER or self.num_pinned < self.max_loras or adapter in self._gpu

    def is_cached(self, adapter: int) -> bool:
        """Whether the host cache holds `adapter` (its next slot load would be warm)."""
        return adapter in self._cpu

    def activate(self, adapter: int) -> float:
        """Pin `adapter` for one sequence; seconds of loading it (0 when resident; the host
        cache's read first when it does not hold it)."""
        if adapter == NO_ADAPTER:
            return 0.0
        pins = self._gpu.get(adapter)
        if pins is not None:
            self._gpu[adapter] = pins + 1
            self._gpu.move_to_end(adapter)
            if not pins:
                self.num_pinned += 1
            return 0.0
        self.num_pinned += 1
        if len(self._gpu) >= self.max_loras:
            victim = next(a for a, pins in self._gpu.items() if pins == 0)
            del self._gpu[victim]
        self._gpu[adapter] = 1
        self.num_loads += 1
        seconds = self._load_s[adapter]
        if adapter not in self._cpu:
            self.num_cold_loads += 1
            if self._disk_load_s is not None:
                seconds = self._disk_load_s[adapter] + seconds
            if len(self._cpu) >= self.max_cpu_loras:
                self._cpu.popitem(last=False)
        self._cpu[adapter] = None
        self._cpu.move_to_end(adapter)
        return seconds

    def release(self, adapter: int) -> None:
        """Unpin `adapter` for one sequence (it stays resident until evicted)."""
        if adapter != NO_ADAPTER:
            pins = self._gpu[adapter] = self._gpu[adapter] - 1
            if not pins:
                self.num_pinned -= 1
