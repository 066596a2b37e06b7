"""Router cards in scenarios: accuracy and decision work from the card, located errors otherwise."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from planner.scenario.loading import ScenarioError, load_scenario
from sim.strategies.router_card import RouterCardError, load_router_card

REPO = Path(__file__).resolve().parents[2]
OPTIONS = ["chat", "code", "legal", "prose"]


def _timing() -> dict:
    return dict(p50_ms=1.0, p99_ms=2.0, batched_p50_ms=0.5, batched_p99_ms=0.6, batch_size=16,
                num_requests=30, includes="head")


def _setting(name: str, options: list[str], accuracies: list[float], prefill: int = 60) -> dict:
    return dict(setting=name, num_options=len(options), options=options, num_test=100,
                accuracy_per_seed=accuracies, accuracy_mean=sum(accuracies) / len(accuracies),
                accuracy_std=0.01, train_seconds_mean=3.0, decision=_timing(),
                work=dict(num_prefill_tokens=prefill, num_decode_tokens=3, num_head_params=0,
                          num_tokens_per_option=5.5),
                data_fingerprint="abc")


def card(router: str = "mol_l0", model: str = "smollm2-135m", layer: int = 26) -> dict:
    ten = [f"d{i}" for i in range(10)]
    return dict(name="c", router=router, model=model, routing_layer=layer, num_params=1234,
                seeds=[0, 1], training="t", command="python -m engine_ext.routers.train",
                data_sources=["x"], hardware=dict(cpu="cpu", num_threads=1,
                                                  load_average=[1.0, 1.0, 1.0]),
                settings=[_setting("domains4", OPTIONS, [0.9, 0.8]),
                          _setting("ten", ten, [0.7, 0.6], prefill=80)])


def write_case(tmp_path: Path, card_data: dict, strategy: str, model: str = "smollm2-135m"
               ) -> Path:
    (tmp_path / "cards").mkdir(exist_ok=True)
    (tmp_path / "cards" / "router.json").write_text(json.dumps(card_data))
    path = tmp_path / "scenario.yaml"
    path.write_text(f"model: {model}\nstrategies:\n" + textwrap.indent(
        textwrap.dedent(strategy), "  "))
    return path


MOL = """\
- kind: mol
  adapters:
    - {name: chat, layers: [26, 27, 28, 29]}
    - {name: code, layers: [26, 27, 28, 29]}
    - {name: legal, layers: [26, 27, 28, 29]}
    - {name: prose, layers: [26, 27, 28, 29]}
  num_route_decode_tokens: 7
  router_card: cards/router.json
"""
CONTEXTUAL = """\
- kind: contextual_mol
  adapters: [{name: chat}, {name: code}, {name: legal}, {name: prose}]
  router_card: cards/router.json
"""


def error_of(path: Path) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    [message] = info.value.messages
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "router_card" in ln)
    prefix = f"{path}:{line}: strategies.0.router_card: "
    assert message.startswith(prefix), message
    return message[len(prefix):]


def test_mol_card_fills_accuracy_curve_and_unset_route_work(tmp_path):
    strategy = load_scenario(write_case(tmp_path, card(), MOL)).strategies[0]
    assert [(p.num_domains, p.accuracy) for p in strategy.router_accuracy_curve] == \
        [(4, pytest.approx(0.85)), (10, pytest.approx(0.65))]
    assert strategy.resolved_router_accuracy == pytest.approx(0.85)  # 4 adapters
    assert strategy.num_route_prompt_tokens == 60  # from the domains4 setting
    assert strategy.num_route_decode_tokens == 7  # set by the scenario: kept
    assert strategy.router_card is None  # applied: the loaded scenario stands alone


def test_a_loaded_scenario_with_a_card_round_trips(tmp_path):
    scenario = load_scenario(write_case(tmp_path, card(), MOL))
    again = tmp_path / "again" / "dumped.yaml"
    again.parent.mkdir()
    again.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    assert load_scenario(again) == scenario


def test_contextual_card_on_the_ced_routing_layer(tmp_path):
    data = card("contextual_mol", "tiny-ced", 3)
    strategy = load_scenario(write_case(tmp_path, data, CONTEXTUAL, "tiny-ced")).strategies[0]
    assert strategy.num_head_params == 1234 and strategy.num_option_description_tokens == 6


def test_card_of_another_model(tmp_path):
    message = error_of(write_case(tmp_path, card(model="ced-small"), MOL))
    assert "was measured on model 'ced-small'; this strategy runs 'smollm2-135m'" in message
    assert "cards/router.json" in message


def test_card_of_another_routing_layer(tmp_path):
    message = error_of(write_case(tmp_path, card("contextual_mol", "tiny-ced", 25), CONTEXTUAL,
                                  "tiny-ced"))
    assert "reads routing layer 25; this strategy's is 3" in message


def test_card_of_another_router_kind(tmp_path):
    message = error_of(write_case(tmp_path, card(router="mol2"), MOL))
    assert "is a 'mol2' router; a 'mol' strategy takes a 'mol_l0' card" in message


def test_card_options_missing_from_the_adapters(tmp_path):
    path = write_case(tmp_path, card(), MOL.replace("name: legal", "name: design"))
    message = error_of(path)
    assert "options ['legal'] of setting 'domains4' are missing from the strategy's adapters" in \
        message


def test_card_with_router_accuracy_too(tmp_path):
    message = error_of(write_case(tmp_path, card(), MOL + "  router_accuracy: 0.9\n"))
    assert "router_card and router_accuracy" in message


def test_invalid_card_file_names_the_file_and_field(tmp_path):
    data = card()
    data["settings"][0]["accuracy_mean"] = 0.5  # not the mean of its seeds
    message = error_of(write_case(tmp_path, data, MOL))
    assert "router.json: settings.0: Value error, accuracy_mean: 0.5 is not the mean" in message
    with pytest.raises(RouterCardError, match=r"router\.json: settings\.0"):
        load_router_card(tmp_path / "cards" / "router.json")


def test_missing_card_file(tmp_path):
    path = write_case(tmp_path, card(), MOL.replace("cards/router.json", "cards/none.json"))
    assert "none.json: cannot read router card" in error_of(path)


def test_shipped_cards_validate_and_cover_the_three_routers():
    cards = [load_router_card(p) for p in sorted((REPO / "scenarios" / "router_cards")
                                                  .glob("*.json"))]
    assert {c.router for c in cards} == {"mol_l0", "contextual_mol", "mol2"}
    for c in cards:
        assert len(c.seeds) == 5 and all(s.num_test >= 50 for s in c.settings), c.name


def test_shipped_ced_scenario_plans_with_the_cards_trained_on_its_model():
    path = REPO / "scenarios" / "routed_ced_small.yaml"
    scenario = load_scenario(path)
    cards = {"contextual_mol": "contextual-ced.json", "mol2": "mol2-ced.json"}
    for strategy in scenario.strategies[1:]:
        card_file = load_router_card(REPO / "scenarios" / "router_cards" / cards[strategy.kind])
        assert card_file.model == scenario.model == "ced-small"
        curve = {p.num_domains: p.accuracy for p in strategy.router_accuracy_curve}
        assert curve == {s.num_options: s.accuracy_mean for s in card_file.settings}
        assert strategy.num_head_params == card_file.num_params


def test_a_smollm2_card_on_the_ced_scenario_names_both_models(tmp_path):
    text = (REPO / "scenarios" / "routed_ced_small.yaml").read_text()
    cards = REPO / "scenarios" / "router_cards"
    path = tmp_path / "scenario.yaml"
    path.write_text(text.replace("router_cards/mol2-ced.json", str(cards / "mol2-smollm2.json"))
                    .replace("router_cards/contextual-ced.json",
                             str(cards / "contextual-ced.json")))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    [message] = info.value.messages
    assert "strategies.2.router_card: card" in message and "mol2-smollm2.json" in message
    assert "was measured on model 'smollm2-135m'; this strategy runs 'ced-small'" in message
