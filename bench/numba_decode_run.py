"""A numba prototype of the fast path's decode-run evaluation (optional: `pip install
.[bench]`; nothing in sim/ imports it).

The pure-Python path (`sim.engine.decode_run.DecodeRun` over
`sim.engine.run_pricing.price_decode_steps`, `Engine.max_decode_run_steps`) stays the
specification. These kernels compute the same numbers from the same arrays:

* `run_ends`: the end of every step of a run, each the previous end plus the step's seconds:
  the other terms added around the attention in `StepCost.total_s`'s order, the attention (each
  decode's, one row of `tables`) summed over the decodes in numpy's pairwise order, so that
  every end is equal to the float the pure-Python path (and the step-by-step reference) gives,
  bit for bit;
* `steps_to_reach`: the first step ending at or after a time, from those ends;
* `max_run_steps`: the steps a run can take before a sequence finishes or the KV blocks run
  out (`Engine.max_decode_run_steps`'s count and bisection), in integers.

`bench/bench_numba.py` runs both on inputs captured from a simulation and checks equality.
"""

from __future__ import annotations

import numba
import numpy as np

PAIRWISE_BLOCK = 128
"""numpy's PW_BLOCKSIZE: below it, eight running sums; above, halves summed recursively."""


@numba.njit(cache=False)
def _pairwise_sum(a, lo, n):
    """numpy's pairwise summation of a[lo:lo + n] (float64, contiguous), step for step."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= PAIRWISE_BLOCK:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = 8
        while i < n - (n % 8):
            j = lo + i
            r0 += a[j]
            r1 += a[j + 1]
            r2 += a[j + 2]
            r3 += a[j + 3]
            r4 += a[j + 4]
            r5 += a[j + 5]
            r6 += a[j + 6]
            r7 += a[j + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[lo + i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(a, lo, n2) + _pairwise_sum(a, lo + n2, n - n2)


@numba.njit(cache=False)
def run_ends(start_s, before_s, after, tables, contexts, adv, num_steps, scratch):
    """Ends of steps 0..num_steps of a run from `start_s`: step k costs `before_s` (the sum
    of the terms `total_s` adds before attention) plus its attention (the rows of `tables`
    summed in turn, each at contexts + k * adv) plus each of `after` in turn. `scratch` is a float64
    buffer at least as long as `contexts` (Python's `sum` must add floats one by one: < 3.12)."""
    n = contexts.shape[0]
    ends = np.empty(num_steps + 1)
    ends[0] = start_s
    for k in range(num_steps):
        attention = 0.0
        for j in range(tables.shape[0]):
            for i in range(n):
                scratch[i] = tables[j, contexts[i] + adv * k]
            attention += 0.0 + _pairwise_sum(scratch, 0, n)
        total = before_s + attention
        for term in after:
            total += term
        ends[k + 1] = ends[k] + total
    return ends


@numba.njit(cache=False)
def steps_to_reach(ends, time_s, max_steps):
    """`DecodeRun.steps_to_reach(time_s, max_steps)` from the run's ends."""
    first = np.searchsorted(ends[:max_steps + 1], time_s)  # the first end at or after
    return min(max(first, 1), max_steps)


@numba.njit(cache=False)
def _extra_blocks(remaining, computed, held, k, adv, bs):
    total = 0
    for i in range(remaining.shape[0]):
        tokens = computed[i] + min(k * adv, remaining[i])
        need = -(-tokens // bs) - held[i]
        if need > 0:
            total += need
    return total


@numba.njit(cache=False)
def max_run_steps(remaining, computed, held, adv, bs, free):
    """`Engine.max_decode_run_steps` from each decode's (outputs left, computed tokens, blocks
    held) and the free blocks: the steps until the first finishes, fewer when blocks run out."""
    num_steps = -(-remaining.min() // adv)
    if remaining.shape[0] * -(-num_steps * adv // bs) <= free:
        return num_steps
    if _extra_blocks(remaining, computed, held, num_steps, adv, bs) <= free:
        return num_steps
    lo, hi = 1, num_steps
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _extra_blocks(remaining, computed, held, mid, adv, bs) <= free:
            lo = mid
        else:
            hi = mid
    return lo
