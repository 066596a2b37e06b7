"""Routing data: fixed seeded splits from the shipped slices, and located errors on bad files."""

from __future__ import annotations

import json
import shutil

import pytest

from engine_ext.data import REPO_TEXT_DIR
from engine_ext.routers.datasets import (
    RoutingDataError,
    banking77_set,
    clinc_sets,
    domains4_set,
    fingerprint,
)


def test_clinc_slice_gives_10_domains_and_150_intents_over_the_same_utterances():
    domains, intents = clinc_sets(REPO_TEXT_DIR, {"train": 2, "test": 1}, seed=0)
    assert len(domains.options) == 10 and len(intents.options) == 150
    assert domains.train.texts == intents.train.texts
    assert len(intents.train) == 300 and len(intents.test) == 150
    assert set(intents.test.labels) == set(range(150))  # one test utterance per intent
    groups = json.loads((REPO_TEXT_DIR / "clinc150" / "domains.json").read_text())
    for intent, domain in zip(intents.train.labels, domains.train.labels, strict=True):
        assert intents.options[intent] in groups[domains.options[domain]]
    assert not set(domains.train.texts) & set(domains.test.texts)


def test_splits_are_fixed_by_the_data_seed():
    a = clinc_sets(REPO_TEXT_DIR, {"train": 2}, seed=0)[0]
    b = clinc_sets(REPO_TEXT_DIR, {"train": 2}, seed=0)[0]
    c = clinc_sets(REPO_TEXT_DIR, {"train": 2}, seed=1)[0]
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)


def test_banking77_slice_and_domain_corpora():
    banking = banking77_set(REPO_TEXT_DIR, {}, seed=0)
    assert len(banking.options) == 77 and len(banking.test) == 154
    assert not set(banking.train.texts) & set(banking.val.texts)
    corpora = domains4_set({"train": 5, "val": 2, "test": 3}, seed=0)
    assert corpora.options == ("chat", "code", "legal", "prose")
    assert len(corpora.test) == 12 and not set(corpora.train.texts) & set(corpora.test.texts)


def _copy_clinc(tmp_path) -> tuple:
    folder = tmp_path / "clinc150"
    shutil.copytree(REPO_TEXT_DIR / "clinc150", folder)
    path = folder / "data_slice.json"
    return path, json.loads(path.read_text())


def test_empty_split_names_the_file_and_field(tmp_path):
    path, data = _copy_clinc(tmp_path)
    data["val"] = []
    path.write_text(json.dumps(data))
    with pytest.raises(RoutingDataError, match=r"data_slice\.json: val: split is missing or "
                                               r"empty"):
        clinc_sets(tmp_path, {})


def test_unlabelled_row_names_the_file_and_field(tmp_path):
    path, data = _copy_clinc(tmp_path)
    data["test"][3] = ["what is the weather", ""]
    path.write_text(json.dumps(data))
    with pytest.raises(RoutingDataError, match=r"data_slice\.json: test: unlabelled"):
        clinc_sets(tmp_path, {})


def test_unknown_intent_is_refused(tmp_path):
    path, data = _copy_clinc(tmp_path)
    data["train"][0] = ["hello", "no_such_intent"]
    path.write_text(json.dumps(data))
    with pytest.raises(RoutingDataError, match="no_such_intent"):
        clinc_sets(tmp_path, {})


def test_router_subsample_is_seeded_and_spread_over_the_split():
    from engine_ext.routers.settings import subsample

    domains, _ = clinc_sets(REPO_TEXT_DIR, {"train": 2}, seed=0)
    texts, labels = subsample(domains.train, 40)
    assert (texts, labels) == subsample(domains.train, 40) and len(texts) == 40
    pairs = set(zip(domains.train.texts, domains.train.labels, strict=True))
    assert set(zip(texts, labels, strict=True)) <= pairs
    assert texts != domains.train.texts[:40]  # not the head of the split
    assert subsample(domains.train, 10_000)[0] == domains.train.texts
