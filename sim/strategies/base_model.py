"""`base`: the base model alone, no adapters: every domain is served by the same weights."""

from __future__ import annotations

from sim.strategies.strategy import Strategy


class BaseModel(Strategy):
    kind = "base"
    uses_adapters = False
