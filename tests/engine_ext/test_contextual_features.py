"""Contextual MoL over a feature set: the one pass the training reads (turn, then every option)
gives the query features the layer cache gives for the turn alone, and the option states the
decision's branch pass over the turn's KV gives; the options are read in the turn's context;
the runner writes a card whose decision is pending until the timing-only run fills it."""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pytest
import torch
from engine_helpers import tiny_llama

from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.routers.contextual import train_contextual
from engine_ext.routers.contextual_features import (
    cached_pass_features,
    option_pass,
    pass_features,
    query_prefill,
)
from engine_ext.routers.datasets import domains4_set
from engine_ext.routers.layer_cache import FeatureSpec, LayerCache, features
from engine_ext.routing import ContextualHead

SPEC = FeatureSpec((-1, 0, 2), ("mean", "max"))
TEXTS = ["short one", "a much longer sentence with more tokens", "x"]
OPTIONS = ["alpha", "be", "gamma ray"]


def _tokenize(text: str) -> list[int]:
    return [ord(c) % 100 for c in text[:40]]


def _engine() -> DecoderOnlyEngine:
    torch.manual_seed(0)
    return DecoderOnlyEngine(tiny_llama(), max_loras=2, max_lora_rank=8)


@torch.no_grad()
def test_one_pass_equals_the_layer_cache_query_and_the_decisions_branch_pass(tmp_path):
    engine = _engine()
    ids, options = [_tokenize(t) for t in TEXTS], [_tokenize(o) for o in OPTIONS]
    q, o = pass_features(engine, ids, options, SPEC, batch=2)  # padded batches
    assert q.shape == (3, 6 * 32) and o.shape == (3, 3, 32)
    cache = LayerCache(tmp_path / "layers", num_layers=3)
    cache.fill(TEXTS, engine, _tokenize, log=lambda *a, **k: None)
    np.testing.assert_allclose(q.numpy(), features(cache, TEXTS, SPEC), rtol=1e-5, atol=1e-5)
    for i, turn in enumerate(ids):
        kv, query = query_prefill(engine, turn, SPEC, batch=2)
        np.testing.assert_allclose(query[1], q[i], rtol=1e-5, atol=1e-5)
        before = [None if x is None else x[0].clone() for x in kv.kv]
        branch = option_pass(engine, kv, options, SPEC.route_layer)  # [2, O, D]
        np.testing.assert_allclose(branch[1], o[i], rtol=1e-4, atol=1e-5)
        after = [None if x is None else x[0] for x in kv.kv]  # the branch left no trace
        assert all(a is b is None or torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not torch.allclose(o[0], o[1], atol=1e-3)  # the options are read in context
    again = cached_pass_features(engine, ids, options, SPEC, tmp_path / "ctx", "tiny",
                                 log=lambda *a, **k: None)
    assert len(list((tmp_path / "ctx").glob("ctxf_*.pt"))) == 1
    cached = cached_pass_features(engine, ids, options, SPEC, tmp_path / "ctx", "tiny",
                                  log=lambda *a, **k: None)
    assert torch.equal(again[0], cached[0]) and torch.equal(again[1], cached[1])


def test_a_head_with_its_own_option_width_scales_each_side_and_an_equal_width_one_is_unchanged():
    plain = ContextualHead(16, 8)
    assert plain.option_scale is None and "option_scale.mean" not in plain.state_dict()
    q16, o16 = torch.randn(10, 16), torch.randn(10, 3, 16) + 4
    plain.fit_scales(q16, o16)  # one scale over both sides, as before
    assert torch.allclose(plain.feature_scale.mean, torch.cat([q16, o16.flatten(0, 1)]).mean(0))
    wide = ContextualHead(48, 8, d_option=16)
    queries, options = torch.randn(20, 48) * 5 + 3, torch.randn(20, 4, 16) * 0.1
    wide.fit_scales(queries, options)
    assert torch.allclose(wide.feature_scale.mean, queries.mean(0))
    assert torch.allclose(wide.option_scale.std, options.flatten(0, 1).std(0))
    assert wide(queries, options).shape == (20, 4)


def test_the_query_only_term_starts_at_zero_and_adds_a_logit_per_option_to_the_qk_score():
    torch.manual_seed(0)
    plain = ContextualHead(48, 8, d_option=16)
    torch.manual_seed(0)
    with_term = ContextualHead(48, 8, d_option=16, num_options=4)
    queries, options = torch.randn(20, 48), torch.randn(20, 4, 16)
    for head in (plain, with_term):
        head.fit_scales(queries, options)
    assert plain.query_logits is None and "query_logits.weight" not in plain.state_dict()
    assert torch.equal(plain(queries, options), with_term(queries, options))  # zero at start
    torch.nn.init.normal_(with_term.query_logits.weight)
    added = with_term(queries, options) - plain(queries, options)  # [20, 4]
    expected = with_term.query_logits(with_term.feature_scale(queries))
    assert torch.allclose(added, expected, atol=1e-5) and added.abs().max() > 0.1


def test_training_calls_the_check_hook_every_n_steps_in_eval_mode():
    head = ContextualHead(48, 8, d_option=16, num_options=4)
    queries, options = torch.randn(40, 48), torch.randn(40, 4, 16)
    seen = []
    train_contextual(head, queries, options, torch.arange(40) % 4, steps=7, batch=8,
                     check_every=3, on_check=lambda step: seen.append((step, head.training)))
    assert seen == [(3, False), (6, False)] and not head.training


def _args(tmp_path, settings, untimed: bool, query_term=("no",)):
    from engine_ext.routers.measure import hardware

    return argparse.Namespace(
        settings=settings, seeds=[0, 1], untimed=untimed, cards=tmp_path / "cards",
        feature_layers=list(SPEC.layers), feature_poolings=list(SPEC.poolings),
        contextual_epochs=[2, 8], contextual_decays=[0.5], contextual_query_term=list(query_term),
        command="python -m engine_ext.routers.train --routers contextual_smollm2",
        keep_timings=False, hardware=hardware())


@pytest.mark.parametrize("query_term", [("no",), ("yes",)])
def test_the_feature_card_trains_on_the_whole_split_and_the_timing_only_run_fills_it(
        tmp_path, monkeypatch, query_term):
    from engine_ext.routers import run_contextual as c
    from engine_ext.routers.backbones import Backbone
    from engine_ext.routers.contextual_timing import time_card
    from engine_ext.routers.train import run_contextual
    from sim.strategies.router_card import load_router_card

    engine = _engine()
    domains = domains4_set({"train": 40, "val": 2, "test": 20}, max_bytes=40_000)
    backbone = Backbone("tiny", _tokenize, None, engine.hf.model.embed_tokens, 32, 3, "tiny",
                        tmp_path / "pooled")
    monkeypatch.setattr(c, "FEATURE_CACHE", tmp_path / "ctx")
    with torch.enable_grad():  # train's entry point with --feature-layers and a grid
        run_contextual(_args(tmp_path, ["domains4"], True, query_term), {"domains4": domains},
                       backbone,
                       "contextual-smollm2", "contextual_smollm2", engine)
    path = tmp_path / "cards" / "contextual-smollm2-l2-x3-mean-max.json"
    card = load_router_card(path)
    [row] = card.settings
    assert card.routing_layer == 2 and row.decision is None and row.num_test == 80
    assert "domains4 160 training queries" in card.training and "pending" in card.training
    is_term = query_term == ("yes",)
    assert f"{{'epochs': (2, 8), 'weight_decay': (0.5,), 'query_term': ({is_term},)}}" \
        in card.training
    assert "weight decay 0.5" in card.training
    assert (", query-only term (validation" in card.training) == is_term
    # every candidate's validation accuracy and its curve: 144 fit rows (160 less the carve),
    # a check every round(144 / 64) = 2 steps, 18 steps in 8 epochs
    assert f"(2, 0.5, {is_term}) " in card.training and f"(8, 0.5, {is_term}) " in card.training
    curve = card.training.split(f"(8, 0.5, {is_term}) ")[1].split("[")[1].split("]")[0]
    assert len(curve.split()) == 9
    assert row.work.num_prefill_tokens == sum(len(_tokenize(" " + n)) for n in
                                              ("chat", "code", "legal", "prose"))
    assert row.accuracy_mean > 0.4  # chance 0.25
    time_card(path, tmp_path / "ctx" / "heads", engine, _tokenize, {"domains4": domains})
    timed = load_router_card(path)
    assert timed.settings[0].decision.num_requests == 30
    assert timed.settings[0].accuracy_per_seed == row.accuracy_per_seed
    assert "L-1,0,2 mean+max" in timed.settings[0].decision.includes
    # an untimed run of another setting keeps the timed row's machine as the card's hardware
    args = _args(tmp_path, ["clinc_domains10"], True, query_term)
    args.hardware = args.hardware.model_copy(update={"load_average": (99.0, 99.0, 99.0)})
    with torch.enable_grad():
        run_contextual(args, {"clinc_domains10": replace(domains, name="clinc_domains10")},
                       backbone, "contextual-smollm2", "contextual_smollm2", engine)
    both = load_router_card(path)
    assert [r.setting for r in both.settings] == ["domains4", "clinc_domains10"]
    assert both.hardware == timed.hardware and both.settings[0].decision is not None


def test_the_pass_alone_fills_the_cache_the_training_then_reads_without_the_model(tmp_path):
    from engine_ext.routers.contextual_features import fill_pass_cache

    engine = _engine()
    domains = domains4_set({"train": 6, "val": 2, "test": 3}, max_bytes=40_000)
    names = ("chat", "code", "legal", "prose")
    fill_pass_cache(engine, _tokenize, domains, names, SPEC, tmp_path / "ctx", "tiny",
                    log=lambda *a, **k: None)
    options = [_tokenize(" " + n) for n in names]
    for split in (domains.train, domains.test):  # engine None: every chunk must be cached
        q, o = cached_pass_features(None, [_tokenize(t) for t in split.texts], options, SPEC,
                                    tmp_path / "ctx", "tiny", log=lambda *a, **k: None)
        expected = pass_features(engine, [_tokenize(t) for t in split.texts], options, SPEC)
        assert torch.equal(q, expected[0]) and torch.equal(o, expected[1])


def test_the_validation_carve_is_seeded_disjoint_and_a_tenth():
    from engine_ext.routers.run_contextual import carve

    fit, val = carve(100)
    assert len(val) == 10 and len(fit) == 90 and not set(fit.tolist()) & set(val.tolist())
    assert torch.equal(carve(100)[1], val)
