"""SLO checks as predicates over summary metrics (metric names match the SloConfig fields)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from planner.scenario.schema import SloConfig

Slo = SloConfig


def slo_violations(slo: Slo, metrics: Mapping[str, float]) -> list[str]:
    """One line per objective the metrics miss; a missing or NaN metric counts as a miss."""
    out = []
    for name, limit in slo.model_dump().items():
        if limit is None:
            continue
        value = metrics.get(name, math.nan)
        if math.isnan(value) or value > limit:
            out.append(f"{name}={value:.4g} > {limit:.4g}")
    return out
