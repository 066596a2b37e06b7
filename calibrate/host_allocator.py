"""Keep the C allocator's freed memory in the process between engine steps (CPU engines).

vLLM's CPU LoRA path builds each step's per-token adapter weights as new tensors, megabytes each for
a prefill chunk. glibc serves those from fresh `mmap`s and returns them to the OS on free (its
thresholds also move with the process's history), so every step page-faults them in again and the
same step costs up to about 2x more, by an amount that depends on what ran before (the measurement
is under "Allocator" in docs/calibration.md). vLLM's CPU guide asks for tcmalloc (a caching
allocator) in LD_PRELOAD for the same reason; setting glibc's thresholds in the running process
gives the profiler and the validation that behaviour without a preload. GPU engines are unaffected
(their tensors live in the CUDA caching allocator).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
"""glibc's mallopt parameter numbers (malloc.h)."""
MMAP_THRESHOLD_MAX = 32 << 20
"""The largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""
SETTINGS = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_TRIM_THRESHOLD, 1 << 30),
            (M_TOP_PAD, 64 << 20))
"""Allocations under 32 MiB come from the heap, which is trimmed only past 1 GiB free and grows
64 MiB at a time: a step's buffers are reused, not faulted in again."""


def keep_freed_memory() -> str:
    """Set glibc's thresholds so freed memory stays in the process; says what was done (the
    profiles record it)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return "default allocator (no glibc mallopt)"
    if not all(libc.mallopt(param, value) == 1 for param, value in SETTINGS):
        return "default allocator (glibc refused mallopt)"
    return "glibc, freed memory kept (mmap threshold 32 MiB, trim threshold 1 GiB)"
