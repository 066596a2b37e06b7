"""A numba prototype of the fast path's decode-run evaluation (optional: `pip install
.[bench]`; nothing in sim/ imports it).

The pure-Python path (`sim.engine.step_pricer.DecodeRun`, `Engine.max_decode_run_steps`)
stays the specification. These kernels compute the same numbers from the same arrays:

* `elapsed_s`: seconds of the first k steps of a run, `k * const + sum_i (P[c_i + adv k] -
  P[c_i])`, the sum taken in numpy's pairwise order (`_pairwise_sum`), so that it is equal to
  the float numpy gives, bit for bit;
* `steps_to_reach`: the first step ending at or after a time into the run, by the same
  bracketing search as `DecodeRun.steps_to_reach` (so the same steps are evaluated);
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
def array_sum(a):
    """`float(a.sum())` for a contiguous float64 array: 0.0 plus the pairwise sum."""
    return 0.0 + _pairwise_sum(a, 0, a.shape[0])


@numba.njit(cache=False)
def elapsed_s(const_s, contexts, prefix, adv, num_steps, scratch):
    """`DecodeRun(const_s, contexts, prefix, adv).elapsed_s(num_steps)`; `scratch` is a float64
    buffer at least as long as `contexts`."""
    n = contexts.shape[0]
    for i in range(n):
        c = contexts[i]
        scratch[i] = prefix[c + adv * num_steps] - prefix[c]
    return num_steps * const_s + (0.0 + _pairwise_sum(scratch, 0, n))


@numba.njit(cache=False)
def steps_to_reach(const_s, contexts, prefix, adv, target_s, max_steps, scratch):
    """`DecodeRun(...).steps_to_reach(target_s, max_steps)`: the same guess, bracket and
    bisection, so the same steps evaluated and the same answer."""
    if target_s <= 0:
        return 1
    end = elapsed_s(const_s, contexts, prefix, adv, max_steps, scratch)
    guess = min(max_steps, max(1, int(np.ceil(max_steps * target_s / end))))
    width = 1
    if elapsed_s(const_s, contexts, prefix, adv, guess, scratch) >= target_s:
        lo, hi = max(0, guess - 1), guess
        while lo > 0 and elapsed_s(const_s, contexts, prefix, adv, lo, scratch) >= target_s:
            lo, hi, width = max(0, lo - 2 * width), lo, 2 * width
    else:
        lo, hi = guess, min(max_steps, guess + 1)
        while hi < max_steps and elapsed_s(const_s, contexts, prefix, adv, hi,
                                           scratch) < target_s:
            lo, hi, width = hi, min(max_steps, hi + 2 * width), 2 * width
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if elapsed_s(const_s, contexts, prefix, adv, mid, scratch) >= target_s:
            hi = mid
        else:
            lo = mid
    return hi


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
