"""The reference rows of the router table: the TF-IDF baseline and the linear probe train on the
repository's slices, score well above chance, and fall to chance when the labels are shuffled."""

from __future__ import annotations

import random

import torch

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import get_preset
from engine_ext.data import REPO_TEXT_DIR
from engine_ext.routers.backbones import POOLED_CHUNK, ced_backbone
from engine_ext.routers.baselines import probe_backbone, tfidf_baseline
from engine_ext.routers.datasets import RoutingSplit, clinc_sets, domains4_set


def _shuffled(split: RoutingSplit) -> RoutingSplit:
    labels = list(split.labels)
    random.Random(1).shuffle(labels)
    return RoutingSplit(split.texts, tuple(labels))


def test_tfidf_baseline_learns_clinc_domains_from_the_slice_and_not_from_shuffled_labels():
    domains10, _ = clinc_sets(REPO_TEXT_DIR, {"train": None, "val": None, "test": None})
    found = tfidf_baseline(domains10)
    assert (found.num_train, found.num_test, found.num_options) == (450, 300, 10)
    assert found.accuracy > 0.6  # chance 0.1
    control = tfidf_baseline(domains10, _shuffled(domains10.train))
    assert control.accuracy < 0.2


def _ced_backbone(tmp_path):
    torch.manual_seed(0)
    engine = CEDEngine(CEDForCausalLM(get_preset("tiny").model_copy(update={"vocab_size": 260}))
                       .eval())
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"stamp")  # the cache key reads its size and mtime only
    return ced_backbone(engine, weights, tmp_path / "states")


def test_linear_probe_reads_the_label_from_pooled_states_and_not_from_shuffled_labels(tmp_path):
    backbone = _ced_backbone(tmp_path)
    domains = domains4_set({"train": 40, "val": 1, "test": 20}, max_bytes=40_000)
    found = probe_backbone(backbone, domains)
    assert found.method == f"probe_ced-small_L{backbone.layer}"
    assert (found.num_train, found.num_test) == (160, 80)
    assert found.accuracy > 0.45  # chance 0.25: bytes of code, licences and chat differ
    control = probe_backbone(backbone, type(domains)(
        domains.name, domains.options, domains.descriptions, _shuffled(domains.train),
        domains.val, domains.test, domains.sources))
    assert control.accuracy < 0.35


@torch.no_grad()
def test_pooled_states_are_cached_in_chunks_that_equal_one_pass(tmp_path):
    backbone = _ced_backbone(tmp_path)
    texts = tuple(f"text number {i}" for i in range(POOLED_CHUNK + 3))
    chunked = backbone.pooled(texts)
    assert len(list((tmp_path / "states").glob("pooled_*.pt"))) == 2
    tail = backbone.pooled(texts[POOLED_CHUNK:])  # the second chunk, read back from its file
    torch.testing.assert_close(tail, chunked[POOLED_CHUNK:])
    torch.testing.assert_close(chunked[:3], backbone.pooled(texts[:3]), rtol=1e-5, atol=1e-5)


def test_mol2_retrained_with_kept_timings_keeps_the_measured_decision_times(tmp_path):
    from engine_ext.routers.run_mol2 import mol2_setting

    backbone = _ced_backbone(tmp_path)
    domains = domains4_set({"train": 8, "val": 2, "test": 4}, max_bytes=20_000)
    measured, _, _ = mol2_setting(backbone, domains, [0], tmp_path / "heads", (3,))
    kept, _, _ = mol2_setting(backbone, domains, [1], tmp_path / "heads", (3,), timed=measured)
    assert kept.decision == measured.decision and kept.standalone == measured.standalone
    assert kept.num_test == 16 and kept.train_seconds_mean != measured.train_seconds_mean


def test_l0_rows_follow_the_card_and_a_merged_run_replaces_only_its_rows(tmp_path):
    import json

    from engine_ext.routers.baselines import per_query_samples, write_results
    from engine_ext.routers.run_l0 import MAX_TRAIN

    domains10, intents150 = clinc_sets(REPO_TEXT_DIR, {"train": None, "val": None, "test": None})
    assert len(domains10.train) > MAX_TRAIN
    # the validated L0 rows train on the whole split, the fixed ones on a 240-row subsample
    assert per_query_samples(domains10)["l0"] == domains10.train
    assert len(per_query_samples(intents150)["l0"]) == MAX_TRAIN
    path = tmp_path / "baselines.json"
    rows = [tfidf_baseline(domains10), tfidf_baseline(intents150)]
    write_results(rows, {"a": domains10}, path, "first")
    again = tfidf_baseline(domains10, RoutingSplit(domains10.train.texts[:50],
                                                   domains10.train.labels[:50]))
    write_results([again], {"a": domains10}, path, "second", merge=True)
    doc = json.loads(path.read_text())
    assert doc["command"] == "first; second"
    assert [(r["setting"], r["num_train"]) for r in doc["rows"]] == [
        ("clinc_domains10", 50), ("clinc_intents150", len(intents150.train))]
