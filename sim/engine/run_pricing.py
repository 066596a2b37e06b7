"""The seconds of a decode run's steps, each as `StepPricer.step_s` prices the step, bit for bit.

A run repeats one pure-decode step: its terms but attention are fixed (`StepTerms`), and step
k's attention is numpy's sum of one table value per decode, at its context plus k * adv. Two
ways give the same floats: numpy over a block of steps at once (`price_decode_steps`: gather,
row sums, term adds; cheap per value, tens of thousands of instructions per call), and plain
floats, one compiled expression per step (`price_run_ends`: numpy's pairwise summation spelled
out by `pairwise_order`; cheap per call, dearer per value). Most runs are a few steps over a
small batch (an arrival or a finishing sequence cuts them): their first steps are priced the
second way, and the rest, should a run get that far, the first way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from functools import partial, reduce
from itertools import accumulate, repeat
from operator import add
from typing import NamedTuple

import numpy as np

from sim.cost.cost_model import StepCost

IS_SUM_SEQUENTIAL = sum([1.0, 1e100, 1.0, -1e100]) == 0.0
"""Whether `sum` over floats adds them one by one (Python < 3.12; later versions compensate
the rounding): then plain adds reproduce `StepCost.total_s` and `sum` is numpy's inner loop."""

TERM_NAMES = tuple(f.name for f in fields(StepCost) if f.name != "attention_s")
"""`StepCost`'s terms but attention, in field order (the order `total_s` adds them in)."""
ATTENTION_AT = [f.name for f in fields(StepCost)].index("attention_s")
"""How many of them `total_s` adds before attention."""

PAIRWISE_BLOCK = 128
"""numpy's `PW_BLOCKSIZE`: a float sum of more values splits in two halves."""


class StepTerms(NamedTuple):
    """A step's terms but attention, by its counts: `terms`, `StepCost`'s `TERM_NAMES` (replay_s
    is worked out with the attention when the step has replays or re-encodes); `everything`, for
    such a step, the model terms over all its items (`predict_step`'s `all_terms` by name,
    attention's to be replaced), else None; `before_s`, the terms `total_s` adds before
    attention, added as it adds them; `after_s`, the nonzero terms it adds after attention, in
    order (adding 0.0 changes no sum)."""

    terms: tuple[float, ...]
    everything: tuple[tuple[str, float], ...] | None
    before_s: float
    after_s: tuple[float, ...]


def non_attention_s(cost: StepCost) -> float:
    """The step's seconds but attention: its other terms summed (so that the value depends on
    those terms only, not on the float rounding of the attention it leaves out)."""
    return reduce(add, non_attention_terms(cost))


def non_attention_terms(cost: StepCost) -> tuple[float, ...]:
    """The step's terms but attention (`TERM_NAMES`)."""
    return tuple(getattr(cost, name) for name in TERM_NAMES)


def create_step_terms(terms: tuple[float, ...], everything) -> StepTerms:
    """`StepTerms` of these terms, with their split around attention."""
    return StepTerms(terms, everything, sum(terms[:ATTENTION_AT]),
                     tuple(t for t in terms[ATTENTION_AT:] if t != 0.0))


def total_s(terms: tuple[float, ...], attention: float) -> float:
    """`StepCost.total_s` of a step with these other terms and this attention."""
    return sum((*terms[:ATTENTION_AT], attention, *terms[ATTENTION_AT:]))


def pairwise_order(num_values: int, first: int = 0) -> str:
    """numpy's `sum` of a float64 array `v` of `num_values` values (from index `first`) as a
    Python expression whose adds run in numpy's order (its pairwise summation): below 8
    values, added one by one to 0.0; up to `PAIRWISE_BLOCK`, eight running sums over every
    eighth value, combined as ((0+1)+(2+3))+((4+5)+(6+7)), then the values past the last
    multiple of 8 added one by one; above, the sums of two halves (the first a multiple of 8
    long) added."""
    n, v = num_values, [f"v[{first + i}]" for i in range(num_values)]
    if n < 8:
        return " + ".join(["0.0", *v])
    if n > PAIRWISE_BLOCK:
        half = n // 2 - n // 2 % 8
        return f"({pairwise_order(half, first)}) + ({pairwise_order(n - half, first + half)})"
    m = n - n % 8
    r = [f"({' + '.join(v[j:m:8])})" for j in range(8)]
    return " + ".join([f"(({r[0]} + {r[1]}) + ({r[2]} + {r[3]})) + "
                       f"(({r[4]} + {r[5]}) + ({r[6]} + {r[7]}))", *v[m:]])


_STEP_FUNCTIONS: dict[tuple[int, int], Callable[..., float]] = {}


def step_function(num_items: int, num_after: int) -> Callable[..., float]:
    """f(v, before, *after): a step's seconds from its items' attention `v` (a tuple) and the
    terms around attention, added as `StepPricer.step_s` adds them: before + attention (summed
    in numpy's order, `pairwise_order`), then each term after it. Compiled once per shape, so
    a step costs one call and plain float adds (no numpy call, no loop)."""
    key = (num_items, num_after)
    function = _STEP_FUNCTIONS.get(key)
    if function is None:
        after = [f"a{i}" for i in range(num_after)]
        body = " + ".join([f"(b + ({pairwise_order(num_items)}))", *after])
        namespace: dict = {}
        exec(f"def step(v, b, {', '.join(after)}):\n    return {body}\n", namespace)  # noqa: S102
        function = _STEP_FUNCTIONS[key] = namespace["step"]
    return function


def price_run_ends(terms: StepTerms, table: list[float], contexts: list[int], adv: int,
                   start_s: float, num_steps: int) -> list[float]:
    """The ends of a decode run's first `num_steps` steps from `start_s`, in plain floats: end
    k + 1 is end k plus step k's seconds (`StepPricer.step_s`: the terms before attention,
    attention as numpy sums it, the terms after), step k's decodes at `contexts` + k * adv,
    one decode's attention at context x being `table[x]`. Each decode's values over the steps
    are a slice of the table, zipped into one tuple per step."""
    span = adv * num_steps
    items = zip(*[table[c:c + span:adv] for c in contexts], strict=True)
    if IS_SUM_SEQUENTIAL:
        after = terms.after_s
        steps = map(step_function(len(contexts), len(after)), items, repeat(terms.before_s),
                    *map(repeat, after))
    else:
        attention = map(step_function(len(contexts), 0), items, repeat(0.0))
        steps = map(partial(total_s, terms.terms), attention)
    return list(accumulate(steps, initial=start_s))


def price_decode_steps(terms: StepTerms, decode_table: Callable[[int], np.ndarray],
                       contexts: np.ndarray, adv: int, first: int, count: int) -> np.ndarray:
    """Seconds of steps first, ..., first + count - 1 of a decode run whose other terms are
    `terms` and whose decodes start at `contexts` (step k's at contexts + k * adv), as
    `StepPricer.step_s` prices each; `decode_table(x)` gives the decode attention table up to
    context x."""
    shifts = adv * np.arange(first, first + count)
    index = contexts[None, :] + shifts[:, None]  # [steps, decodes]
    table = decode_table(int(contexts.max()) + int(shifts[-1]))
    return _totals_s(terms, table[index].sum(axis=1))  # row sums: each step's own numpy sum


def _totals_s(terms: StepTerms, attention: np.ndarray) -> np.ndarray:
    """`total_s` of steps with these other terms, one per attention (which it reuses)."""
    if not IS_SUM_SEQUENTIAL:
        return np.array([total_s(terms.terms, a) for a in attention.tolist()])
    total = np.add(terms.before_s, attention, out=attention)
    for term in terms.after_s:
        total += term
    return total
