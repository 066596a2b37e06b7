"""The step ends of a fast-path decode run, as the step-by-step clock reads them.

A run repeats one pure-decode step structure; the step-by-step path would advance its clock by
each step's seconds in turn, so the run's step ends are those additions, one by one (a cumulative
sum), and the timer that ends the run is set to land on them exactly (`delay_to`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

FIRST_RUN_CHUNK_STEPS = 16
"""Steps a decode run prices first; each later chunk doubles what it has (an arrival usually
cuts a run long before its end)."""


def delay_to(now_s: float, end_s: float) -> float:
    """A delay `d` with `now_s + d == end_s` in floats (what a SimPy timeout of `d` from now
    ends at): `end_s - now_s`, which lands there (exactly when end <= 2 now, by Sterbenz's
    lemma; otherwise its rounding is at most half an ulp of the end), stepped an ulp at a time
    should a rounding still miss."""
    delay = max(0.0, end_s - now_s)
    while now_s + delay < end_s:
        delay = np.nextafter(delay, np.inf)
    while now_s + delay > end_s and delay > 0.0:
        delay = np.nextafter(delay, -np.inf)
    return float(delay)


class DecodeRun:
    """The step ends of a run of identical-structure decode steps from `start_s`, up to
    `max_steps` steps: each end the previous one plus the step's seconds (as the step-by-step
    clock adds them). `price_steps(first, count)` gives the seconds of steps first, ...,
    first + count - 1; they are priced in chunks, as far as the run is asked about."""

    def __init__(self, start_s: float, max_steps: int,
                 price_steps: Callable[[int, int], np.ndarray], chunk_steps: int = 1):
        self.start_s, self.max_steps, self._price_steps = start_s, max_steps, price_steps
        self._chunk_steps = max(1, chunk_steps)
        self._ends = np.array([start_s])

    @property
    def num_priced_steps(self) -> int:
        """Steps whose end is known."""
        return self._ends.size - 1

    def price_more(self, up_to_steps: int) -> int:
        """Price the next chunk of steps, at most up to `up_to_steps`; the steps priced."""
        done = self.num_priced_steps
        if done < up_to_steps:
            count = min(up_to_steps, self.max_steps) - done
            count = min(count, max(FIRST_RUN_CHUNK_STEPS, done), self._chunk_steps)
            seconds = self._price_steps(done, count)
            ends = np.cumsum(np.concatenate((self._ends[-1:], seconds)))  # one by one
            self._ends = np.concatenate((self._ends, ends[1:]))
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
        return np.diff(self._ends[:num_steps + 1])

    def steps_to_reach(self, time_s: float, max_steps: int) -> int:
        """Fewest steps (>= 1, at most `max_steps`) whose end lies at or after `time_s`."""
        while self._ends[-1] < time_s and self.num_priced_steps < max_steps:
            self.price_more(max_steps)
        first = int(np.searchsorted(self._ends, time_s, side="left"))
        return min(max(first, 1), max_steps)
