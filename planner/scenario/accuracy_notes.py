"""Where each routed strategy's router accuracy comes from, for the output to say.

The simulator samples misroutes with one number per strategy (`resolved_router_accuracy`, the
seed mean where a router card measured it). These notes carry what that number leaves out: the
spread over training seeds a card measured, and whether the figure was measured at all. A
strategy that names neither a card nor an accuracy runs on a published figure
(`PUBLISHED_ROUTER_ACCURACY`), and its note says so in `PUBLISHED_LABEL`.
"""

from __future__ import annotations

import numpy as np

from planner.scenario.strategies import PUBLISHED_ACCURACY_WHAT, AccuracyPoint

PUBLISHED_LABEL = "published figure, not measured here"
"""The words every note on a default (published) accuracy carries."""


def _percent(value: float) -> str:
    return f"{100 * value:.2f}%"


def _spread_at(points: list[AccuracyPoint], num_domains: int) -> float | None:
    """The seed spread read at `num_domains` like the accuracy (linear between points, flat
    beyond the ends); None unless every point has one."""
    if any(p.accuracy_std is None for p in points):
        return None
    return float(np.interp(num_domains, [p.num_domains for p in points],
                           [p.accuracy_std for p in points]))


def _curve_source(points: list[AccuracyPoint], num_domains: int) -> str:
    """The source of the points the accuracy is read from at `num_domains`."""
    exact = [p for p in points if p.num_domains == num_domains]
    if exact:
        return exact[0].source or "the scenario's router_accuracy_curve"
    sources = sorted({p.source for p in points if p.source})
    where = "; ".join(sources) if sources else "the scenario's router_accuracy_curve"
    return f"{where}, read between measured option counts"


def accuracy_note(strategy) -> str | None:
    """One line: the accuracy the plan uses, its seed spread where measured, and its source;
    None for a strategy that does not route (the client names the adapter)."""
    if not hasattr(strategy, "resolved_router_accuracy"):
        return None
    value = strategy.resolved_router_accuracy
    if strategy.router_accuracy is not None:
        return f"router accuracy {_percent(value)} (router_accuracy given in the scenario)"
    if strategy.router_accuracy_curve is None:
        return (f"router accuracy {_percent(value)} ({PUBLISHED_ACCURACY_WHAT[strategy.kind]}): "
                f"{PUBLISHED_LABEL}")
    points = sorted(strategy.router_accuracy_curve, key=lambda p: p.num_domains)
    num_domains = len(strategy.adapters)
    spread = _spread_at(points, num_domains)
    shown = _percent(value) + (f" ± {_percent(spread)}" if spread is not None else "")
    return (f"router accuracy {shown} at {num_domains} options, mean"
            f"{' ± std over seeds' if spread is not None else ''} "
            f"({_curve_source(points, num_domains)})")


def accuracy_notes(scenario) -> dict[str, str]:
    """Strategy label -> its accuracy note, for the strategies that route."""
    notes = {s.label: accuracy_note(s) for s in scenario.strategies}
    return {label: note for label, note in notes.items() if note is not None}
