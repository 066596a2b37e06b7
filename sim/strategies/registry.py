"""The strategies by `kind`: one line per strategy. Adding one is a module with a `Strategy`
subclass and a line here (or `register(MyStrategy())` from outside, as a test does)."""

from __future__ import annotations

from sim.hardware.specs import ModelArch
from sim.strategies.base_model import BaseModel
from sim.strategies.contextual_mol import ContextualMol
from sim.strategies.mol import MixtureOfLoras
from sim.strategies.mol2 import Mol2
from sim.strategies.multi_agent import MultiAgent
from sim.strategies.multi_lora import MultiLora
from sim.strategies.placement import KvLayout
from sim.strategies.preft import PreFT
from sim.strategies.strategy import Strategy

STRATEGIES: dict[str, Strategy] = {}
"""kind -> the strategy object."""


def register(strategy: Strategy) -> Strategy:
    """Serve `strategy` under its `kind` (a kind registered again is replaced)."""
    if not strategy.kind:
        raise ValueError(f"{type(strategy).__name__}: a strategy needs a kind")
    STRATEGIES[strategy.kind] = strategy
    return strategy


register(BaseModel())
register(MultiLora())
register(PreFT())
register(MixtureOfLoras())
register(ContextualMol())
register(Mol2())
register(MultiAgent())


def get_strategy(kind: str) -> Strategy:
    """The strategy registered under `kind`; KeyError naming the registered kinds."""
    try:
        return STRATEGIES[kind]
    except KeyError:
        raise KeyError(f"unknown strategy kind {kind!r}; registered: {sorted(STRATEGIES)}") \
            from None


def kv_layout(arch: ModelArch, kind: str, placements: list[list[tuple[int, str]]]) -> KvLayout:
    """The KV layout of strategy `kind` whose adapters sit at `placements` (each adapter's
    (layer, module) pairs, resolved)."""
    return get_strategy(kind).kv_layout(arch, placements)
