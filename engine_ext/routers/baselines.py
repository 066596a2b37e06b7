"""Reference rows for the router table: a plain text classifier and a linear probe.

* **TF-IDF + logistic regression**: word 1-2-grams and character 2-5-grams (within word
  boundaries), sublinear term frequency, multinomial logistic regression; trained on the
  setting's training split, scored on its test split: what a new user fits in seconds.
* **Linear probe**: a logistic regression on the mean-pooled routing-layer states a router
  reads (SmolLM2 layer 25, the CED model's encoder output), standardised per feature. It
  separates "the representation does not carry the label" (probe low) from "the head is
  undertrained" (probe high, router low).

Both are deterministic (lbfgs from zeros): one fit per setting, no seed spread.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine_ext.routers.datasets import RoutingSet, RoutingSplit

TFIDF_C = 10.0
"""Inverse regularisation of the TF-IDF baseline (sparse features want little shrinkage)."""
PROBE_C = 1.0
"""Inverse regularisation of the probe on standardised states."""
MAX_ITER = 2000
ALL_ROWS = 10**9
"""Rows per class that keep a whole split."""
BASELINES_FILE = Path("data/routers/baselines.json")
"""The committed reference rows (read by bench/bench_routers.py)."""


@dataclass(frozen=True)
class BaselineResult:
    """One reference row: accuracy on a setting's test split and what it was trained on."""

    method: str
    setting: str
    sample: str
    """Which training sample: the size MoL2 and the probes use ('heads'), a per-query router's
    subsample ('contextual', 'l0'), or the whole official training split ('full')."""
    num_options: int
    num_train: int
    num_test: int
    accuracy: float
    fit_seconds: float


def create_tfidf_classifier(c: float = TFIDF_C):
    """The baseline as a scikit-learn pipeline (unfitted)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline, make_union

    features = make_union(
        TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True, lowercase=True),
        TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True,
                        lowercase=True))
    return make_pipeline(features, LogisticRegression(C=c, max_iter=MAX_ITER))


def create_probe(c: float = PROBE_C):
    """The linear probe as a scikit-learn pipeline (unfitted): standardise, then logistic
    regression (SmolLM2's states have one massive-activation dimension)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=MAX_ITER))


def _fit_score(model, train_x, train_y, test_x, test_y) -> tuple[float, float]:
    import time

    start = time.process_time()
    model.fit(train_x, np.asarray(train_y))
    seconds = time.process_time() - start
    return float((model.predict(test_x) == np.asarray(test_y)).mean()), seconds


def tfidf_baseline(routing_set: RoutingSet, train: RoutingSplit | None = None,
                   sample: str = "heads") -> BaselineResult:
    """Fit the TF-IDF baseline on the training split (or `train`), score on the test split."""
    train = train or routing_set.train
    acc, seconds = _fit_score(create_tfidf_classifier(), list(train.texts), train.labels,
                              list(routing_set.test.texts), routing_set.test.labels)
    return BaselineResult("tfidf_logreg", routing_set.name, sample, len(routing_set.options),
                          len(train), len(routing_set.test), acc, seconds)


def linear_probe(name: str, routing_set: RoutingSet, train_states: np.ndarray,
                 train_labels, test_states: np.ndarray) -> BaselineResult:
    """Fit the probe on pooled training states [N, D], score on the test split's states."""
    if len(train_states) != len(train_labels) or len(test_states) != len(routing_set.test):
        raise ValueError(f"{len(train_states)} training states for {len(train_labels)} labels, "
                         f"{len(test_states)} test states for {len(routing_set.test)} texts")
    acc, seconds = _fit_score(create_probe(), train_states, train_labels, test_states,
                              routing_set.test.labels)
    return BaselineResult(name, routing_set.name, "heads", len(routing_set.options),
                          len(train_states),
                          len(routing_set.test), acc, seconds)


def probe_backbone(backbone, routing_set: RoutingSet) -> BaselineResult:
    """The probe on a backbone's pooled routing-layer states (disk-cached by the backbone)."""
    train = backbone.pooled(routing_set.train.texts).numpy()
    test = backbone.pooled(routing_set.test.texts).numpy()
    return linear_probe(f"probe_{backbone.name}_L{backbone.layer}", routing_set, train,
                        routing_set.train.labels, test)


def per_query_samples(small: RoutingSet) -> dict[str, RoutingSplit]:
    """The training rows Contextual MoL and L0 train on (from the default split): Contextual
    MoL's subsample, L0's rows (`run_l0.train_rows`)."""
    from engine_ext.routers.run_contextual import MAX_QUERIES, MAX_QUERIES_MANY
    from engine_ext.routers.run_l0 import train_rows
    from engine_ext.routers.settings import subsample

    cap = MAX_QUERIES_MANY if len(small.options) > 10 else MAX_QUERIES
    return {"contextual": RoutingSplit(*subsample(small.train, cap["train"])),
            "l0": train_rows(small)}


def run_all(sets: dict[str, RoutingSet], small_sets: dict[str, RoutingSet],
            full_sets: dict[str, RoutingSet], backbones: list) -> list[BaselineResult]:
    """Per setting: the TF-IDF baseline on the heads' sample, on each per-query router's
    subsample and on the whole training split; every backbone's probe on the heads' sample."""
    rows = []
    for name, routing_set in sets.items():
        found = [tfidf_baseline(routing_set)]
        found += [tfidf_baseline(routing_set, split, sample)
                  for sample, split in per_query_samples(small_sets[name]).items()]
        if len(full_sets[name].train) > len(routing_set.train):
            found.append(tfidf_baseline(full_sets[name], sample="full"))
        found += [probe_backbone(backbone, routing_set) for backbone in backbones]
        for row in found:
            print(row, flush=True)
        rows += found
    return rows


def write_results(rows: list[BaselineResult], sets: dict[str, RoutingSet], path: Path,
                  command: str, merge: bool = False) -> Path:
    """The rows as JSON (what bench/bench_routers.py adds to the router table); with `merge`,
    they replace the rows of the same method, setting and sample in the file, in place (the
    others stay, the command is added to its commands)."""
    sources = sorted({s for r in sets.values() for s in r.sources})
    new = [asdict(r) for r in rows]
    if merge and path.exists():
        old = json.loads(path.read_text())
        found = {(r["method"], r["setting"], r["sample"]): r for r in new}
        rows = {(r["method"], r["setting"], r["sample"]): r for r in old["rows"]} | found
        new = list(rows.values())  # in the file's order, new keys last
        command = "; ".join(dict.fromkeys([*old["command"].split("; "), command]))
        sources = sorted({*old["data_sources"], *sources})
    doc = {"command": command, "data_sources": sources,
           "deterministic": "one fit per setting (lbfgs from zeros): no seed spread",
           "tfidf_c": TFIDF_C, "probe_c": PROBE_C, "rows": new}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbones", nargs="*", choices=("smollm2", "ced"),
                        default=["smollm2", "ced"])
    parser.add_argument("--out", type=Path, default=BASELINES_FILE)
    parser.add_argument("--text-dir", type=Path, default=None)
    parser.add_argument("--settings", nargs="+", default=None,
                        help="only these settings (default: all four)")
    parser.add_argument("--merge", action="store_true",
                        help="replace only this run's rows in --out (the others stay)")
    args = parser.parse_args(argv)
    import torch

    from engine_ext.data import default_text_dir
    from engine_ext.routers.settings import LARGE_TRAIN_PER_CLASS, load_settings

    torch.set_num_threads(1)
    text_dir = args.text_dir or default_text_dir()
    sets = {name: s for name, s in load_settings(text_dir, LARGE_TRAIN_PER_CLASS).items()
            if args.settings is None or name in args.settings}
    small_sets, full_sets = load_settings(text_dir), load_settings(text_dir, ALL_ROWS)
    backbones = []
    if "smollm2" in args.backbones:
        from engine_ext.routers.backbones import smollm2_backbone
        from engine_ext.routers.states import load_route_engine

        backbones.append(smollm2_backbone(*load_route_engine()))
    if "ced" in args.backbones:
        from engine_ext.routers.train import ced_backbone_trained

        backbones.append(ced_backbone_trained())
    command = "python -m engine_ext.routers.baselines " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    rows = run_all(sets, small_sets, full_sets, backbones)
    print(f"wrote {write_results(rows, sets, args.out, command, args.merge)}")


if __name__ == "__main__":
    main()
