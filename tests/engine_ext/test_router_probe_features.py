"""Multi-layer router features: a cache that stops at layer L holds exactly the states the
route pass computes up to L, and a feature set is their concatenation (mean and max over the
turn's real tokens, pads never counted), in the spec's order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import tiny_llama

from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.routers.datasets import domains4_set
from engine_ext.routers.layer_cache import LayerCache
from engine_ext.routers.probe_features import FeatureSpec, features, probe_sets

TEXTS = ["short one", "a much longer sentence with more tokens", "x"]


def _tokenize(text: str) -> list[int]:
    return [ord(c) % 100 for c in text[:40]]


def _engine(route_layer: int | None = None) -> DecoderOnlyEngine:
    torch.manual_seed(0)
    return DecoderOnlyEngine(tiny_llama(), max_loras=2, max_lora_rank=8, route_layer=route_layer)


@torch.no_grad()
def _unpadded(engine: DecoderOnlyEngine, text: str, layer: int) -> torch.Tensor:
    """One text alone, no padding: [T, D] at layer (-1: the token embeddings)."""
    tokens = torch.tensor([_tokenize(text)])
    if layer == -1:
        return engine.hf.model.embed_tokens(tokens)[0]
    route = DecoderOnlyEngine(engine.hf, max_loras=2, max_lora_rank=8, route_layer=layer)
    return route.prefill_shared(route.new_cache(1), tokens)[0]


@torch.no_grad()
def test_a_feature_set_is_the_concatenation_of_each_layers_mean_and_max(tmp_path):
    engine = _engine()
    cache = LayerCache(tmp_path, num_layers=2)  # embeddings, layers 0 and 1 of 4
    cache.fill(TEXTS, engine, _tokenize, log=lambda *a, **k: None)
    assert cache.states(TEXTS, "mean").shape == (3, 3, 32)
    spec = FeatureSpec((1, -1), ("mean", "max"))
    got = features(cache, TEXTS, spec)
    assert got.shape == (3, 4 * 32)
    for i, text in enumerate(TEXTS):
        by_layer = {layer: _unpadded(engine, text, layer) for layer in (1, -1)}
        want = torch.cat([by_layer[1].mean(0), by_layer[-1].mean(0),
                          by_layer[1].amax(0), by_layer[-1].amax(0)])
        np.testing.assert_allclose(got[i], want.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="stops after decoder layer 1"):
        features(cache, TEXTS, FeatureSpec((2,)))
    with pytest.raises(ValueError, match="allowed"):
        FeatureSpec((0,), ("median",))


def test_the_probe_on_a_feature_set_reads_the_domain(tmp_path):
    domains = domains4_set({"train": 40, "val": 1, "test": 20}, max_bytes=40_000)
    cache = LayerCache(tmp_path, num_layers=2)
    cache.fill(domains.train.texts + domains.test.texts, _engine(), _tokenize,
               log=lambda *a, **k: None)
    specs = [FeatureSpec((-1,)), FeatureSpec((-1, 0, 1), ("mean", "max"))]
    cells = probe_sets(cache, domains, "heads", specs)
    assert [c.num_features for c in cells] == [32, 6 * 32]
    assert {c.num_train for c in cells} == {160} and {c.num_test for c in cells} == {80}
    assert min(c.accuracy for c in cells) > 0.45  # chance 0.25


def test_the_table_stars_a_feature_set_at_or_above_tfidf_and_lists_the_curve():
    from engine_ext.routers.probe_layers import merge, render_markdown

    bar = {"setting": "s", "sample": "full", "num_train": 900, "num_test": 50, "accuracy": 0.9}

    def cell(name: str, acc: float) -> dict:
        return {"setting": "s", "sample": "full", "feature_set": name, "layers": [8],
                "poolings": ["mean"], "num_features": 576, "num_train": 900, "num_test": 50,
                "accuracy": acc}

    curve = {"setting": "s", "feature_set": "L8 mean", "num_train": 90, "probe": 0.7,
             "tfidf": 0.75}
    doc = merge({"tfidf": [bar], "cells": [], "commands": [], "probe_cpu_s": 0},
                {"tfidf": [bar], "cells": [], "feature_cells": [cell("L8 mean", 0.9),
                 cell("L8 max", 0.85)], "curves": [curve, curve | {"num_train": 900,
                 "probe": 0.9, "tfidf": 0.9}], "commands": ["x"],
                 "probe_cpu_s": 1})
    text = render_markdown(doc)
    assert "| feature set | features | s full (900) |" in text
    assert "| L8 mean | 576 | 90.0* |" in text and "| L8 max | 576 | 85.0 |" in text
    assert "| s | L8 mean | 90 | 70.0 | 75.0 | -5.0 |" in text
    assert ("* s, full (900 rows): best `L8 mean` 90.0 vs TF-IDF 90.0 (+0.0): reaches the "
            "baseline. From 90 to 900 training rows the probe's gap goes -5.0 -> +0.0 points."
            ) in text


def _tiny_backbone(engine: DecoderOnlyEngine, tmp_path):
    from engine_ext.routers.backbones import Backbone

    def state_fn(tokens: torch.Tensor) -> torch.Tensor:
        return engine.prefill_shared(engine.new_cache(tokens.shape[0]), tokens)

    return Backbone("tiny", _tokenize, state_fn, engine.hf.model.embed_tokens,
                    engine.cfg.hidden_size, 3, "tiny", tmp_path / "pooled")


def test_mol2_reads_a_feature_set_fills_the_cache_on_demand_and_leaves_timing_pending(tmp_path):
    import sys
    from pathlib import Path

    from engine_ext.routers.backbones import FeatureBackbone
    from engine_ext.routers.run_mol2 import mol2_setting
    from engine_ext.routers.train import mol2_feature_card_name

    engine = _engine()
    spec = FeatureSpec((-1, 0, 1), ("mean", "max"))
    cache = LayerCache(tmp_path / "layers", num_layers=2)
    backbone = FeatureBackbone(_tiny_backbone(engine, tmp_path), cache, spec).with_engine(engine)
    assert (backbone.d_query, backbone.d_model, backbone.layer) == (6 * 32, 32, 1)
    domains = domains4_set({"train": 8, "val": 2, "test": 4}, max_bytes=20_000)
    with torch.enable_grad():
        row, head, _ = mol2_setting(backbone, domains, [0, 1], tmp_path / "heads", (3,),
                                 is_timed=False)
    np.testing.assert_allclose(backbone.pooled(domains.test.texts).numpy(),
                               features(cache, domains.test.texts, spec))  # filled once
    assert head.query_proj.in_features == 6 * 32 and head.option_in.in_features == 32
    assert row.decision is None and row.standalone is None and len(row.accuracy_per_seed) == 2
    with torch.enable_grad():
        timed, _, _ = mol2_setting(backbone, domains, [0], tmp_path / "heads", (3,))
    assert timed.decision.num_requests == 30 and timed.standalone is not None
    assert "L-1,0,1 mean+max" in timed.decision.includes
    # what the timed decision computes from the engine's unpadded states = the cached features
    from engine_ext.routers.layer_cache import all_layer_states, query_from_states

    text = domains.test.texts[0]
    states = all_layer_states(engine, torch.tensor([_tokenize(text)]), 2)
    np.testing.assert_allclose(query_from_states(states, spec)[0].numpy(),
                               features(cache, [text], spec)[0], rtol=1e-5, atol=1e-5)
    assert mol2_feature_card_name(spec) == "mol2-smollm2-l1-x3-mean-max"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from bench_routers import card_rows, table

    from sim.strategies.router_card import Hardware, RouterCard

    card = RouterCard(name="c", router="mol2", model="tiny", routing_layer=1, num_params=5,
                      seeds=(0, 1), training="t", command="c", data_sources=("a",),
                      hardware=Hardware(cpu="cpu", num_threads=1, load_average=(1, 1, 1)),
                      settings=(row,))
    assert "| pending | pending | pending | - |" in table(card_rows(card))
