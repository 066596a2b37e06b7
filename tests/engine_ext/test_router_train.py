"""Training runs of different settings merge their rows into one router card; the rebuild runs
the commands the shipped cards record."""

from __future__ import annotations

from pathlib import Path

from engine_ext.routers.rebuild import CHAINS, command_text
from engine_ext.routers.train import _merge
from sim.strategies.router_card import RouterCard, load_router_card


def _card(settings: dict[str, int], training: str, command: str) -> RouterCard:
    rows = []
    for name, num in settings.items():
        options = [f"{name}_{i}" for i in range(num)]
        rows.append(dict(setting=name, num_options=num, options=options, num_test=40,
                         accuracy_per_seed=[0.5, 0.7], accuracy_mean=0.6, accuracy_std=0.14,
                         train_seconds_mean=1.0,
                         decision=dict(p50_ms=1, p99_ms=2, batched_p50_ms=1, batched_p99_ms=1,
                                       batch_size=4, num_requests=5, includes="pass"),
                         work=dict(num_prefill_tokens=10, num_decode_tokens=0,
                                   num_head_params=5), data_fingerprint="f"))
    return RouterCard.model_validate(dict(
        name="c", router="contextual_mol", model="smollm2-135m", routing_layer=25,
        num_params=5, seeds=[0, 1], training=training, command=command, data_sources=["a"],
        hardware=dict(cpu="cpu", num_threads=1, load_average=[1, 1, 1]), settings=rows))


def test_a_run_of_some_settings_keeps_the_cards_other_rows_and_says_how_each_trained():
    old = _card({"domains4": 4, "clinc_domains10": 10, "banking77": 77}, "300 queries", "run a")
    new = _card({"banking77": 77}, "120 queries", "run b")
    merged = _merge(new, old)
    assert [s.setting for s in merged.settings] == ["domains4", "clinc_domains10", "banking77"]
    assert merged.settings[2] == new.settings[0]  # the new run's row replaces the old one
    assert merged.training == ("domains4, clinc_domains10: 300 queries || banking77: "
                               "120 queries")
    assert merged.command == "run a; run b"
    again = _merge(_card({"domains4": 4}, "120 queries", "run c"), merged)  # a third run
    assert again.training == "domains4, banking77: 120 queries || clinc_domains10: 300 queries"
    last = _merge(_card({"clinc_domains10": 10}, "120 queries", "run d"), again)
    assert last.training == "120 queries"  # every row trained the same way again
    other_seeds = _card({"banking77": 77}, "t", "run c").model_copy(update={"seeds": (0, 2)})
    assert _merge(other_seeds, old) == other_seeds  # another training: nothing is merged


def _recipe(command: str) -> str:
    """A recorded command without --threads N: how many cores a run used, not what it trained
    (the thread count moves float rounding only: the 150 intents' card, trained with two
    threads, came out one test query apart in a one-thread rebuild, docs/routers.md)."""
    words = command.split(" ")
    if "--threads" in words:
        at = words.index("--threads")
        del words[at : at + 2]
    return " ".join(words)


def test_the_rebuild_runs_the_commands_the_shipped_cards_record():
    cards = sorted((Path(__file__).resolve().parents[2] / "scenarios" / "router_cards")
                   .glob("*.json"))
    recorded = {_recipe(cmd) for path in cards
                for cmd in load_router_card(path).command.split("; ")}
    # mol2_regimes adds a table to the MoL2 card and records no command of its own
    made = {_recipe(command_text(r)) for chain in CHAINS for r in chain
            if "mol2_regimes" not in r}
    # a card trained untimed records its --time-only command once a quiet machine has run it
    pending = {c for c in made - recorded if "--time-only" in c}
    assert recorded == made - pending


def test_cards_name_their_data_relative_to_the_data_dir_and_no_lock_is_left_in_the_repo(
        tmp_path, monkeypatch):
    from engine_ext.routers import train
    from engine_ext.routers.datasets import source_name

    monkeypatch.setenv("MOLCAP_DATA_DIR", str(tmp_path / "data"))
    full = tmp_path / "data" / "text" / "clinc150" / "data_full.json"
    assert source_name("CLINC150", full) == \
        "CLINC150 (MOLCAP_DATA_DIR/text/clinc150/data_full.json)"
    cards = sorted(Path("scenarios/router_cards").glob("*.json"))
    assert cards and not list(Path("scenarios/router_cards").glob("*.lock"))
    for path in cards:
        for source in load_router_card(path).data_sources:
            assert not source.startswith("/") and "/work/" not in source, (path, source)
    monkeypatch.setattr(train, "LOCK_DIR", tmp_path / "locks")
    with train._locked(tmp_path / "cards" / "x.json"):
        pass
    assert not list((tmp_path / "cards").iterdir())
    assert len(list((tmp_path / "locks").iterdir())) == 1


def test_a_retrained_setting_drops_the_commands_that_made_only_its_old_rows():
    old = _card({"domains4": 4, "banking77": 77}, "t", "t --settings banking77 --x 1; "
                "t --settings domains4 banking77 --time-only; t --settings domains4")
    merged = _merge(_card({"banking77": 77}, "u", "t --settings banking77 --y 2"), old)
    # the domains4 + banking77 timing still timed a row that remains (domains4's): kept
    assert merged.command == ("t --settings domains4 banking77 --time-only; "
                              "t --settings domains4; t --settings banking77 --y 2")


def test_l0_time_card_refuses_to_leave_rows_timed_on_another_machine(tmp_path):
    import pytest

    from engine_ext.routers import run_l0

    card = tmp_path / "l0.json"
    shipped = Path(__file__).resolve().parents[2] / "scenarios" / "router_cards" / "l0-smollm2.json"
    card.write_text(shipped.read_text())
    timed = [r.setting for r in load_router_card(card).settings if r.decision is not None]
    assert timed  # the card's hardware is one machine: every timed row is timed again together
    with pytest.raises(SystemExit, match=timed[0]):
        run_l0.time_card(card, ["not_a_setting"], tmp_path / "adapters")
