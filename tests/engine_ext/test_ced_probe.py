"""The CED probe reads every layer of the CED model as the engine computes it (the encoder
output its routers read included), pools over real bytes only, and its rows join the
baselines file the router table reads."""

from __future__ import annotations

import json

import numpy as np
import torch

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import get_preset
from engine_ext.routers.ced_probe import (
    baseline_rows,
    ced_layer_states,
    merge_baselines,
    pooled_layers,
    probe_cells,
    render_markdown,
)
from engine_ext.routers.datasets import domains4_set


def _byte_engine() -> CEDEngine:
    torch.manual_seed(0)
    cfg = get_preset("tiny").model_copy(update={"vocab_size": 260})
    return CEDEngine(CEDForCausalLM(cfg).eval())


@torch.no_grad()
def test_every_layer_is_read_as_the_engine_computes_it_and_pads_never_count():
    engine = _byte_engine()
    tokens = torch.randint(0, 256, (2, 300), generator=torch.Generator().manual_seed(1))
    states = ced_layer_states(engine, tokens)  # two chunks of 256 and 44
    cfg = engine.model.config
    assert len(states) == cfg.first_decoder_layer + 1
    assert all(s.shape == (2, 300, cfg.d_model) for s in states)
    torch.testing.assert_close(states[0], engine.model.model.embed_tokens(tokens))
    _, out = engine.oracle(tokens, None, chunk_size=256)  # the whole model, as it serves
    torch.testing.assert_close(states[-1], out.encoder_hidden)  # what the routers read
    layer0 = engine.model.model.layers[0]
    assert not torch.allclose(states[1], states[0]) and not torch.allclose(states[2], states[1])
    assert layer0.input_layernorm._forward_pre_hooks == {}  # the hooks are gone
    ids = [list(range(40, 50)), list(range(40, 45))]
    pooled = pooled_layers(engine, ids)
    alone = pooled_layers(engine, ids[1:])  # no padding
    np.testing.assert_allclose(pooled["mean"][:, 1], alone["mean"][:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pooled["max"][:, 1], alone["max"][:, 0], rtol=1e-5, atol=1e-5)


def test_the_probe_rows_join_the_baselines_and_the_table_text(tmp_path):
    from engine_ext.data import encode

    engine = _byte_engine()
    domains = domains4_set({"train": 30, "val": 1, "test": 15}, max_bytes=40_000)
    train = pooled_layers(engine, [encode(t) for t in domains.train.texts])
    test = pooled_layers(engine, [encode(t) for t in domains.test.texts])
    cells = probe_cells(train, test, domains, "heads")
    layers = engine.model.config.first_decoder_layer
    assert len(cells) == 2 * (layers + 1) + 1 and cells[-1]["layer"] == "all"
    assert max(c["accuracy"] for c in cells) > 0.4  # chance 0.25
    rows = baseline_rows(cells, routing_layer=2)
    mean = {c["layer"]: c["accuracy"] for c in cells if c["pooling"] == "mean"}
    best = max(mean, key=lambda k: (mean[k], -k))
    assert {r.method for r in rows} == {"probe_ced-small_L2", f"probe_ced-small_L{best}"}
    path = tmp_path / "baselines.json"
    old = {"method": "probe_ced-small_L2", "setting": "domains4", "sample": "heads",
           "num_options": 4, "num_train": 1, "num_test": 1, "accuracy": 0.0, "fit_seconds": 0}
    keep = old | {"method": "tfidf_logreg", "accuracy": 0.8}
    path.write_text(json.dumps({"command": "a", "rows": [old, keep]}))
    merge_baselines(path, rows, {"domains4": 4}, "b")
    doc = json.loads(path.read_text())
    assert doc["command"] == "a; b" and doc["rows"][0] == keep
    assert [r["accuracy"] for r in doc["rows"] if r["method"] == "probe_ced-small_L2"] == \
        [mean[2]]
    text = render_markdown({"command": "c", "routing_layer": 2, "cells": cells,
                            "tfidf": {"domains4|heads": 0.8}})
    assert "**domains4**, heads (120 training rows, 60 test; TF-IDF 80.0)" in text
    assert f"| 2 | {100 * mean[2]:.1f} |" in text


def test_states_are_cached_per_text_and_shared_across_splits(tmp_path):
    from engine_ext.data import encode
    from engine_ext.routers.ced_probe import cached_pooled

    engine = _byte_engine()
    texts = [f"query {i}" for i in range(7)]
    logs: list[str] = []
    first = cached_pooled(engine, texts[:5], "stamp", tmp_path, log=lambda m, **_: logs.append(m))
    again = cached_pooled(engine, texts[3:] + texts[:1], "stamp", tmp_path,
                          log=lambda m, **_: logs.append(m))
    assert logs == ["ced states: 5/5 texts", "ced states: 2/2 texts"]  # only the new texts
    direct = pooled_layers(engine, [encode(t) for t in texts[3:] + texts[:1]])
    for name in ("mean", "max"):
        np.testing.assert_allclose(again[name], direct[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(again[name][:, 4], first[name][:, 0])  # read back
    cached_pooled(engine, texts, "other model", tmp_path, log=lambda m, **_: logs.append(m))
    assert logs[-1] == "ced states: 7/7 texts"  # another model's stamp shares nothing


def test_a_nine_layer_encoder_gets_the_smollm2_routers_feature_set_and_runs_render_apart():
    from engine_ext.data import encode
    from engine_ext.routers.ced_probe import ROUTER_FEATURES, side_by_side

    torch.manual_seed(0)
    cfg = get_preset("tiny").model_copy(update={
        "vocab_size": 260, "num_layers": 10, "num_encoder_layers": 9, "kv_source_layers": (9,),
        "index_layers": (9,)})
    engine = CEDEngine(CEDForCausalLM(cfg).eval())
    domains = domains4_set({"train": 10, "val": 1, "test": 5}, max_bytes=40_000)
    train = pooled_layers(engine, [encode(t) for t in domains.train.texts])
    test = pooled_layers(engine, [encode(t) for t in domains.test.texts])
    both = side_by_side(train, [-1, 8])
    np.testing.assert_array_equal(both, np.concatenate(
        [train["mean"][0], train["mean"][9], train["max"][0], train["max"][9]], axis=1))
    cells = probe_cells(train, test, domains, "heads")
    assert [c["layer"] for c in cells[-2:]] == ["all", "L" + ",".join(map(str, ROUTER_FEATURES))]
    full = [c | {"sample": "full", "num_train": 999, "accuracy": 0.5} for c in cells]
    rows = {r.method: r for r in baseline_rows(cells + full, 8, "m")}
    feature_row = rows["probe_m_L-1,0,2,4,6,8 mean+max"]
    assert (feature_row.sample, feature_row.num_train, feature_row.accuracy) == ("full", 999, 0.5)
    assert rows["probe_m_L8"].sample == "heads"
    run = {"model": "smollm2_ced", "command": "d", "routing_layer": 8, "cells": cells,
           "tfidf": {}, "cost": {"load wall/CPU s": "9 / 6"}}
    old = {"command": "c", "routing_layer": 2, "cells": cells[:-1], "tfidf": {}}
    text = render_markdown({"runs": {"ced-small": old, "smollm2_ced": run}})
    assert text.index("## ced-small") < text.index("## smollm2_ced")
    assert "Layers -1,0,2,4,6,8 side by side, mean + max" in text
    assert "Cost (load wall/CPU s 9 / 6)" in text
