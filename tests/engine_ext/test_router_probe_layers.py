"""The layer x pooling probe sweep: every layer's pooled states equal the routers' own pass at
that layer, the cache shares rows by text, and the probe on the repository's slices reads the
label from the states and not from shuffled labels."""

from __future__ import annotations

import random

import numpy as np
import torch
from engine_helpers import tiny_llama

from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.routers.datasets import RoutingSet, RoutingSplit, domains4_set
from engine_ext.routers.layer_cache import LayerCache, all_layer_pooled
from engine_ext.routers.probe_layers import best_cells, render_markdown, sweep_setting
from engine_ext.routers.states import pooled_states


def _tokenize(text: str) -> list[int]:
    return [ord(c) % 100 for c in text[:40]]


def _engine(route_layer: int | None = None) -> DecoderOnlyEngine:
    return DecoderOnlyEngine(tiny_llama(), max_loras=2, max_lora_rank=8, route_layer=route_layer)


@torch.no_grad()
def test_every_layer_and_both_poolings_equal_the_route_pass_at_that_layer():
    ids = [_tokenize(t) for t in ("short one", "a much longer sentence with more tokens", "x")]
    found = all_layer_pooled(_engine(), ids)
    assert found["mean"].shape == (5, 3, 32)  # embeddings + 4 layers
    for k in range(4):
        engine = _engine(route_layer=k)
        torch.testing.assert_close(found["mean"][k + 1], pooled_states(engine, ids))
        for i, seq in enumerate(ids):  # last pooling: the last real token of an unpadded pass
            alone = engine.prefill_shared(engine.new_cache(1), torch.tensor([seq]))
            torch.testing.assert_close(found["last"][k + 1, i], alone[0, -1],
                                       rtol=1e-5, atol=1e-5)


def test_the_cache_computes_each_text_once_and_returns_rows_in_the_asked_order(tmp_path):
    engine = _engine()
    cache = LayerCache(tmp_path)
    assert cache.fill(["alpha", "beta", "alpha"], engine, _tokenize, log=lambda *a, **k: None) == 2
    assert cache.fill(["beta", "gamma"], engine, _tokenize, log=lambda *a, **k: None) == 1
    again = LayerCache(tmp_path)  # read back from the files
    asked = ["gamma", "beta", "alpha"]  # beta after alpha in one file: reordered within it
    got = again.states(asked, "last")
    direct = all_layer_pooled(engine, [_tokenize(t) for t in asked])["last"]
    np.testing.assert_allclose(got, direct.numpy(), rtol=1e-5, atol=1e-5)
    try:
        again.states(["delta"], "mean")
    except KeyError as err:
        assert "delta" in str(err)
    else:
        raise AssertionError("a text never computed must not be served")


def _shuffled(routing_set: RoutingSet) -> RoutingSet:
    labels = list(routing_set.train.labels)
    random.Random(1).shuffle(labels)
    return RoutingSet(routing_set.name, routing_set.options, routing_set.descriptions,
                      RoutingSplit(routing_set.train.texts, tuple(labels)), routing_set.val,
                      routing_set.test, routing_set.sources)


def test_the_sweep_reads_the_domain_from_the_states_and_not_from_shuffled_labels(tmp_path):
    domains = domains4_set({"train": 40, "val": 1, "test": 20}, max_bytes=40_000)
    cache = LayerCache(tmp_path)
    cache.fill(domains.train.texts + domains.test.texts, _engine(), _tokenize,
               log=lambda *a, **k: None)
    cells = sweep_setting(cache, domains, "heads", [-1, 1, 3])
    assert [(c.layer, c.pooling) for c in cells] == [
        (-1, "mean"), (1, "mean"), (3, "mean"), (-1, "last"), (1, "last"), (3, "last"),
        (-1, "max"), (1, "max"), (3, "max")]
    assert {c.num_train for c in cells} == {160}
    # bags of characters: code, licences, chat and prose differ (chance 0.25)
    assert max(c.accuracy for c in cells if c.pooling == "mean") > 0.45
    control = sweep_setting(cache, _shuffled(domains), "heads", [-1, 1, 3], ("mean",))
    assert max(c.accuracy for c in control) < 0.4


def test_the_table_names_the_best_cell_and_whether_it_reaches_the_tfidf_bar():
    bar = {"setting": "s", "sample": "full", "num_train": 1234, "num_test": 50, "accuracy": 0.9}
    cells = [{"setting": "s", "sample": "full", "layer": layer, "pooling": p,
              "num_train": 1234, "num_test": 50, "accuracy": acc}
             for layer, p, acc in ((25, "mean", 0.8), (12, "mean", 0.91), (12, "last", 0.85))]
    doc = {"tfidf": [bar], "cells": cells}
    [row] = best_cells(doc)
    assert (row["best"]["layer"], row["best"]["pooling"], row["reaches_tfidf"]) == (12, "mean",
                                                                                    True)
    assert row["today"] == 0.8
    text = render_markdown(doc)
    assert "| s | full | 1,234 / 50 | 90.0 | 80.0 | 91.0 (L12, mean) | yes |" in text
    assert "| 12 | 91.0* | 85.0 |" in text
    cells[1]["accuracy"] = 0.89
    assert best_cells(doc)[0]["reaches_tfidf"] is False


def _backbone(engine: DecoderOnlyEngine, tmp_path):
    from engine_ext.routers.backbones import Backbone

    def state_fn(tokens: torch.Tensor) -> torch.Tensor:
        return engine.prefill_shared(engine.new_cache(tokens.shape[0]), tokens)

    return Backbone("tiny", _tokenize, state_fn, engine.hf.model.embed_tokens,
                    engine.cfg.hidden_size, engine.route_layer, "tiny", tmp_path / "pooled")


@torch.no_grad()
def test_mol2_reads_another_layer_and_pooling_from_the_cache_and_trains_on_it(tmp_path):
    from engine_ext.routers.backbones import LayerCacheBackbone
    from engine_ext.routers.run_mol2 import mol2_setting
    from engine_ext.routers.train import mol2_card_name

    engine = _engine(route_layer=1)
    texts = ("first request", "a second, longer request", "third")
    plain = _backbone(engine, tmp_path)
    mean = LayerCacheBackbone(plain, LayerCache(tmp_path / "layers"), "mean").with_engine(engine)
    torch.testing.assert_close(mean.pooled(texts), plain.pooled(texts))
    last = LayerCacheBackbone(plain, LayerCache(tmp_path / "layers"), "last")  # no engine: cache
    states = plain.state_fn(torch.tensor([_tokenize(texts[1])]))
    torch.testing.assert_close(last.pooled(texts)[1], states[0, -1], rtol=1e-5, atol=1e-5)
    domains = domains4_set({"train": 8, "val": 2, "test": 4}, max_bytes=20_000)
    with torch.enable_grad():
        row, _, _ = mol2_setting(mean, domains, [0], tmp_path / "heads", (3,))
    assert row.num_test == 16 and row.setting == "domains4"
    assert [mol2_card_name(25, "mean"), mol2_card_name(12, "mean"),
            mol2_card_name(12, "last")] == ["mol2-smollm2", "mol2-smollm2-l12",
                                            "mol2-smollm2-l12-last"]


def test_runs_of_other_layers_add_cells_and_a_rerun_replaces_its_own():
    from engine_ext.routers.probe_layers import merge

    def cell(layer: int, acc: float) -> dict:
        return {"setting": "s", "sample": "heads", "layer": layer, "pooling": "mean",
                "accuracy": acc}

    bar = {"setting": "s", "sample": "heads", "accuracy": 0.5}
    first = {"tfidf": [bar], "cells": [cell(1, 0.1), cell(2, 0.2)], "commands": ["a"],
             "probe_cpu_s": 1.0}
    second = {"tfidf": [bar | {"accuracy": 0.6}], "cells": [cell(2, 0.3), cell(3, 0.4)],
              "commands": ["b"], "probe_cpu_s": 2.0}
    both = merge(first, second)
    assert sorted((c["layer"], c["accuracy"]) for c in both["cells"]) == [
        (1, 0.1), (2, 0.3), (3, 0.4)]
    assert [b["accuracy"] for b in both["tfidf"]] == [0.6]
    assert both["commands"] == ["a", "b"] and both["probe_cpu_s"] == 3.0


def test_a_new_layer_card_keeps_the_decision_times_of_the_layer_25_card(tmp_path):
    import shutil
    from types import SimpleNamespace

    from engine_ext.routers.train import CARDS_DIR
    from engine_ext.routers.train_mol2 import timing_source

    shutil.copy(CARDS_DIR / "mol2-smollm2.json", tmp_path / "mol2-smollm2.json")
    args = SimpleNamespace(keep_timings=True, cards=tmp_path)
    assert timing_source(args, "mol2-smollm2-l8") == tmp_path / "mol2-smollm2.json"
    assert timing_source(args, "contextual-smollm2") is None  # another router: no borrowing
    (tmp_path / "mol2-smollm2-l8.json").write_text("{}")
    assert timing_source(args, "mol2-smollm2-l8") == tmp_path / "mol2-smollm2-l8.json"
    assert timing_source(SimpleNamespace(keep_timings=False, cards=tmp_path),
                         "mol2-smollm2-l8") is None


def test_the_summary_gives_one_row_per_layer_when_a_router_has_cards_at_two_layers():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from bench_routers import summary_table

    def row(layer: int, setting: str, acc: float) -> dict:
        return {"router": "mol2", "model": "smollm2-135m", "routing_layer": layer,
                "setting": setting, "accuracy_mean": acc, "accuracy_std": 0.01}

    one = summary_table([row(25, "clinc_intents150", 0.7)], [])
    assert "| mol2 on smollm2-135m | - | - | - | 70.0 +- 1.0% |" in one
    two = summary_table([row(25, "clinc_intents150", 0.7), row(8, "clinc_intents150", 0.8)], [])
    assert "| mol2 on smollm2-135m layer 25 | - | - | - | 70.0 +- 1.0% |" in two
    assert "| mol2 on smollm2-135m layer 8 | - | - | - | 80.0 +- 1.0% |" in two
    feats = row(8, "clinc_domains10", 0.98) | {"card": "mol2-smollm2-l8-x6-mean-max"}
    three = summary_table([row(8, "clinc_intents150", 0.8) | {"card": "mol2-smollm2-l8"},
                           feats], [])  # two cards at one layer: one row each
    assert "| mol2 on smollm2-135m (mol2-smollm2-l8) | - | - | - | 80.0 +- 1.0% |" in three
    assert "| mol2 on smollm2-135m (mol2-smollm2-l8-x6-mean-max) | - | 98.0 +- 1.0% |" in three
