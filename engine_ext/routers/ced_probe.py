"""The linear probe on the CED model's layer states (issue 26, the CED model).

ced-small's routers (MoL2, Contextual MoL) read its encoder output: layer 3 of 8, the "H19" of
its layout. Whether that state carries the routing label at all is what the probe says: the
same probe as the SmolLM2 rows (`baselines.create_probe`: standardise, logistic regression,
C = 1), fitted on the pooled output of every layer a router can read (-1: the byte embeddings,
0..3 the encoder; the decoder layers above carry the adapters), mean and max over the turn's
bytes, and on all of them side by side, trained on the setting's training rows and scored on
its test rows (the rows of the TF-IDF baseline in `data/routers/baselines.json`).

    MOLCAP_DATA_DIR=... python -m engine_ext.routers.ced_probe [--settings domains4 ...]

Writes docs/router_ced_probe.{json,md} and adds the probe of the routers' layer and of the best
layer (mean-pooled, the routers' training rows) to data/routers/baselines.json, which the
router table reads. The states come from the routers' own routing pass per text (the encoder
alone, chunked), read at each layer's input by forward pre-hooks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from engine_ext.routers.backbones import CED_CHUNK
from engine_ext.routers.baselines import BASELINES_FILE, create_probe
from engine_ext.routing import pad_token_lists

OUT = Path("docs/router_ced_probe.json")
CACHE = Path(".cache/engine_ext/routers/ced_layers")
SAMPLES = {"heads": 30, "full": 10**9}
"""Training rows per class of CLINC150 (domains4 keeps its 100 per domain): the routers' heads
rows and the whole training split."""


@torch.no_grad()
def ced_layer_states(engine, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The byte embeddings and the output of every encoder layer over tokens [B, T]: a list of
    E + 1 tensors [B, T, D], the last the encoder output the routers read. One routing pass
    (`CEDEngine.encode`, chunks of CED_CHUNK); the input of layers 0..E-1 is read by a forward
    pre-hook on its input norm."""
    layers = engine.model.model.layers[: engine.model.config.first_decoder_layer]
    found: list[torch.Tensor] = []
    hooks = [layer.input_layernorm.register_forward_pre_hook(
        lambda _m, args: found.append(args[0])) for layer in layers]
    try:
        encoded = engine.encode(tokens, chunk_size=CED_CHUNK)  # [B, T, D]
    finally:
        for hook in hooks:
            hook.remove()
    per = len(layers)
    return [torch.cat(found[i::per], dim=1) for i in range(per)] + [encoded]


@torch.no_grad()
def pooled_layers(engine, ids: list[list[int]], batch: int = 64) -> dict[str, np.ndarray]:
    """{"mean", "max"}: [L + 1, N, D] pooled over each text's real bytes (right padding is
    exact: the model is causal)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: dict[str, np.ndarray] = {}
    for start in range(0, len(ids), batch):
        pick = order[start : start + batch]
        tokens, mask = pad_token_lists([ids[i] for i in pick])
        states = torch.stack(ced_layer_states(engine, tokens))  # [L + 1, B, T, D]
        weights = mask.to(states.dtype)[None, :, :, None]
        pooled = {"mean": (states * weights).sum(2) / weights.sum(2).clamp(min=1.0),
                  "max": states.masked_fill(weights == 0, float("-inf")).amax(2)}
        for name, value in pooled.items():
            if name not in out:
                out[name] = np.empty((value.shape[0], len(ids), value.shape[2]), np.float32)
            out[name][:, pick] = value.numpy()
    return out


def cached_pooled(engine, texts, stamp: str, cache: Path | None) -> dict[str, np.ndarray]:
    """`pooled_layers` of the texts' bytes, kept under `cache` by content."""
    from engine_ext.data import encode

    digest = hashlib.sha256(f"{stamp}|ced-layers|v1".encode())
    for t in texts:
        digest.update(t.encode() + b"\x1f")
    path = None if cache is None else cache / f"ced_{digest.hexdigest()[:20]}.npz"
    if path is not None and path.exists():
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    found = pooled_layers(engine, [encode(t) for t in texts])
    if path is not None:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"tmp_{path.name}")
        np.savez(tmp, **found)
        tmp.replace(path)
    return found


def _probe(train_x, train_y, test_x, test_y) -> float:
    model = create_probe().fit(train_x, np.asarray(train_y))
    return float((model.predict(test_x) == np.asarray(test_y)).mean())


def probe_cells(train: dict, test: dict, routing_set, sample: str) -> list[dict]:
    """The probe on every layer (mean and max) and on all layers side by side (mean + max)."""
    y, ty = routing_set.train.labels, routing_set.test.labels
    cells = []
    for pooling in ("mean", "max"):
        for row in range(train[pooling].shape[0]):
            cells.append({"layer": row - 1, "pooling": pooling,
                          "accuracy": _probe(train[pooling][row], y, test[pooling][row], ty)})

    def side_by_side(found: dict) -> np.ndarray:
        return np.concatenate([found[p].transpose(1, 0, 2).reshape(found[p].shape[1], -1)
                               for p in ("mean", "max")], axis=1)

    cells.append({"layer": "all", "pooling": "mean+max",
                  "accuracy": _probe(side_by_side(train), y, side_by_side(test), ty)})
    for cell in cells:
        cell.update(setting=routing_set.name, sample=sample, num_train=len(y), num_test=len(ty))
    return cells


def baseline_rows(cells: list[dict], routing_layer: int) -> list[dict]:
    """Reference rows for the router table: the mean-pooled probe at the routers' layer and
    at the best single layer, on the routers' training rows ('heads')."""
    from engine_ext.routers.baselines import BaselineResult

    rows = []
    for setting in dict.fromkeys(c["setting"] for c in cells):
        mean = {c["layer"]: c for c in cells if c["setting"] == setting
                and c["sample"] == "heads" and c["pooling"] == "mean"}
        if not mean:
            continue
        best = max(mean, key=lambda layer: (mean[layer]["accuracy"], -layer))
        for layer in sorted({routing_layer, best}):
            c = mean[layer]
            rows.append(BaselineResult(f"probe_ced-small_L{layer}", setting, "heads", 0,
                                       c["num_train"], c["num_test"], c["accuracy"], 0.0))
    return rows


def merge_baselines(path: Path, rows, options: dict[str, int], command: str) -> None:
    """Replace (method, setting, sample) rows of the baselines file with `rows`."""
    from dataclasses import asdict

    doc = json.loads(path.read_text())
    keys = {(r.method, r.setting, r.sample) for r in rows}
    kept = [r for r in doc["rows"] if (r["method"], r["setting"], r["sample"]) not in keys]
    new = [asdict(r) | {"num_options": options[r.setting]} for r in rows]
    doc["rows"] = kept + new
    if command not in doc["command"]:
        doc["command"] += "; " + command
    path.write_text(json.dumps(doc, indent=2) + "\n")


def render_markdown(doc: dict) -> str:
    """Per setting and sample: TF-IDF, then the probe per layer (mean / max) and all layers."""
    lines = [f"Linear probe (standardise + logistic regression, C = 1) on the states of "
             f"ced-small, test accuracy %; `{doc['command']}`. Layer -1: the byte embeddings; "
             f"0-{doc['routing_layer']} the encoder (the routers read layer "
             f"{doc['routing_layer']}, its output; the decoder layers above it carry the "
             "adapters). TF-IDF: the baseline on the same rows (data/routers/baselines.json).",
             ""]
    groups = dict.fromkeys((c["setting"], c["sample"]) for c in doc["cells"])
    for setting, sample in groups:
        cells = [c for c in doc["cells"] if (c["setting"], c["sample"]) == (setting, sample)]
        tfidf = doc["tfidf"].get(f"{setting}|{sample}")
        lines += [f"**{setting}**, {sample} ({cells[0]['num_train']:,} training rows, "
                  f"{cells[0]['num_test']} test; TF-IDF "
                  + (f"{100 * tfidf:.1f}" if tfidf is not None else "-") + ")", "",
                  "| layer | mean | max |", "|---|---|---|"]
        for layer in dict.fromkeys(c["layer"] for c in cells if c["layer"] != "all"):
            by = {c["pooling"]: c["accuracy"] for c in cells if c["layer"] == layer}
            lines.append(f"| {layer} | {100 * by['mean']:.1f} | {100 * by['max']:.1f} |")
        every = [c["accuracy"] for c in cells if c["layer"] == "all"]
        lines += ["", f"Every layer side by side, mean + max: {100 * every[0]:.1f}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["domains4", "clinc_domains10"])
    parser.add_argument("--samples", nargs="+", choices=tuple(SAMPLES), default=["heads"],
                        help="training rows: the routers' heads rows, and/or the whole split")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--baselines", type=Path, default=BASELINES_FILE)
    parser.add_argument("--model", type=Path, default=None,
                        help="the CED model's folder (default: engine_ext.train's)")
    args = parser.parse_args(argv)
    from engine_ext.ced.engine import CEDEngine
    from engine_ext.data import default_text_dir
    from engine_ext.routers.settings import load_settings
    from engine_ext.train import DEFAULT_OUT, load_base

    torch.set_num_threads(1)
    folder = args.model or DEFAULT_OUT
    engine = CEDEngine(load_base(folder))
    stat = (folder / "model.safetensors").stat()
    stamp = f"ced:{stat.st_size}:{stat.st_mtime_ns}"
    command = ("python -m engine_ext.routers.ced_probe " + shlex.join(
        sys.argv[1:] if argv is None else argv)).strip()
    cells, options, tfidf = [], {}, {}
    refs = json.loads(args.baselines.read_text())["rows"]
    for sample in args.samples:
        sets = load_settings(default_text_dir(), SAMPLES[sample])
        for name in args.settings:
            if sample == "full" and name == "domains4":
                continue  # one sample of domains4: its 100 rows per domain
            routing_set = sets[name]
            options[name] = len(routing_set.options)
            train = cached_pooled(engine, routing_set.train.texts, stamp, CACHE)
            test = cached_pooled(engine, routing_set.test.texts, stamp, CACHE)
            cells += probe_cells(train, test, routing_set, sample)
            tfidf.update({f"{name}|{sample}": r["accuracy"] for r in refs
                          if (r["method"], r["setting"], r["sample"])
                          == ("tfidf_logreg", name, sample)})
            print(f"ced probe {name} {sample}: " + ", ".join(
                f"L{c['layer']} {c['pooling']} {100 * c['accuracy']:.1f}" for c in cells
                if (c["setting"], c["sample"]) == (name, sample)), flush=True)
    layer = engine.model.config.first_decoder_layer - 1
    doc = {"command": command, "routing_layer": layer, "tfidf": tfidf, "cells": cells}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(doc))
    merge_baselines(args.baselines, baseline_rows(cells, layer), options, command)
    print(f"wrote {args.out}, {args.out.with_suffix('.md')} and {args.baselines}")


if __name__ == "__main__":
    main()
