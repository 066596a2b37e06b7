"""`base`: the base model alone, no adapters: every domain is served by the same weights."""

from __future__ import annotations

import math

from sim.strategies.strategy import Strategy, TurnPricing


class BaseModel(Strategy):
    kind = "base"
    uses_adapters = False
    is_reference = True
    is_verifiable = True

    def switch_s(self, spec, pricing: TurnPricing, num_context_tokens: int,
                 kv_switch: tuple[float, str]) -> tuple[float, str]:
        return math.nan, "none (no adapters)"
