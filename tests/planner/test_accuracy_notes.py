"""The output says which router accuracy a plan ran on: a card's seed mean with its spread and the
card it came from, or a published figure labelled as not measured here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from planner_helpers import molcap

from planner.scenario.accuracy_notes import PUBLISHED_LABEL, accuracy_notes
from planner.scenario.loading import load_scenario
from planner.scenario.strategies import PUBLISHED_ROUTER_ACCURACY

REPO = Path(__file__).resolve().parents[2]
CARD = REPO / "scenarios" / "router_cards" / "l0-smollm2.json"
ADAPTERS = "    adapters:\n" + "".join(
    f"      - {{name: {n}, rank: 8, layers: [26, 27, 28, 29]}}\n"
    for n in ("chat", "code", "legal", "prose"))
TAIL = """\
workload: {kind: punica, num_requests: 20, num_adapters: 4, num_output_tokens: 8,
           arrival_rate_per_s: 2}
search: {num_seeds: 1, max_turns_per_evaluation: 20}
analysis: {context_tokens: [512], adapters_visited: [1], decode_tokens_per_turn: [16],
           decision_every_tokens: [32], distinct_adapters: [1], decode_batch_size: 4}
"""


def _scenario_text(card: Path) -> str:
    """Three MoL strategies: accuracy from a router card, from nothing (the published default),
    and given as a number."""
    return ("name: routed_tiny\nmodel: smollm2-135m\nhardware: {gpu: A100-80GB}\nstrategies:\n"
            f"  - kind: mol\n    name: mol_card\n    router_card: {json.dumps(str(card))}\n"
            + ADAPTERS + "  - kind: mol\n    name: mol_published\n" + ADAPTERS
            + "  - kind: mol\n    name: mol_given\n    router_accuracy: 0.9\n" + ADAPTERS + TAIL)


def _card_figures() -> tuple[str, str]:
    """The card's 4-option mean and std as the notes print them (read from the card itself)."""
    setting = next(s for s in json.loads(CARD.read_text())["settings"] if s["num_options"] == 4)
    return f"{100 * setting['accuracy_mean']:.2f}%", f"{100 * setting['accuracy_std']:.2f}%"


@pytest.fixture
def scenario_path(tmp_path: Path) -> Path:
    path = tmp_path / "routed_tiny.yaml"
    path.write_text(_scenario_text(CARD), encoding="utf-8")
    return path


def test_card_spread_and_source_reach_the_note_and_the_published_default_is_labelled(
        scenario_path):
    notes = accuracy_notes(load_scenario(scenario_path))
    mean, std = _card_figures()
    assert f"{mean} ± {std}" in notes["mol_card"] and CARD.name in notes["mol_card"]
    assert "5 seeds" in notes["mol_card"]
    assert PUBLISHED_LABEL not in notes["mol_card"]
    published = f"{100 * PUBLISHED_ROUTER_ACCURACY['mol']:.2f}%"
    assert published in notes["mol_published"] and PUBLISHED_LABEL in notes["mol_published"]
    assert PUBLISHED_LABEL not in notes["mol_given"] and "90.00%" in notes["mol_given"]


def test_the_simulated_accuracy_stays_the_card_mean(scenario_path):
    strategy = load_scenario(scenario_path).strategies[0]
    setting = next(s for s in json.loads(CARD.read_text())["settings"] if s["num_options"] == 4)
    assert strategy.resolved_router_accuracy == pytest.approx(setting["accuracy_mean"])


def test_run_prints_and_reports_each_strategys_accuracy_source(scenario_path):
    result = molcap("run", str(scenario_path), "--out", "out", "--backend", "inline",
                    cwd=scenario_path.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {name: [ln for ln in result.stdout.splitlines()
                    if ln.strip().startswith(f"{name} router accuracy")]
             for name in ("mol_card", "mol_published", "mol_given")}
    mean, std = _card_figures()
    assert len(lines["mol_card"]) == 1 and f"{mean} ± {std}" in lines["mol_card"][0]
    assert PUBLISHED_LABEL not in lines["mol_card"][0]
    assert len(lines["mol_published"]) == 1 and PUBLISHED_LABEL in lines["mol_published"][0]
    assert len(lines["mol_given"]) == 1 and PUBLISHED_LABEL not in lines["mol_given"][0]
    html = (scenario_path.parent / "out" / "routed_tiny" / "report.html").read_text("utf-8")
    assert "Router accuracy" in html and f"{mean} ± {std}" in html
    assert html.count(PUBLISHED_LABEL) == 1
