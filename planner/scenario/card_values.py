"""Scenario strategies that name a router card take its measured accuracy and decision work.

`apply_router_cards` runs after a scenario validates (planner.scenario.loading calls it): for every
routed
strategy with `router_card`, the card is read and checked against the strategy (router kind, model,
routing layer, options among the strategy's adapters), then the strategy is rebuilt with
`router_accuracy_curve` from the card's settings and the decision-work fields the scenario left
unset, and without the path (the loaded scenario is self-contained). The card's decision *times*
were measured on its own hardware and model and are not copied: the simulator prices the decision
work on the scenario's hardware.
"""

from __future__ import annotations

from pathlib import Path

from planner.scenario.strategies import AccuracyPoint
from sim.strategies.router_card import RouterCard, RouterCardError, SettingResult, load_router_card


class RouterCardProblem(ValueError):
    """A card that does not fit its strategy; `loc` is the field path it is about."""

    def __init__(self, loc: tuple, message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _matching_setting(card: RouterCard, adapters: list[str], where: str) -> SettingResult:
    """The card setting that routes among exactly the strategy's adapters."""
    for setting in card.settings:
        if set(setting.options) == set(adapters):
            return setting
    same_size = [s for s in card.settings if s.num_options == len(adapters)]
    if same_size:
        missing = sorted(set(same_size[0].options) - set(adapters))
        raise RouterCardProblem((), f"{where}: options {missing} of setting "
                                f"{same_size[0].setting!r} are missing from the strategy's "
                                f"adapters {adapters}; name the adapters after the options")
    known = "; ".join(f"{s.setting} ({s.num_options}): {list(s.options)}" for s in card.settings)
    raise RouterCardProblem((), f"{where}: no setting routes among the strategy's "
                            f"{len(adapters)} adapters {adapters}; the card's settings: {known}")


def _card_point(card: RouterCard, s: SettingResult, file_name: str) -> AccuracyPoint:
    """One setting's accuracy: the seed mean (what the simulator samples misroutes with), its
    spread over seeds, and where it was measured (kept for the output)."""
    return AccuracyPoint(num_domains=s.num_options, accuracy=s.accuracy_mean,
                         accuracy_std=s.accuracy_std,
                         source=f"router card {file_name}: {card.router} on {card.model}, "
                                f"setting {s.setting}, {len(card.seeds)} seeds")


def _card_fields(strategy, card: RouterCard, setting: SettingResult, file_name: str) -> dict:
    """Fields the card fills: the accuracy curve and the decision work the user left unset."""
    by_options = {s.num_options: s for s in card.settings}
    fields: dict = {"router_accuracy_curve": tuple(_card_point(card, s, file_name)
                                                   for _, s in sorted(by_options.items())),
                    **strategy.card_work_fields(card, setting.work)}
    return {k: v for k, v in fields.items()
            if k == "router_accuracy_curve" or k not in strategy.model_fields_set}


def resolve_card(strategy, arch, folder: Path) -> dict:
    """The checked card's fields for one strategy; raises RouterCardProblem."""
    path = Path(strategy.router_card)
    path = path if path.is_absolute() else folder / path
    where = f"card {str(path)!r}"
    if strategy.router_accuracy is not None or strategy.router_accuracy_curve is not None:
        raise RouterCardProblem((), "router_card and router_accuracy/router_accuracy_curve both "
                                "given; the card supplies the accuracy, keep one")
    try:
        card = load_router_card(path)
    except RouterCardError as err:
        raise RouterCardProblem((), str(err)) from None
    if card.router != strategy.card_router_kind:
        raise RouterCardProblem((), f"{where} is a {card.router!r} router; a {strategy.kind!r} "
                                f"strategy takes a {strategy.card_router_kind!r} card")
    model = arch.name
    if card.model != model:
        raise RouterCardProblem((), f"{where} was measured on model {card.model!r}; this "
                                f"strategy runs {model!r} (to reuse its accuracy on another "
                                "model, copy it into router_accuracy_curve)")
    layer, source = strategy.routing_layer(arch)
    if card.routing_layer != layer:
        raise RouterCardProblem((), f"{where} reads routing layer {card.routing_layer}; this "
                                f"strategy's is {layer} ({source})")
    setting = _matching_setting(card, [a.name for a in strategy.adapters], where)
    return _card_fields(strategy, card, setting, path.name)


def apply_router_cards(scenario, folder: str | Path):
    """The scenario with every strategy's router card applied; raises RouterCardProblem with
    the strategy's field path as `loc`."""
    strategies = list(scenario.strategies)
    for i, strategy in enumerate(strategies):
        if getattr(strategy, "router_card", None) is None:
            continue
        try:
            fields = resolve_card(strategy, scenario.strategy_arch(i), Path(folder))
        except RouterCardProblem as err:
            raise RouterCardProblem(("strategies", i, "router_card"), str(err)) from None
        # The loaded strategy carries the card's numbers instead of the path: it stands alone
        # (dumped and loaded again anywhere, it is the same scenario).
        data = strategy.model_dump(exclude_unset=True) | fields | {"router_card": None}
        strategies[i] = type(strategy).model_validate(data)
    return scenario.model_copy(update={"strategies": tuple(strategies)})
