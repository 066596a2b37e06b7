"""MoL2's head training chosen on validation: early stopping keeps the best validation state,
weight decay and query dropout reach the optimiser and the query, the search picks the
candidate validation prefers, and a card trained untimed is timed later from its saved head."""

from __future__ import annotations

import argparse

import pytest
import torch

from engine_ext.routers.mol2 import (
    HeadTraining,
    PointerTask,
    accuracy,
    create_head,
    fit_head,
    train_pointer,
)
from engine_ext.routers.run_mol2 import HeadSearch, search_heads

SHAPE = dict(d_head=16, num_heads=2, option_depth=1)
D_QUERY, D_OPTION, NUM_OPTIONS = 24, 8, 4


def _task(num: int, seed: int, offset: float = 0.0, spread: float = 1.0) -> PointerTask:
    """Queries near one centre per option (seeded); option descriptions of 3 tokens."""
    gen = torch.Generator().manual_seed(100)  # the same centres and options in every split
    centres = 3 * torch.randn(NUM_OPTIONS, D_QUERY, generator=gen)
    embeds = torch.randn(NUM_OPTIONS, 3, D_OPTION, generator=gen)
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_OPTIONS, (num,), generator=gen)
    queries = centres[labels] + torch.randn(num, D_QUERY, generator=gen)
    return PointerTask(offset + spread * queries, labels, embeds,
                       torch.ones(NUM_OPTIONS, 3, dtype=torch.bool))


def _misleading(task: PointerTask) -> PointerTask:
    """The same queries with every label moved to the next option: the better the head learns
    the training task, the worse it does here."""
    return PointerTask(task.queries, (task.labels + 1) % NUM_OPTIONS, task.option_embeds,
                       task.option_mask)


def test_early_stopping_keeps_the_best_validation_state_and_stops_after_patience():
    train = _task(200, 1)
    val = _misleading(_task(80, 2))
    how = HeadTraining(max_steps=200, lr=5e-3, eval_every=10, patience=3, batch=32)
    done = fit_head(create_head(D_OPTION, 0, D_QUERY, **SHAPE), train, val, how, seed=0)
    steps = [step for step, _ in done.curve]
    assert steps == [10, 20, 30, 40]  # the best at the first check, then 3 without a gain
    assert len(done.losses) == 40 and done.best_step == 10
    assert done.best_val == max(acc for _, acc in done.curve) > done.curve[-1][1]
    assert accuracy(done.head, val) == pytest.approx(done.best_val)  # the kept state
    plain = fit_head(create_head(D_OPTION, 0, D_QUERY, **SHAPE), train, None,
                     HeadTraining(max_steps=40, lr=5e-3, batch=32), seed=0)
    assert plain.curve == () and len(plain.losses) == 40


@torch.no_grad()
def test_the_training_logits_are_the_heads_own():
    from engine_ext.routers.mol2 import encode, pointer_logits

    task = _task(50, 1)
    head = create_head(D_OPTION, 0, D_QUERY, **SHAPE)
    head.query_scale.fit(task.queries)
    options = encode(head, task)
    torch.testing.assert_close(pointer_logits(head, task.queries, options),
                               head(task.queries, options), atol=1e-5, rtol=1e-5)


def test_a_step_reads_the_batch_it_is_given():
    import torch.nn.functional as F

    from engine_ext.routers.mol2 import encode, pointer_logits

    train = _task(50, 1)
    head = create_head(D_OPTION, 0, D_QUERY, **SHAPE)
    head.query_scale.fit(train.queries)
    with torch.no_grad():  # the whole task in one batch: the first loss is its mean loss
        want = F.cross_entropy(pointer_logits(head, train.queries, encode(head, train)),
                               train.labels)
    done = fit_head(head, train, None, HeadTraining(max_steps=1, batch=50), seed=0)
    assert done.losses[0] == pytest.approx(float(want), rel=1e-5)


def test_weight_decay_reaches_the_optimiser():
    train = _task(200, 1)
    norms = []
    for decay in (0.0, 2.0):
        head = create_head(D_OPTION, 0, D_QUERY, **SHAPE)
        train_pointer(head, [train], steps=60, batch=32, lr=1e-2, weight_decay=decay)
        norms.append(float(head.query_proj.weight.norm()))
    assert norms[1] < 0.7 * norms[0], norms


def test_query_dropout_drops_standardised_features_to_their_training_mean():
    # features far from zero with a small spread: a dropped feature set to 0 instead of its
    # mean would read as thousands of standard deviations and wreck the training
    train, test = _task(300, 1, offset=500.0, spread=0.01), _task(100, 3, offset=500.0,
                                                                  spread=0.01)
    head = create_head(D_OPTION, 0, D_QUERY, **SHAPE)
    losses = train_pointer(head, [train], steps=120, batch=32, lr=5e-3, query_dropout=0.3)
    assert accuracy(head, test) > 0.9 and losses[-1] < 1.0, losses[-5:]
    again = create_head(D_OPTION, 0, D_QUERY, **SHAPE)
    assert train_pointer(again, [train], steps=5, batch=32, lr=5e-3) != losses[:5]


def test_the_search_chooses_what_validation_prefers_and_trains_every_seed_with_it(monkeypatch):
    from engine_ext.routers import run_mol2

    monkeypatch.setattr(run_mol2, "HEAD_SHAPE", SHAPE)
    tasks = {"train": _task(200, 1), "val": _task(80, 2)}
    backbone = argparse.Namespace(d_model=D_OPTION, d_query=D_QUERY)
    search = HeadSearch(max_steps=60, eval_every=20, lrs=(0.0, 5e-3), patience=2, batch=16)
    heads, seconds, text = search_heads(backbone, tasks, [0, 1], search)
    assert len(heads) == 2 and len(seconds) == 2
    assert "chosen lr 0.005, wd 0.01, dropout 0;" in text, text
    assert "at most 60 steps of 16," in text
    assert "validation 80 queries" in text and "steps kept per seed" in text
    assert all(accuracy(h, tasks["val"]) > 0.9 for h in heads)


def _feature_backbone(tmp_path):
    from engine_helpers import tiny_llama

    from engine_ext.decoder_only import DecoderOnlyEngine
    from engine_ext.routers.backbones import Backbone, FeatureBackbone
    from engine_ext.routers.layer_cache import FeatureSpec, LayerCache

    torch.manual_seed(0)
    engine = DecoderOnlyEngine(tiny_llama(), max_loras=2, max_lora_rank=8)

    def tokenize(text: str) -> list[int]:
        return [ord(c) % 100 for c in text[:40]]

    def state_fn(tokens: torch.Tensor) -> torch.Tensor:
        return engine.prefill_shared(engine.new_cache(tokens.shape[0]), tokens)

    base = Backbone("tiny", tokenize, state_fn, engine.hf.model.embed_tokens,
                    engine.cfg.hidden_size, 3, "tiny", tmp_path / "pooled")
    cache = LayerCache(tmp_path / "layers", num_layers=2)
    return FeatureBackbone(base, cache, FeatureSpec((-1, 1), ("mean", "max"))).with_engine(engine)


def test_a_setting_trained_untimed_is_timed_later_from_its_saved_head(tmp_path):
    from engine_ext.routers import train_mol2 as tm
    from engine_ext.routers.datasets import domains4_set
    from engine_ext.routers.run_mol2 import load_head, mol2_setting, retime_setting
    from engine_ext.routers.train import _grouped_training
    from sim.strategies.router_card import Hardware, RouterCard

    backbone = _feature_backbone(tmp_path)
    domains = domains4_set({"train": 8, "val": 2, "test": 4}, max_bytes=20_000)
    search = HeadSearch(max_steps=6, eval_every=3, patience=1, weight_decays=(0.01, 0.1))
    with torch.enable_grad():
        row, head, text = mol2_setting(backbone, domains, [0, 1], tmp_path / "heads",
                                       is_timed=False, search=search)
    assert row.decision is None and row.standalone is None and "chosen" in text
    head_file = tmp_path / "heads" / "mol2_tiny_domains4.safetensors"
    loaded = load_head(backbone, head_file)  # the trained seed-0 head, in float16 on disk
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, atol=2e-3, rtol=2e-3)
    timed = retime_setting(backbone, domains, row, head_file)
    assert timed.decision.num_requests == 30 and timed.standalone is not None
    assert timed.model_copy(update={"decision": None, "standalone": None}) == row
    with pytest.raises(FileNotFoundError, match="no saved head of domains4"):
        retime_setting(backbone, domains, row, tmp_path / "elsewhere.safetensors")
    old = Hardware(cpu="busy", num_threads=1, load_average=(9, 9, 9))
    card = RouterCard(name="c", router="mol2", model="tiny", routing_layer=1, num_params=5,
                      seeds=(0, 1), training="head" + tm.PENDING, command="train",
                      data_sources=("a",), hardware=old, settings=(row,))
    now = Hardware(cpu="quiet", num_threads=1, load_average=(1, 1, 1))
    new = tm.retimed(card, {"domains4": timed}, {"domains4": card.training}, now, "time",
                     _grouped_training)
    assert new.training == "head" + tm.TIMED_LATER and new.command == "train; time"
    assert new.hardware == now and new.settings == (timed,)


def test_a_cards_command_names_no_cache_path_and_bad_options_exit_2(capsys):
    from engine_ext.routers.train import main
    from engine_ext.routers.train_mol2 import recorded_args

    argv = ["--routers", "mol2", "--layer-cache", "/x/layers", "--head-cache=/x/heads",
            "--mol2-steps", "10"]
    assert recorded_args(argv) == ["--routers", "mol2", "--mol2-steps", "10"]
    for bad, says in ((["--mol2-early-stop", "5", "--mol2-steps", "10", "20"], "exactly one"),
                      (["--mol2-early-stop", "5", "--mol2-steps", "10", "--mol2-dropout", "1"],
                       "0 <= p < 1"),
                      (["--routers", "l0", "--time-only"], "MoL2 cards only")):
        with pytest.raises(SystemExit) as exit_:
            main(bad)
        assert exit_.value.code == 2 and says in capsys.readouterr().err
