"""The router table's rows (bench/bench_routers.py): each row's params are its own head's, so a
card whose settings trained heads of different sizes shows each size; a decoded label (no head)
shows the card's trained parameters."""

from __future__ import annotations

import sys
from pathlib import Path

from sim.strategies.router_card import load_router_card

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from bench_routers import card_rows  # noqa: E402


def test_each_row_shows_its_own_head_size_and_a_decoded_label_the_cards_parameters():
    card = load_router_card(REPO / "scenarios/router_cards/mol2-smollm2-l8-x6-mean-max.json")
    sizes = [s.work.num_head_params for s in card.settings]
    assert len(set(sizes)) > 1  # the card's settings trained heads of different sizes
    assert [r["num_params"] for r in card_rows(card)] == sizes
    l0 = load_router_card(REPO / "scenarios/router_cards/l0-smollm2.json")
    assert all(s.work.num_head_params == 0 for s in l0.settings)
    assert {r["num_params"] for r in card_rows(l0)} == {l0.num_params}
