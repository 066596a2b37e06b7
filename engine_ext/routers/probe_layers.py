"""Which SmolLM2 layer and pooling carry the routing label: the linear probe, layer by layer.

For every setting the probe (`baselines.create_probe`: standardise, logistic regression) is
fitted on the pooled states of one layer (`layer_cache`: the token embeddings and the output of
each of the 30 decoder layers; mean over the turn's tokens, or the last token's state) and
scored on the setting's test split. Two training samples: the rows the routers' heads train on
(`heads`: 30 per class of CLINC150 and BANKING77, as `settings.LARGE_TRAIN_PER_CLASS`) and the
whole official training split (`full`, when $MOLCAP_DATA_DIR provides it). The TF-IDF baseline
of the same sample is the bar.

    python -m engine_ext.routers.probe_layers --cache-dir CACHE [--fill-only]
    python -m engine_ext.routers.probe_layers --features [--fill-only]

The states are computed once (`--fill-only` runs only the pass: test rows first, then the heads'
sample, then the rest of the training split) and every probe reads the cache. `--features`
probes the multi-layer feature sets of `probe_features` instead of single layers (from a cache
that stops at probe_features.MAX_LAYER) and adds the probe-vs-TF-IDF learning curves; both kinds
of result share one JSON and one table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine_ext.routers import probe_features as pf
from engine_ext.routers.baselines import ALL_ROWS, create_probe, tfidf_baseline
from engine_ext.routers.datasets import RoutingSet
from engine_ext.routers.layer_cache import POOLINGS, LayerCache
from engine_ext.routers.states import ROUTE_LAYER

OUT_JSON = Path("docs/router_probe_layers.json")
DEFAULT_CACHE = Path(".cache/engine_ext/routers/layers")


@dataclass(frozen=True)
class ProbeCell:
    """The probe on one setting, training sample, layer and pooling."""

    setting: str
    sample: str
    layer: int
    """-1: the token embeddings; i: the output of decoder layer i (ROUTE_LAYER = 25 today)."""
    pooling: str
    num_train: int
    num_test: int
    accuracy: float


def probe_accuracy(train_x: np.ndarray, train_y, test_x: np.ndarray, test_y) -> float:
    """Test accuracy of the linear probe fitted on [N, D] states."""
    model = create_probe().fit(train_x, np.asarray(train_y))
    return float((model.predict(test_x) == np.asarray(test_y)).mean())


def sweep_setting(cache: LayerCache, routing_set: RoutingSet, sample: str,
                  layers: list[int], poolings=POOLINGS) -> list[ProbeCell]:
    """The probe on every requested layer (-1 = embeddings) and pooling of one setting."""
    cells = []
    for pooling in poolings:
        train = cache.states(routing_set.train.texts, pooling)
        test = cache.states(routing_set.test.texts, pooling)
        for layer in layers:
            acc = probe_accuracy(train[layer + 1], routing_set.train.labels, test[layer + 1],
                                 routing_set.test.labels)
            cells.append(ProbeCell(routing_set.name, sample, layer, pooling,
                                   len(routing_set.train), len(routing_set.test), acc))
            print(cells[-1], flush=True)
    return cells


def samples(text_dir: Path, names: list[str] | None) -> dict[str, dict[str, RoutingSet]]:
    """{sample: {setting: RoutingSet}}: the heads' sample, and the whole training split where
    it is larger (the test rows are the same)."""
    from engine_ext.routers.settings import LARGE_TRAIN_PER_CLASS, load_settings

    heads = load_settings(text_dir, LARGE_TRAIN_PER_CLASS)
    full = load_settings(text_dir, ALL_ROWS)
    keep = [n for n in heads if names is None or n in names]
    out = {"heads": {n: heads[n] for n in keep}}
    out["full"] = {n: full[n] for n in keep if len(full[n].train) > len(heads[n].train)}
    return out


def fill(cache: LayerCache, by_sample: dict[str, dict[str, RoutingSet]]) -> None:
    """One pass over every text the sweep needs: test rows, the heads' sample, the rest."""
    from engine_ext.routers.states import load_route_engine, turn_ids  # noqa: PLC0415

    engine, tokenizer = load_route_engine()
    order = [s.test.texts for s in by_sample["heads"].values()]
    order += [s.train.texts for part in by_sample.values() for s in part.values()]
    for texts in order:
        cache.fill(texts, engine, lambda t: turn_ids(tokenizer, t))


def run(cache: LayerCache, by_sample, layers: list[int], poolings=POOLINGS) -> dict:
    """The sweep and the TF-IDF bar of every setting and sample, as a JSON document."""
    cells, bars = [], []
    for sample, sets in by_sample.items():
        for routing_set in sets.values():
            bar = tfidf_baseline(routing_set, sample=sample)
            bars.append(asdict(bar))
            print(bar, flush=True)
            cells += [asdict(c) for c in sweep_setting(cache, routing_set, sample, layers,
                                                           poolings)]
    return {"tfidf": bars, "cells": cells}


def run_features(cache: LayerCache, by_sample, specs: list[pf.FeatureSpec]) -> dict:
    """Every feature set on every setting and sample, the TF-IDF bars, and per setting of the
    `full` sample the learning curve of its best feature set against TF-IDF."""
    cells, bars, curves = [], [], []
    for sample, sets in by_sample.items():
        for routing_set in sets.values():
            bars.append(asdict(tfidf_baseline(routing_set, sample=sample)))
            found = pf.probe_sets(cache, routing_set, sample, specs)
            cells += [asdict(c) for c in found]
            if sample == "full":  # the whole split's point is the cell already fitted
                best = max(found, key=lambda c: c.accuracy)
                spec = pf.FeatureSpec(best.layers, best.poolings)
                curves += pf.learning_curve(cache, routing_set, spec, (0.1, 0.3))
                curves.append({"setting": best.setting, "feature_set": best.feature_set,
                               "num_train": best.num_train, "probe": best.accuracy,
                               "tfidf": bars[-1]["accuracy"]})
    return {"tfidf": bars, "cells": [], "feature_cells": cells, "curves": curves}


def merge(old: dict, new: dict) -> dict:
    """`new` plus the cells, bars and curve points of `old` that `new` did not measure (runs
    of different settings, samples, layers or feature sets build one table)."""
    def key(c: dict) -> tuple:
        return (c["setting"], c.get("sample"), c.get("layer"), c.get("pooling"),
                c.get("feature_set"), c.get("num_train") if "probe" in c else None)

    out = {}
    for part in ("tfidf", "cells", "feature_cells", "curves"):
        done = {key(c) for c in new.get(part, [])}
        out[part] = [c for c in old.get(part, []) if key(c) not in done] + new.get(part, [])
    out["commands"] = list(dict.fromkeys(old.get("commands", []) + new["commands"]))
    out["probe_cpu_s"] = round(old.get("probe_cpu_s", 0) + new["probe_cpu_s"], 1)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def best_cells(doc: dict) -> list[dict]:
    """Per setting and sample: the TF-IDF bar, the probe today's routers read (layer 25, mean)
    and the best probe of the sweep (ties: the lower layer, then mean)."""
    rows = []
    for bar in doc["tfidf"]:
        mine = [c for c in doc["cells"] if (c["setting"], c["sample"]) ==
                (bar["setting"], bar["sample"])]
        if not mine:
            continue
        best = max(mine, key=lambda c: (c["accuracy"], -c["layer"], c["pooling"] == "mean"))
        today = next((c for c in mine if (c["layer"], c["pooling"]) == (ROUTE_LAYER, "mean")),
                     None)
        rows.append({"setting": bar["setting"], "sample": bar["sample"],
                     "num_train": bar["num_train"], "num_test": bar["num_test"],
                     "tfidf": bar["accuracy"], "today": today and today["accuracy"],
                     "best": best, "reaches_tfidf": best["accuracy"] >= bar["accuracy"]})
    return rows


def render_markdown(doc: dict) -> str:
    """The sweep as Markdown: a summary per setting, then one table per sample (layer rows,
    setting x pooling columns; * marks a probe at or above the TF-IDF bar of its column)."""
    lines = ["Linear probe (standardise + logistic regression, C = 1) on SmolLM2-135M states, "
             "test accuracy %; `python -m engine_ext.routers.probe_layers`. Layer -1 is the "
             "token embeddings, layer i the output of decoder layer i (MoL2 and Contextual "
             f"MoL read layer {ROUTE_LAYER}, mean-pooled). `heads`: the training rows of the "
             "routers' heads; `full`: the whole official training split. Test rows are the "
             "same in both.", "",
             "| setting | sample | train / test rows | TF-IDF | probe L25 mean | best probe "
             "(layer, pooling) | reaches TF-IDF |", "|---|---|---|---|---|---|---|"]
    for r in best_cells(doc):
        b = r["best"]
        lines.append(f"| {r['setting']} | {r['sample']} | {r['num_train']:,} / "
                     f"{r['num_test']:,} | {_pct(r['tfidf'])} | "
                     f"{'-' if r['today'] is None else _pct(r['today'])} | "
                     f"{_pct(b['accuracy'])} (L{b['layer']}, {b['pooling']}) | "
                     f"{'yes' if r['reaches_tfidf'] else 'no'} |")
    bars = {(b["setting"], b["sample"]): b["accuracy"] for b in doc["tfidf"]}
    for sample in dict.fromkeys(c["sample"] for c in doc["cells"]):
        cells = [c for c in doc["cells"] if c["sample"] == sample]
        cols = list(dict.fromkeys((c["setting"], c["pooling"]) for c in cells))
        acc = {(c["setting"], c["pooling"], c["layer"]): c["accuracy"] for c in cells}
        sizes = {c["setting"]: c["num_train"] for c in cells}
        lines += ["", f"Sample `{sample}` (training rows: " + ", ".join(
            f"{k} {v:,}" for k, v in sizes.items()) + "):", "",
            "| layer | " + " | ".join(f"{s} {p}" for s, p in cols) + " |",
            "|---" * (len(cols) + 1) + "|"]
        for layer in sorted({c["layer"] for c in cells}):
            row = []
            for s, p in cols:
                a = acc.get((s, p, layer))
                row.append("" if a is None else _pct(a) + ("*" if a >= bars[(s, sample)]
                                                           else ""))
            lines.append(f"| {layer} | " + " | ".join(row) + " |")
        lines.append("| TF-IDF | " + " | ".join(_pct(bars[(s, sample)]) for s, _ in cols)
                     + " |")
    return "\n".join(lines + render_features(doc, bars)) + "\n"


def verdicts(cells: list[dict], bars: dict, curves: list[dict]) -> list[str]:
    """One generated sentence per setting and sample: the best feature set against TF-IDF,
    and whether the gap narrows with more training rows."""
    lines = [""]
    for s, m in dict.fromkeys((c["setting"], c["sample"]) for c in cells):
        best = max((c for c in cells if (c["setting"], c["sample"]) == (s, m)),
                   key=lambda c: c["accuracy"])
        gap = 100 * (best["accuracy"] - bars[(s, m)])
        text = (f"* {s}, {m} ({best['num_train']:,} rows): best `{best['feature_set']}` "
                f"{_pct(best['accuracy'])} vs TF-IDF {_pct(bars[(s, m)])} ({gap:+.1f}): "
                + ("reaches the baseline." if gap >= 0 else "short of the baseline."))
        mine = sorted((c for c in curves if c["setting"] == s and m == "full"),
                      key=lambda c: c["num_train"])
        if len(mine) > 1:
            first, last = (100 * (c["probe"] - c["tfidf"]) for c in (mine[0], mine[-1]))
            text += (f" From {mine[0]['num_train']:,} to {mine[-1]['num_train']:,} training "
                     f"rows the probe's gap goes {first:+.1f} -> {last:+.1f} points.")
        lines.append(text)
    return lines


def render_features(doc: dict, bars: dict) -> list[str]:
    """The multi-layer feature sets (rows) per setting and sample (columns), * at or above the
    column's TF-IDF bar, then the learning curves."""
    cells = doc.get("feature_cells", [])
    if not cells:
        return []
    cols = list(dict.fromkeys((c["setting"], c["sample"]) for c in cells))
    acc = {(c["feature_set"], c["setting"], c["sample"]): c for c in cells}
    sizes = {(c["setting"], c["sample"]): c["num_train"] for c in cells}
    lines = ["", "Feature sets a router at layer L reads for free (`--features`): the pooled "
             "states of several layers up to L side by side (L-1: the token embeddings, so "
             "`L-1 mean` is the bag of token embeddings), mean and max pooling; one probe on "
             "their concatenation. Test accuracy %; * at or above TF-IDF of the column.", "",
             "| feature set | features | " + " | ".join(
                 f"{s} {m} ({sizes[(s, m)]:,})" for s, m in cols) + " |",
             "|---" * (len(cols) + 2) + "|"]
    for name in dict.fromkeys(c["feature_set"] for c in cells):
        row = []
        for s, m in cols:
            c = acc.get((name, s, m))
            row.append("" if c is None else _pct(c["accuracy"]) + (
                "*" if c["accuracy"] >= bars[(s, m)] else ""))
        width = next(c["num_features"] for c in cells if c["feature_set"] == name)
        lines.append(f"| {name} | {width:,} | " + " | ".join(row) + " |")
    lines.append("| TF-IDF | - | " + " | ".join(_pct(bars[k]) for k in cols) + " |")
    curves = doc.get("curves", [])
    lines += verdicts(cells, bars, curves)
    if curves:
        lines += ["", "Learning curves on the whole training split (its first rows, in the "
                  "split's seeded order): the best feature set of the setting against TF-IDF "
                  "on the same rows.", "", "| setting | feature set | training rows | probe | "
                  "TF-IDF | probe - TF-IDF |", "|---|---|---|---|---|---|"]
        for c in curves:
            lines.append(f"| {c['setting']} | {c['feature_set']} | {c['num_train']:,} | "
                         f"{_pct(c['probe'])} | {_pct(c['tfidf'])} | "
                         f"{100 * (c['probe'] - c['tfidf']):+.1f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--text-dir", type=Path, default=None)
    parser.add_argument("--settings", nargs="+", default=None)
    parser.add_argument("--layers", type=int, nargs="+", default=list(range(-1, 30)))
    parser.add_argument("--samples", nargs="+", choices=("heads", "full"),
                        default=["heads", "full"])
    parser.add_argument("--poolings", nargs="+", choices=POOLINGS, default=list(POOLINGS))
    parser.add_argument("--fill-only", action="store_true")
    parser.add_argument("--features", action="store_true",
                        help="probe probe_features' multi-layer feature sets, not single layers "
                             f"(cache up to layer {pf.MAX_LAYER}, default {pf.DEFAULT_CACHE})")
    parser.add_argument("--feature-sets", nargs="+", default=None,
                        help="with --features: only these (labels as in the table, e.g. "
                             "'L-1,8 mean+max'; default all of probe_features.default_specs)")
    parser.add_argument("--out", type=Path, default=OUT_JSON)
    args = parser.parse_args(argv)
    import torch

    from engine_ext.data import default_text_dir

    torch.set_num_threads(1)
    by_sample = {k: v for k, v in samples(args.text_dir or default_text_dir(),
                                          args.settings).items() if k in args.samples}
    cache = (LayerCache(args.cache_dir or pf.DEFAULT_CACHE, pf.MAX_LAYER + 1) if args.features
             else LayerCache(args.cache_dir or DEFAULT_CACHE))
    if args.fill_only:
        fill(cache, by_sample)
        return
    start = time.process_time()
    specs = [s for s in pf.default_specs()
             if args.feature_sets is None or s.label in args.feature_sets]
    doc = (run_features(cache, by_sample, specs) if args.features
           else run(cache, by_sample, args.layers, tuple(args.poolings)))
    doc["commands"] = ["python -m engine_ext.routers.probe_layers " + shlex.join(
        sys.argv[1:] if argv is None else argv)]
    doc["probe_cpu_s"] = round(time.process_time() - start, 1)
    if args.out.exists():
        doc = merge(json.loads(args.out.read_text()), doc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(doc))
    print(f"wrote {args.out} and its .md")


if __name__ == "__main__":
    main()
