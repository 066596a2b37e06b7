"""Contextual MoL chosen on a validation split (contextual_start): the head started from the
ridge map decides as the map does, each seed keeps its best validation state (the start when
training cannot beat it), and train's --contextual-validation split writes a card whose heads
were chosen on the validation split's cached pass."""

from __future__ import annotations

import pytest
import torch
from test_contextual_features import SPEC, _args, _engine, _tokenize

from engine_ext.routers.contextual_start import (
    new_head,
    ridge_start,
    split_heads,
    train_kept,
    write_start,
)
from engine_ext.routers.datasets import domains4_set
from engine_ext.routers.mol2_init import fit_ridge

NUM_OPTIONS, D_QUERY, D_OPTION = 4, 24, 8


def _rows(num: int, seed: int, noise: float = 8.0):
    """Queries around one centre per option (overlapping: no head is perfect), options that
    carry nothing of the label."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(NUM_OPTIONS, D_QUERY, generator=torch.Generator().manual_seed(99)) * 3
    labels = torch.arange(num) % NUM_OPTIONS
    queries = centres[labels] + noise * torch.randn(num, D_QUERY, generator=gen)
    return queries, torch.randn(num, NUM_OPTIONS, D_OPTION, generator=gen), labels


@torch.no_grad()
def test_the_started_head_decides_as_the_ridge_map_and_q_is_zero():
    train, val = _rows(300, 1), _rows(200, 2)
    head = new_head(train[0], train[1], 0)
    start, text = ridge_start(head, train[0], train[2], val[0], val[2], (0.1,), 0)
    [(weight, bias)] = fit_ridge(head.feature_scale(train[0]), train[2], NUM_OPTIONS, (0.1,))
    want = (head.feature_scale(val[0]) @ weight.T + bias).argmax(-1)
    assert not torch.equal(head(val[0], val[1]).argmax(-1), want)  # a fresh head is not it
    write_start(head, start)
    assert torch.equal(head(val[0], val[1]).argmax(-1), want)
    assert float(head.q.weight.abs().sum()) == 0.0
    assert "l2, validation accuracy: 0.1 " in text and "q at zero" in text


def test_each_seed_keeps_its_best_validation_state_the_start_when_training_cannot_beat_it():
    train, val = _rows(300, 1), _rows(200, 2)
    head = new_head(train[0], train[1], 0)
    start, _ = ridge_start(head, train[0], train[2], val[0], val[2], (0.1,), 0)
    write_start(head, start)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    # a learning rate that wrecks the head: every check is worse than the start
    head, curve, step = train_kept(head, train, val, 0, epochs=3, lr=50.0, weight_decay=0.0)
    assert len(curve) == 4 and step == 0 and max(curve[1:]) < curve[0]
    assert all(torch.equal(before[k], v) for k, v in head.state_dict().items())
    # an ordinary one from scratch improves on its untrained start and keeps a later step
    fresh = new_head(train[0], train[1], 0)
    fresh, curve, step = train_kept(fresh, train, val, 0, epochs=4, lr=3e-3, weight_decay=0.01)
    assert step > 0 and max(curve) == curve[step // max(1, round(300 / 64))] > curve[0]


def test_split_heads_choose_on_validation_and_report_every_candidate():
    train, val = _rows(300, 1), _rows(200, 2)
    grid = {"start_l2": (0.1,), "start_lbfgs": 20, "epochs": (0, 3), "lr": (1e-3,),
            "weight_decay": (0.01,)}
    heads, seconds, text = split_heads(train, val, [0, 1], grid)
    assert len(heads) == len(seconds) == 2
    assert "(0, 0.001, 0.01) " in text and "(3, 0.001, 0.01) " in text
    assert "refined by 20 L-BFGS iterations" in text and "without its q/k term" in text


def test_train_with_the_validation_split_caches_its_pass_and_writes_the_card(tmp_path,
                                                                           monkeypatch):
    from engine_ext.routers import run_contextual as c
    from engine_ext.routers.backbones import Backbone
    from engine_ext.routers.contextual_timing import time_card
    from engine_ext.routers.train import run_contextual
    from sim.strategies.router_card import load_router_card

    engine = _engine()
    domains = domains4_set({"train": 40, "val": 10, "test": 20}, max_bytes=40_000)
    backbone = Backbone("tiny", _tokenize, None, engine.hf.model.embed_tokens, 32, 3, "tiny",
                        tmp_path / "pooled")
    monkeypatch.setattr(c, "FEATURE_CACHE", tmp_path / "ctx")
    args = _args(tmp_path, ["domains4"], True)
    args.contextual_validation, args.contextual_epochs = "split", [0, 3]
    args.contextual_decays, args.contextual_query_term = None, None
    args.contextual_start_l2, args.contextual_start_lbfgs, args.contextual_lrs = [1.0], 0, [1e-3]
    with torch.enable_grad():
        run_contextual(args, {"domains4": domains}, backbone, "contextual-smollm2",
                       "contextual_smollm2", engine)
    card = load_router_card(tmp_path / "cards" / "contextual-smollm2-l2-x3-mean-max.json")
    [row] = card.settings
    assert "validation 40 queries" in card.training and "validation carve" not in card.training
    assert "(0, 0.001, 0.01) " in card.training and "(3, 0.001, 0.01) " in card.training
    assert row.num_test == 80 and row.accuracy_mean > 0.4  # chance 0.25
    # train (160), test (80) and validation (40): one chunk each
    assert len(list((tmp_path / "ctx").glob("ctxf_*.pt"))) == 3
    assert SPEC.route_layer == card.routing_layer
    # the timing-only run reads the saved seed-0 head (query term included) and fills the row
    path = tmp_path / "cards" / "contextual-smollm2-l2-x3-mean-max.json"
    heads = tmp_path / "ctx" / "heads"
    time_card(path, heads, engine, _tokenize, {"domains4": domains})
    timed = load_router_card(path)
    assert timed.settings[0].decision.num_requests == 30
    assert timed.settings[0].accuracy_per_seed == row.accuracy_per_seed
    assert "pending" not in timed.training and "its saved seed-0 head" in timed.training
    # without its saved head, a row is timed with a head of its recorded shape only when asked
    for saved in heads.glob("*.safetensors"):
        saved.unlink()
    with pytest.raises(FileNotFoundError):
        time_card(path, heads, engine, _tokenize, {"domains4": domains})
    time_card(path, heads, engine, _tokenize, {"domains4": domains}, shape_only=True)
    reshaped = load_router_card(path)
    assert reshaped.settings[0].decision.num_requests == 30
    assert reshaped.settings[0].work == row.work
    assert "a head of its recorded shape" in reshaped.training


def test_a_head_is_rebuilt_from_its_recorded_size_or_refused():
    from types import SimpleNamespace

    from engine_ext.routers.contextual_timing import _head_of_shape
    from engine_ext.routers.mol2 import num_params
    from engine_ext.routing import ContextualHead

    width = len(SPEC.layers) * len(SPEC.poolings) * D_OPTION
    for num_options in (None, 5):  # with and without the query-only term
        size = num_params(ContextualHead(width, 64, d_option=D_OPTION, num_options=num_options))
        row = SimpleNamespace(setting="s", num_options=5,
                              work=SimpleNamespace(num_head_params=size))
        head = _head_of_shape(row, SPEC, D_OPTION)
        assert num_params(head) == size and (head.query_logits is None) == (num_options is None)
    row.work.num_head_params = size + 1
    with pytest.raises(ValueError, match="no head of"):
        _head_of_shape(row, SPEC, D_OPTION)


def test_the_pass_alone_runs_the_asked_splits_in_their_order(tmp_path):
    from engine_ext.routers.contextual_features import cached_pass_features, fill_pass_cache

    engine = _engine()
    domains = domains4_set({"train": 6, "val": 2, "test": 3}, max_bytes=40_000)
    names = ("chat", "code", "legal", "prose")
    said = []
    fill_pass_cache(engine, _tokenize, domains, names, SPEC, tmp_path / "ctx", "tiny",
                    log=lambda text, **k: said.append(text), splits=("test", "val"))
    assert [s.split(": ")[0] for s in said if s.startswith("domains4 ")] == \
        ["domains4 test", "domains4 val"]
    options = [_tokenize(" " + n) for n in names]
    for split in (domains.test, domains.val):  # engine None: cached
        cached_pass_features(None, [_tokenize(t) for t in split.texts], options, SPEC,
                             tmp_path / "ctx", "tiny", log=lambda *a, **k: None)
    assert len(list((tmp_path / "ctx").glob("ctxf_*.pt"))) == 2  # no training chunk
