"""The linear probe on the CED model's layer states (issue 26, the CED model).

The CED routers (MoL2, Contextual MoL) read the encoder output, the "H19" of the layout. Whether
that state carries the routing label at all is what the probe says: the same probe as the
SmolLM2 rows (`baselines.create_probe`: standardise, logistic regression, C = 1), fitted on the
pooled output of every layer a router can read (-1: the token embeddings, 0..E-1 the encoder;
the decoder layers above carry the adapters), mean and max over the turn's tokens, on all of
them side by side and, where the encoder has them, on layers -1,0,2,4,6,8 side by side (the
feature set the SmolLM2 routers read), trained on the setting's training rows and scored on
its test rows (the rows of the TF-IDF baseline in `data/routers/baselines.json`). Two models:

* `small`: ced-small (byte-level, 8 layers, trained here by `engine_ext.train`; layer 3);
* `smollm2_ced`: the CED model whose encoder is SmolLM2-135M's layers 0-8
  (`engine_ext.ced.from_smollm2`; its tokenizer; layer 8).

    MOLCAP_DATA_DIR=... python -m engine_ext.routers.ced_probe [--model small|smollm2_ced]
        [--settings domains4 ...] [--samples heads full]

Writes docs/router_ced_probe.{json,md} (one run per model; the other models' runs are kept
from the file) and adds the probe of the routers' layer and of the best layer (mean-pooled,
the routers' training rows) to data/routers/baselines.json, which the router table reads. The
states come from the routers' own routing pass per text (the encoder alone, chunked), read at
each layer's input by forward pre-hooks, and are cached per text outside the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
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
MODELS = {"small": "ced-small", "smollm2_ced": "smollm2_ced"}
"""--model choice -> the model's name in the tables and the baselines' method names."""
ROUTER_FEATURES = (-1, 0, 2, 4, 6, 8)
"""The layers the SmolLM2 routers read side by side (docs/routers.md, "L-1,0,2,4,6,8 mean+max");
probed where the encoder has them."""
CHUNK = 500
"""Texts per cache file (what an interrupted state pass loses at most)."""


@torch.no_grad()
def ced_layer_states(engine, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The token embeddings and the output of every encoder layer over tokens [B, T]: a list of
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
    """{"mean", "max"}: [L + 1, N, D] pooled over each text's real tokens (right padding is
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


def _cache_index(folder: Path, prefix: str) -> dict[str, tuple[Path, int]]:
    index: dict[str, tuple[Path, int]] = {}
    for path in sorted(folder.glob(f"{prefix}_*.npz")) if folder.exists() else []:
        with np.load(path) as f:
            for row, text in enumerate(f["texts"].tolist()):
                index.setdefault(text, (path, row))
    return index


def cached_pooled(engine, texts, stamp: str, cache: Path | None, tokenize=None,
                  log=print) -> dict[str, np.ndarray]:
    """`pooled_layers` of the texts (`tokenize`: text -> ids, default the bytes), cached per
    text under `cache` in files of CHUNK texts, keyed by the model's `stamp` (a text already
    computed for another split is read back; an interrupted pass resumes at its next chunk)."""
    if tokenize is None:
        from engine_ext.data import encode as tokenize
    if cache is None:
        return pooled_layers(engine, [tokenize(t) for t in texts])
    prefix = "ced_" + hashlib.sha256(f"{stamp}|ced-layers|v2".encode()).hexdigest()[:12]
    index = _cache_index(cache, prefix)
    todo = list(dict.fromkeys(t for t in texts if t not in index))
    for start in range(0, len(todo), CHUNK):
        part = todo[start : start + CHUNK]
        found = pooled_layers(engine, [tokenize(t) for t in part])
        digest = hashlib.sha256("\x1f".join(part).encode()).hexdigest()[:16]
        path = cache / f"{prefix}_{digest}.npz"
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"tmp_{os.getpid()}_{path.name}")  # not matched by the glob
        np.savez(tmp, texts=np.array(part), **found)
        tmp.replace(path)
        index.update({t: (path, row) for row, t in enumerate(part)})
        log(f"ced states: {start + len(part)}/{len(todo)} texts", flush=True)
    out: dict[str, np.ndarray] = {}
    for path in dict.fromkeys(index[t][0] for t in texts):
        rows = [(i, index[t][1]) for i, t in enumerate(texts) if index[t][0] == path]
        with np.load(path) as f:
            for name in ("mean", "max"):
                block = f[name]
                if name not in out:
                    out[name] = np.empty((block.shape[0], len(texts), block.shape[2]),
                                         np.float32)
                out[name][:, [i for i, _ in rows]] = block[:, [r for _, r in rows]]
    return out


def _probe(train_x, train_y, test_x, test_y) -> float:
    model = create_probe().fit(train_x, np.asarray(train_y))
    return float((model.predict(test_x) == np.asarray(test_y)).mean())


def side_by_side(found: dict, layers: list[int]) -> np.ndarray:
    """The layers' (-1: the embeddings) mean and max side by side: [N, 2 * len(layers) * D]."""
    rows = [layer + 1 for layer in layers]
    return np.concatenate([found[p][rows].transpose(1, 0, 2).reshape(found[p].shape[1], -1)
                           for p in ("mean", "max")], axis=1)


def probe_cells(train: dict, test: dict, routing_set, sample: str) -> list[dict]:
    """The probe on every layer (mean and max), on all layers side by side (mean + max) and,
    where the encoder has them, on ROUTER_FEATURES side by side (mean + max)."""
    y, ty = routing_set.train.labels, routing_set.test.labels
    cells = []
    for pooling in ("mean", "max"):
        for row in range(train[pooling].shape[0]):
            cells.append({"layer": row - 1, "pooling": pooling,
                          "accuracy": _probe(train[pooling][row], y, test[pooling][row], ty)})
    every = list(range(-1, train["mean"].shape[0] - 1))
    sets = {"all": every}
    if set(ROUTER_FEATURES) <= set(every):
        sets["L" + ",".join(map(str, ROUTER_FEATURES))] = list(ROUTER_FEATURES)
    for label, layers in sets.items():
        cells.append({"layer": label, "pooling": "mean+max", "accuracy": _probe(
            side_by_side(train, layers), y, side_by_side(test, layers), ty)})
    for cell in cells:
        cell.update(setting=routing_set.name, sample=sample, num_train=len(y), num_test=len(ty))
    return cells


def baseline_rows(cells: list[dict], routing_layer: int, model: str = "ced-small") -> list:
    """Reference rows for the router table: the mean-pooled probe at the routers' layer and
    at the best single layer, on the routers' training rows ('heads'), and the ROUTER_FEATURES
    set where probed, on the most rows it was probed on."""
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
            rows.append(BaselineResult(f"probe_{model}_L{layer}", setting, "heads", 0,
                                       c["num_train"], c["num_test"], c["accuracy"], 0.0))
        for label in dict.fromkeys(c["layer"] for c in cells if str(c["layer"])[0] == "L"):
            # the feature set on the most training rows probed (the whole split if run)
            c = max((c for c in cells if (c["setting"], c["layer"]) == (setting, label)),
                    key=lambda c: c["num_train"])
            rows.append(BaselineResult(f"probe_{model}_{label} mean+max", setting, c["sample"],
                                       0, c["num_train"], c["num_test"], c["accuracy"], 0.0))
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


def _render_run(run: dict) -> list[str]:
    """One model's tables: per setting and sample, TF-IDF, then the probe per layer (mean /
    max) and the layers side by side."""
    name = run.get("model", "ced-small")
    layer = run["routing_layer"]
    unit = "byte" if name == "ced-small" else "token"
    lines = [f"## {name}", "",
             f"Linear probe (standardise + logistic regression, C = 1) on the states of {name}, "
             f"test accuracy %; `{run['command']}`. Layer -1: the {unit} embeddings; 0-{layer} "
             f"the encoder (the routers read layer {layer}, its output; the decoder layers "
             "above it carry the adapters). TF-IDF: the baseline on the same rows "
             "(data/routers/baselines.json).", ""]
    groups = dict.fromkeys((c["setting"], c["sample"]) for c in run["cells"])
    for setting, sample in groups:
        cells = [c for c in run["cells"] if (c["setting"], c["sample"]) == (setting, sample)]
        tfidf = run["tfidf"].get(f"{setting}|{sample}")
        lines += [f"**{setting}**, {sample} ({cells[0]['num_train']:,} training rows, "
                  f"{cells[0]['num_test']} test; TF-IDF "
                  + (f"{100 * tfidf:.1f}" if tfidf is not None else "-") + ")", "",
                  "| layer | mean | max |", "|---|---|---|"]
        single = [c for c in cells if isinstance(c["layer"], int)]
        for layer_id in dict.fromkeys(c["layer"] for c in single):
            by = {c["pooling"]: c["accuracy"] for c in single if c["layer"] == layer_id}
            lines.append(f"| {layer_id} | {100 * by['mean']:.1f} | {100 * by['max']:.1f} |")
        lines.append("")
        for c in cells:
            if c["layer"] == "all":
                lines.append(f"Every layer side by side, mean + max: {100 * c['accuracy']:.1f}")
            elif not isinstance(c["layer"], int):
                lines.append(f"Layers {c['layer'][1:]} side by side, mean + max (the SmolLM2 "
                             f"routers' features): {100 * c['accuracy']:.1f}")
        lines.append("")
    cost = run.get("cost")
    if cost:
        lines += ["Cost (" + ", ".join(f"{k} {v}" for k, v in cost.items()) + ")", ""]
    return lines


def render_markdown(doc: dict) -> str:
    """Every model's run (a document of one run, the older form, is ced-small's)."""
    runs = doc["runs"] if "runs" in doc else {"ced-small": doc}
    lines = ["# The linear probe on the CED models' layer states", "",
             "Generated by `python -m engine_ext.routers.ced_probe` (one run per `--model`).", ""]
    for run in runs.values():
        lines += _render_run(run)
    return "\n".join(lines)


def load_model(model: str, folder: Path | None):
    """(CEDEngine, tokenize, cache stamp) of `model` ('small': from `folder`, default
    engine_ext.train's; 'smollm2_ced': SmolLM2's weights, `from_smollm2`)."""
    from engine_ext.ced.engine import CEDEngine

    if model == "small":
        from engine_ext.data import encode
        from engine_ext.train import DEFAULT_OUT, load_base

        folder = folder or DEFAULT_OUT
        stat = (folder / "model.safetensors").stat()
        return CEDEngine(load_base(folder)), encode, f"ced:{stat.st_size}:{stat.st_mtime_ns}"
    from engine_ext.ced.from_smollm2 import load_smollm2_ced
    from engine_ext.decoder_only import SMOLLM2_GGUF, smollm2_dir
    from engine_ext.routers.states import turn_ids

    ced, tokenizer = load_smollm2_ced(seed=0)
    stat = (smollm2_dir() / SMOLLM2_GGUF).stat()
    stamp = f"smollm2_ced:{stat.st_size}:{stat.st_mtime_ns}:seed0"
    return CEDEngine(ced), lambda t: turn_ids(tokenizer, t), stamp


def _label(layer: int | str) -> str:
    return f"L{layer}" if isinstance(layer, int) else layer


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return round(wall - start[0], 1), round(cpu - start[1], 1)


def run_probe(args, engine, tokenize, stamp: str, refs: list[dict]) -> dict:
    """The probe of every requested setting and sample: {cells, options, tfidf, cost}."""
    from engine_ext.data import default_text_dir
    from engine_ext.routers.settings import load_settings

    cells, options, tfidf, distinct = [], {}, {}, set()
    states, probes = [0.0, 0.0], [0.0, 0.0]
    for sample in args.samples:
        sets = load_settings(default_text_dir(), SAMPLES[sample])
        for name in args.settings:
            if sample == "full" and name == "domains4":
                continue  # one sample of domains4: its 100 rows per domain
            routing_set = sets[name]
            options[name] = len(routing_set.options)
            start = _clock()
            train, test = (cached_pooled(engine, split.texts, stamp, args.cache, tokenize)
                           for split in (routing_set.train, routing_set.test))
            states = [a + b for a, b in zip(states, _since(start), strict=True)]
            distinct.update(routing_set.train.texts + routing_set.test.texts)
            start = _clock()
            found = probe_cells(train, test, routing_set, sample)
            probes = [a + b for a, b in zip(probes, _since(start), strict=True)]
            cells += found
            tfidf.update({f"{name}|{sample}": r["accuracy"] for r in refs
                          if (r["method"], r["setting"], r["sample"])
                          == ("tfidf_logreg", name, sample)})
            print(f"ced probe {name} {sample}: " + ", ".join(
                f"{_label(c['layer'])} {c['pooling']} {100 * c['accuracy']:.1f}" for c in found),
                flush=True)
    cost = {"distinct texts": f"{len(distinct):,}",
            "state pass wall/CPU s": f"{states[0]:.0f} / {states[1]:.0f}",
            "probes wall/CPU s": f"{probes[0]:.0f} / {probes[1]:.0f}"}
    return {"cells": cells, "options": options, "tfidf": tfidf, "cost": cost}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(MODELS), default="small")
    parser.add_argument("--settings", nargs="+", default=["domains4", "clinc_domains10"])
    parser.add_argument("--samples", nargs="+", choices=tuple(SAMPLES), default=["heads"],
                        help="training rows: the routers' heads rows, and/or the whole split")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--baselines", type=Path, default=BASELINES_FILE)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="ced-small's folder (default: engine_ext.train's)")
    parser.add_argument("--cache", type=Path, default=CACHE, help="the per-text state cache")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    name = MODELS[args.model]
    start = _clock()
    engine, tokenize, stamp = load_model(args.model, args.model_dir)
    load = _since(start)
    command = ("python -m engine_ext.routers.ced_probe " + shlex.join(
        sys.argv[1:] if argv is None else argv)).strip()
    refs = json.loads(args.baselines.read_text())["rows"]
    load_before = os.getloadavg()[0]
    found = run_probe(args, engine, tokenize, stamp, refs)
    layer = engine.model.config.first_decoder_layer - 1
    found["cost"] = {"load wall/CPU s": f"{load[0]:.0f} / {load[1]:.0f}", **found["cost"],
                     "load average": f"{load_before:.1f}-{os.getloadavg()[0]:.1f}",
                     "torch threads": 1}
    run = {"model": name, "command": command, "routing_layer": layer, "tfidf": found["tfidf"],
           "cells": found["cells"], "cost": found["cost"]}
    old = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    runs = old["runs"] if "runs" in old else {"ced-small": old | {"model": "ced-small"}}
    doc = {"runs": runs | {name: run}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(doc))
    merge_baselines(args.baselines, baseline_rows(found["cells"], layer, name),
                    found["options"], command)
    print(f"wrote {args.out}, {args.out.with_suffix('.md')} and {args.baselines}")


if __name__ == "__main__":
    main()
