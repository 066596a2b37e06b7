"""bench/multilora_analysis.py: the cost fit recorded with each bench_multilora run recovers
the exponents of speeds generated from a known power law, and the spread across
configurations is the largest fastest / slowest ratio at one load."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.multilora_analysis import growth_row  # noqa: E402


def recorded(adapters_exp: float, slots_exp: float, queue_exp: float) -> list[dict]:
    """bench_multilora.json values for a grid of configurations and loads whose CPU time per
    request is 200 us x adapters^a x slots^s x (1 + queue)^q."""
    rows = []
    for adapters, slots in ((16, 16), (64, 16), (64, 64), (128, 32), (384, 192), (320, 16)):
        for load, queue in ((0.5, 0.4 + adapters / 100), (1.5, 3000.0 + slots)):
            us = 200 * adapters**adapters_exp * slots**slots_exp * (1 + queue)**queue_exp
            rows.append(dict(config=f"{adapters}a/{slots}s", load=load, num_requests=20_000,
                             requests_per_cpu_s=1e6 / us, mean_waiting=queue))
    return rows


@pytest.mark.parametrize("exponents", [(0.0, 0.0, 0.0), (0.3, -0.2, 0.1), (0.05, 0.5, 0.0)])
def test_the_fit_recovers_known_exponents(exponents):
    row = growth_row(recorded(*exponents))
    fitted = (row["adapters_exponent"], row["slots_exponent"], row["queue_exponent"])
    np.testing.assert_allclose(fitted, exponents, atol=2e-3)
    assert row["max_log_residual"] < 1e-6
    assert row["num_cases"] == 12 and row["num_requests"] == "20,000"


def test_the_spread_is_the_largest_ratio_at_one_load():
    rows = recorded(0.0, 0.0, 0.0)
    rows[0]["requests_per_cpu_s"] *= 3  # 16a/16s at 50%: three times the others
    rows[3]["requests_per_cpu_s"] /= 2  # 64a/16s at 150%: half
    row = growth_row(rows)
    assert row["spread_across_configs"] == pytest.approx(3.0)
    assert row["speed"] == "2,500 / 5,000 / 15,000"


def test_too_few_cases_or_configurations_give_no_row():
    assert growth_row(recorded(0.0, 0.0, 0.0)[:4]) is None
    two_configurations = [r for r in recorded(0.0, 0.0, 0.0) if r["config"] in ("64a/16s",
                                                                                "384a/192s")]
    assert growth_row(two_configurations * 2) is None
