"""A decode run's steps priced in plain floats (`sim.engine.run_pricing.price_run_ends`) are
numpy's, bit for bit: `step_function` adds a row's values in the order numpy's `sum` does, and
a run's ends equal the numpy path's (`price_decode_steps` and a cumulative sum) for batches
below, at and above numpy's blocks of 8 and 128 values."""

from __future__ import annotations

import numpy as np
import pytest

from sim.engine.run_pricing import (
    create_step_terms,
    price_decode_steps,
    price_run_ends,
    step_function,
)


def _wide_values(rng: np.random.Generator, shape) -> np.ndarray:
    """Values over 16 orders of magnitude: any other order of adds rounds differently."""
    return rng.random(shape) * 10.0 ** rng.integers(-8, 8, shape)


@pytest.mark.parametrize("widths", (range(1, 20), range(20, 140), (255, 256, 257, 300, 1030)))
def test_a_step_functions_attention_is_numpys_row_sum(widths):
    rng = np.random.default_rng(0)
    for width in widths:
        attention = step_function(width, 0)
        for row in _wide_values(rng, (15, width)):
            assert attention(tuple(row.tolist()), 0.0) == row.sum(), width


@pytest.mark.parametrize("num_items", (1, 3, 7, 8, 9, 16, 23, 129, 260))
@pytest.mark.parametrize("adv", (1, 3))
def test_listed_run_ends_are_the_numpy_paths(num_items, adv):
    rng = np.random.default_rng(num_items)
    table = _wide_values(rng, 20_000) * 1e-6
    contexts = rng.integers(0, 10_000, num_items)
    # Terms before attention, and after it some zero (left out) and some not.
    terms = create_step_terms((2e-3, 7e-5, 0.0, 3e-7, 1.1e-4, 0.0, 9e-9, 4e-6), None)
    num_steps, start_s = 30, 17.123
    ends = np.empty(num_steps + 1)
    ends[0] = start_s
    ends[1:] = price_decode_steps(terms, lambda _: table, contexts, adv, 0, num_steps)
    np.cumsum(ends, out=ends)
    got = price_run_ends(terms, table.tolist(), contexts.tolist(), adv, start_s, num_steps)
    assert got == ends.tolist()
