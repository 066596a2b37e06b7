"""Richer router features, probed: several layers' pooled states side by side, mean + max.

A router at layer L can read, for free, any state the engine computed before it: the token
embeddings (their mean over the turn is a bag of token embeddings) and the output of every
decoder layer up to L. `probe_layers` asks which single layer and pooling carries the label;
this module asks whether their concatenation does better: a `FeatureSpec` names the layers (row
-1: the embeddings) and the poolings, `features` stacks those cached states into one vector per
text, and the linear probe (`baselines.create_probe`) is fitted on the whole official training
split and scored on the same test rows as the TF-IDF baseline.

    python -m engine_ext.routers.probe_layers --features --cache-dir out/routers/layers_l9

The states come from one pass per text up to decoder layer MAX_LAYER (`layer_cache`, kept under
out/), so every feature set is a cheap read; the results join the layer sweep's JSON and table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine_ext.routers.baselines import create_probe
from engine_ext.routers.layer_cache import (  # noqa: F401 (the feature-set API, re-exported)
    DEFAULT_CACHE,
    MAX_LAYER,
    FeatureSpec,
    LayerCache,
    features,
)


def default_specs(max_layer: int = MAX_LAYER) -> list[FeatureSpec]:
    """The feature sets probed: one layer (the reference), mean + max, the token-embedding bag
    beside it, every second layer up to it, both, and every layer up to max_layer."""
    every2 = (-1, *range(0, max_layer + 1, 2))
    every = tuple(range(-1, max_layer + 1))
    return [FeatureSpec((8,)), FeatureSpec((8,), ("mean", "max")), FeatureSpec((-1, 8)),
            FeatureSpec((-1, 8), ("mean", "max")), FeatureSpec(every2),
            FeatureSpec(every2, ("mean", "max")), FeatureSpec(every, ("mean", "max"))]


@dataclass(frozen=True)
class FeatureCell:
    """The probe on one setting, training sample and feature set."""

    setting: str
    sample: str
    feature_set: str
    layers: tuple[int, ...]
    poolings: tuple[str, ...]
    num_features: int
    num_train: int
    num_test: int
    accuracy: float


def probe_sets(cache: LayerCache, routing_set, sample: str, specs: list[FeatureSpec],
               train=None) -> list[FeatureCell]:
    """The probe on every feature set of one setting (trained on `train`, default the
    setting's training split; always scored on its test split)."""
    train = train or routing_set.train
    cells = []
    for spec in specs:
        train_x = features(cache, train.texts, spec)
        test_x = features(cache, routing_set.test.texts, spec)
        model = create_probe().fit(train_x, np.asarray(train.labels))
        acc = float((model.predict(test_x) == np.asarray(routing_set.test.labels)).mean())
        cells.append(FeatureCell(routing_set.name, sample, spec.label, spec.layers,
                                 spec.poolings, train_x.shape[1], len(train),
                                 len(routing_set.test), acc))
        print(cells[-1], flush=True)
    return cells


def learning_curve(cache: LayerCache, routing_set, spec: FeatureSpec,
                   fractions=(0.1, 0.3, 1.0)) -> list[dict]:
    """Probe and TF-IDF on the first `fraction` of the (seeded-order) training split: whether
    more data closes the gap, or the bar-of-n-grams keeps its lead."""
    from engine_ext.routers.baselines import tfidf_baseline
    from engine_ext.routers.datasets import RoutingSplit

    points = []
    for fraction in fractions:
        num = max(len(routing_set.options), int(fraction * len(routing_set.train)))
        part = RoutingSplit(routing_set.train.texts[:num], routing_set.train.labels[:num])
        [cell] = probe_sets(cache, routing_set, "curve", [spec], part)
        bar = tfidf_baseline(routing_set, part, "curve")
        points.append({"setting": routing_set.name, "feature_set": spec.label,
                       "num_train": num, "probe": cell.accuracy, "tfidf": bar.accuracy})
    return points
