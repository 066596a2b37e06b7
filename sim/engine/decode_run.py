"""The step ends of a fast-path decode run, as the step-by-step clock reads them.

A run repeats one pure-decode step structure; the step-by-step path would advance its clock by
each step's seconds in turn, so the run's step ends are those additions, one by one (a cumulative
sum), and the timer that ends the run is set to land on them exactly (`delay_to`). A short run
is priced whole when it starts, in plain floats (`ListedDecodeRun`); a longer one in numpy
chunks as far as it is asked about (`DecodeRun`). Both answer the same questions.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from operator import sub

import numpy as np

FIRST_RUN_CHUNK_STEPS = 16
FIRST_RUN_CHUNK_ITEMS = 4096
"""A decode run prices its first `FIRST_RUN_CHUNK_STEPS` steps, or more while they hold at most
`FIRST_RUN_CHUNK_ITEMS` (step, decode) values; each later chunk doubles what it has (an arrival
usually cuts a run long before its end, and a chunk costs a timer)."""
MAX_RUN_CHUNK_ITEMS = 1 << 20
"""Most (step, decode) attention values a decode run evaluates at once."""


def delay_to(now_s: float, end_s: float) -> float:
    """A delay `d` with `now_s + d == end_s` in floats (what a SimPy timeout of `d` from now
    ends at): `end_s - now_s`, which lands there (exactly when end <= 2 now, by Sterbenz's
    lemma; otherwise its rounding is at most half an ulp of the end), stepped an ulp at a time
    should a rounding still miss."""
    delay = max(0.0, end_s - now_s)
    while now_s + delay < end_s:
        delay = math.nextafter(delay, math.inf)
    while now_s + delay > end_s and delay > 0.0:
        delay = math.nextafter(delay, -math.inf)
    return delay


class DecodeRun:
    """The step ends of a run of identical-structure decode steps from `start_s`, up to
    `max_steps` steps: each end the previous one plus the step's seconds (as the step-by-step
    clock adds them). `price_steps(first, count)` gives the seconds of steps first, ...,
    first + count - 1; they are priced in chunks, as far as the run is asked about, each of
    at most `MAX_RUN_CHUNK_ITEMS` (step, item) values for a run of `num_items` items."""

    def __init__(self, start_s: float, max_steps: int,
                 price_steps: Callable[[int, int], np.ndarray], num_items: int = 1):
        self.start_s, self.max_steps, self._price_steps = start_s, max_steps, price_steps
        num_items = max(1, num_items)
        self._chunk_steps = max(1, MAX_RUN_CHUNK_ITEMS // num_items)
        self._first_steps = max(FIRST_RUN_CHUNK_STEPS, FIRST_RUN_CHUNK_ITEMS // num_items)
        self._ends = np.empty(max_steps + 1)
        self._ends[0] = start_s
        self.num_priced_steps = 0
        """Steps whose end is known."""

    def price_more(self, up_to_steps: int) -> int:
        """Price the next chunk of steps, at most up to `up_to_steps`; the steps priced."""
        done = self.num_priced_steps
        if done < up_to_steps:
            count = min(min(up_to_steps, self.max_steps) - done, max(self._first_steps, done),
                        self._chunk_steps)
            ends = self._ends[done:done + count + 1]
            ends[1:] = self._price_steps(done, count)
            np.cumsum(ends, out=ends)  # one by one, from the last end
            self.num_priced_steps = done + count
        return self.num_priced_steps

    def end_s(self, num_steps: int) -> float:
        """When the first `num_steps` steps end."""
        while self.num_priced_steps < num_steps:
            self.price_more(num_steps)
        return float(self._ends[num_steps])

    def step_s(self, num_steps: int) -> np.ndarray:
        """Each of the first `num_steps` steps' seconds as the clock reads them (end minus
        start, as the step-by-step loop subtracts them)."""
        self.end_s(num_steps)
        ends = self._ends[:num_steps + 1]
        return ends[1:] - ends[:-1]

    def steps_to_reach(self, time_s: float, max_steps: int) -> int:
        """Fewest steps (>= 1, at most `max_steps`) whose end lies at or after `time_s`."""
        while self._ends[self.num_priced_steps] < time_s and self.num_priced_steps < max_steps:
            self.price_more(max_steps)
        ends = self._ends[:self.num_priced_steps + 1]
        return min(max(int(np.searchsorted(ends, time_s, side="left")), 1), max_steps)


class ListedDecodeRun:
    """A decode run priced whole: `DecodeRun`'s answers from its step ends, a list (`ends[k]`,
    when the first k steps end; `ends[0]`, the start)."""

    def __init__(self, ends: list[float]):
        self._ends = ends
        self.start_s, self.max_steps = ends[0], len(ends) - 1
        self.num_priced_steps = self.max_steps

    def price_more(self, up_to_steps: int) -> int:
        """Every step is priced already: the steps priced."""
        return self.num_priced_steps

    def end_s(self, num_steps: int) -> float:
        """When the first `num_steps` steps end."""
        return self._ends[num_steps]

    def step_s(self, num_steps: int) -> list[float]:
        """`DecodeRun.step_s`, as a list."""
        ends = self._ends
        return list(map(sub, ends[1:num_steps + 1], ends[:num_steps]))

    def steps_to_reach(self, time_s: float, max_steps: int) -> int:
        """Fewest steps (>= 1, at most `max_steps`) whose end lies at or after `time_s`."""
        return min(max(bisect_left(self._ends, time_s, 0, max_steps + 1), 1), max_steps)
