"""No turn is cut without a word: sim_turns.parquet holds every simulated turn, and when the
CSV and the report keep only the first MAX_TURN_ROWS of a strategy, the report and the
command's notes say so (they used to keep the first 20,000 silently)."""

from __future__ import annotations

import pandas as pd
from planner_helpers import TINY, write_tiny

import planner.jobs.strategy_points as strategy_points
from planner.jobs.run import run_scenario_file


def _run(tmp_path, monkeypatch, max_rows: int):
    monkeypatch.setattr(strategy_points, "MAX_TURN_ROWS", max_rows)
    path = write_tiny(tmp_path, text=TINY)
    result = run_scenario_file(path, tmp_path / "out", backend="inline")
    tables = tmp_path / "out" / "tiny" / "tables"
    html = (tmp_path / "out" / "tiny" / "report.html").read_text(encoding="utf-8")
    return (result, pd.read_parquet(tables / "sim_turns.parquet"),
            pd.read_csv(tables / "sim_turns.csv"), html)


def test_a_cut_turn_table_keeps_every_turn_in_parquet_and_says_so(tmp_path, monkeypatch):
    result, parquet, csv, html = _run(tmp_path, monkeypatch, max_rows=7)
    simulated = {"base": 20, "multi_lora": 20}  # TINY: 20 requests, one turn each
    assert parquet.groupby("strategy").size().to_dict() == simulated  # every turn
    assert csv.groupby("strategy").size().to_dict() == {s: 7 for s in simulated}
    (note,) = [n for n in result.notes if "sim_turns" in n]
    assert "first 7 turns" in note and "base (7 of 20)" in note and "multi_lora (7 of 20)" in note
    assert note in html


def test_an_uncut_turn_table_says_nothing(tmp_path, monkeypatch):
    result, parquet, csv, html = _run(tmp_path, monkeypatch, max_rows=20_000)
    assert len(parquet) == len(csv) == 40
    assert not [n for n in result.notes if "sim_turns" in n] and "Turn table" not in html
