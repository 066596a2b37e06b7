"""MoL2's head started from a fitted linear map (mol2_init): written into the pointer head it
decides as the map does, the search keeps that start when training cannot beat it on
validation, a wider head's saved file loads at its own width, and the options are checked."""

from __future__ import annotations

import argparse

import pytest
import torch
from test_router_head_training import D_OPTION, D_QUERY, NUM_OPTIONS, _task

from engine_ext.routers.mol2 import accuracy, create_head, predict
from engine_ext.routers.mol2_init import choose_ridge, fit_linear, fit_ridge, write_linear
from engine_ext.routers.run_mol2 import HeadSearch, search_heads

WIDE = dict(d_head=16, num_heads=4, option_depth=1)


def _noisy(num: int, seed: int):
    """Overlapping classes (spread 4 around centres 3 apart): no head is perfect."""
    task = _task(num, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    return type(task)(task.queries + 3 * torch.randn(task.queries.shape, generator=gen),
                      task.labels, task.option_embeds, task.option_mask)


@torch.no_grad()
def test_a_written_head_decides_as_the_linear_map():
    train, test = _noisy(300, 1), _noisy(200, 3)
    head = create_head(D_OPTION, 0, D_QUERY, **WIDE)
    head.query_scale.fit(train.queries)
    [(weight, bias)] = fit_ridge(head.query_scale(train.queries), train.labels, NUM_OPTIONS,
                                 (0.1,))
    want = (head.query_scale(test.queries) @ weight.T + bias).argmax(-1)
    assert not torch.equal(predict(head, test), want)  # a fresh head is not the map
    write_linear(head, weight, bias, train.option_embeds, train.option_mask, train.queries,
                     train.labels)
    assert torch.equal(predict(head, test), want)  # the engine's own forward
    assert torch.equal(predict(head, test, fast=True), want)
    # the logits are sharpened from the ridge map's flat ones: a lower training loss
    import torch.nn.functional as F

    got = head(train.queries, head.encode_options(train.option_embeds, train.option_mask))
    flat = head.query_scale(train.queries) @ weight.T + bias
    assert float(F.cross_entropy(got, train.labels)) < 0.9 * float(
        F.cross_entropy(flat, train.labels))


def test_logistic_regression_by_lbfgs_fits_the_training_rows():
    train = _noisy(300, 1)
    x = (train.queries - train.queries.mean(0)) / train.queries.std(0)
    weight, bias = fit_linear(x, train.labels, NUM_OPTIONS, l2=1e-3)
    acc = float(((x @ weight.T + bias).argmax(-1) == train.labels).float().mean())
    assert acc > 0.8 and weight.shape == (NUM_OPTIONS, D_QUERY)


def test_the_refined_start_is_kept_only_where_validation_prefers_it():
    train, val = _noisy(300, 1), _noisy(200, 2)
    (ridge, _), _ = choose_ridge(train, val, (1000.0,))
    (weight, _), text = choose_ridge(train, val, (1000.0,), refine_iters=30)
    assert "refined by 30 L-BFGS iterations" in text
    kept = "of logistic regression in the span of its rows: validation" in text \
        and text.split("validation ")[-1].split(", ")[1].startswith("kept")
    assert kept == (not torch.equal(weight, ridge))


def test_a_head_narrower_than_its_options_is_refused():
    train = _task(50, 1)
    head = create_head(D_OPTION, 0, D_QUERY, d_head=4, num_heads=2, option_depth=1)
    [(weight, bias)] = fit_ridge(train.queries, train.labels, NUM_OPTIONS, (0.1,))
    with pytest.raises(ValueError, match="d_head must exceed the number of options"):
        write_linear(head, weight, bias, train.option_embeds, train.option_mask, train.queries,
                     train.labels)


def test_the_search_keeps_the_start_when_training_cannot_beat_it():
    tasks = {"train": _noisy(300, 1), "val": _noisy(200, 2)}
    backbone = argparse.Namespace(d_model=D_OPTION, d_query=D_QUERY)
    (weight, bias), text = choose_ridge(tasks["train"], tasks["val"], (10.0, 0.1))
    assert "l2 candidates" in text and "chosen" in text
    # lr 0: the training leaves every weight as written, so each seed keeps step 0, the map
    search = HeadSearch(max_steps=20, eval_every=10, lrs=(0.0,), patience=2, batch=16,
                        start_l2s=(10.0, 0.1), d_head=16)
    heads, _, text = search_heads(backbone, tasks, [0, 1], search)
    assert "the head started as a ridge map" in text and "steps kept per seed [0, 0]" in text
    scale = heads[0].query_scale
    want = (scale(tasks["val"].queries) @ weight.T + bias).argmax(-1)
    for head in heads:
        assert head.query_proj.out_features == 16
        assert torch.equal(predict(head, tasks["val"]), want)
    assert accuracy(heads[0], tasks["val"]) == accuracy(heads[1], tasks["val"])


def test_a_wider_heads_file_loads_at_its_width(tmp_path):
    from engine_ext.routers.run_mol2 import load_head, save_head

    head = create_head(D_OPTION, 0, D_QUERY, d_head=32, num_heads=4, option_depth=2)
    path = save_head(head, tmp_path / "h.safetensors")
    backbone = argparse.Namespace(d_model=D_OPTION, d_query=D_QUERY)
    loaded = load_head(backbone, path)
    assert loaded.query_proj.out_features == 32


def test_start_options_need_the_search_and_sane_values(capsys):
    from engine_ext.routers.train import main

    for bad, says in ((["--routers", "mol2", "--mol2-start-l2", "0.1"], "need --mol2-early"),
                      (["--routers", "mol2", "--mol2-early-stop", "5", "--mol2-steps", "10",
                        "--mol2-d-head", "30"], "multiple of 4"),
                      (["--routers", "mol2", "--mol2-early-stop", "5", "--mol2-steps", "10",
                        "--mol2-start-l2", "0"], "must be > 0"),
                      (["--routers", "mol2", "--mol2-early-stop", "5", "--mol2-steps", "10",
                        "--mol2-start-lbfgs", "5"], "give both")):
        with pytest.raises(SystemExit) as exit_:
            main(bad)
        assert exit_.value.code == 2 and says in capsys.readouterr().err
