"""Contextual MoL over a feature set: the query read as MoL2's feature card reads it, each option
read in the query's context at the feature set's deepest layer L.

In the engine the request's prefill has already run the turn through layers 0..L: the query's
features (the spec's layers side by side, mean and max over the turn, `layer_cache.FeatureSpec`)
cost nothing more, and the turn's KV of layers 0..L is in the cache. The decision is one
temporary pass of the option names (one sequence, in a fixed order) over that KV through layers
0..L, on a branch of the cache that is dropped afterwards (`option_pass`): the options are read
in this query's context, as Contextual MoL reads them, but the turn is not re-encoded and the
pass stops at L (8 on SmolLM2) instead of the routing layer 25. Each option's state is the mean
of its layer-L states; the q/k head (`routing.ContextualHead` with its own option width) scores
the query's features against them.

Training reads the same numbers from one pass over turn + options per query
(`contextual.one_pass`): the model is causal, so the turn's states do not depend on the options
after it (they equal the layer cache's query-alone features) and the options' states equal the
branch pass over the turn's KV (tests/engine_ext/test_contextual_features.py checks both).
The pass over every training query is this router's training cost; the states are cached on
disk in chunks (an interrupted pass resumes at the next chunk).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch

from engine_ext.decoder_only import DecoderCache
from engine_ext.routers.contextual import one_pass
from engine_ext.routers.layer_cache import FeatureSpec, all_layer_states, query_from_states
from engine_ext.routing import pad_token_lists

FEATURE_CACHE = Path(".cache/engine_ext/routers/contextual_features")
"""The feature-set pass's states (chunks) and, under heads/, the seed-0 heads."""
STAMP = "smollm2-135m-instruct"
"""The model's part of the pass cache's keys."""

CHUNK = 500
"""Queries per cache file (what an interrupted pass loses at most)."""


def _reduce(h: torch.Tensor, pooling: str) -> torch.Tensor:
    """h [T, D] of one span -> [D]."""
    return {"mean": lambda: h.mean(0), "max": lambda: h.amax(0), "last": lambda: h[-1]}[pooling]()


@torch.no_grad()
def pass_features(engine, queries: list[list[int]], options: list[list[int]], spec: FeatureSpec,
                  batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Query features [N, Dq] (the spec's order, as `layer_cache.features`) and each option's
    mean layer-L state read after the query [N, O, D], from one pass per query."""
    built = [one_pass(q, options) for q in queries]
    order = sorted(range(len(built)), key=lambda i: len(built[i][0]))
    rows = [layer + 1 for layer in spec.layers]
    found_q: list[torch.Tensor | None] = [None] * len(built)
    found_o: list[torch.Tensor | None] = [None] * len(built)
    for start in range(0, len(order), batch):
        pick = order[start : start + batch]
        tokens, _ = pad_token_lists([built[i][0] for i in pick])
        states = all_layer_states(engine, tokens, spec.route_layer + 1)  # each [B, T, D]
        top = states[spec.route_layer + 1]
        for row, i in enumerate(pick):
            spans = built[i][1]
            a, z = spans[0]
            found_q[i] = torch.cat([_reduce(states[r][row, a:z], p)
                                    for p in spec.poolings for r in rows])
            found_o[i] = torch.stack([top[row, s:e].mean(0) for s, e in spans[1:]])
    return torch.stack(found_q), torch.stack(found_o)


def _digest(stamp: str, spec: FeatureSpec, options: list[list[int]], queries) -> str:
    digest = hashlib.sha256(f"{stamp}|ctx-features|v1|{spec.label}".encode())
    digest.update(repr(options).encode())
    for q in queries:
        digest.update(repr(q).encode() + b"\x1f")
    return digest.hexdigest()[:20]


def cached_pass_features(engine, queries: list[list[int]], options: list[list[int]],
                         spec: FeatureSpec, folder: Path | None, stamp: str,
                         log=print) -> tuple[torch.Tensor, torch.Tensor]:
    """`pass_features`, in chunks of CHUNK queries read from / written to `folder`."""
    parts = []
    for start in range(0, len(queries), CHUNK):
        began = time.perf_counter()
        chunk = queries[start : start + CHUNK]
        key = _digest(stamp, spec, options, chunk)
        path = None if folder is None else folder / f"ctxf_{key}.pt"
        if path is not None and path.exists():
            parts.append(torch.load(path))
            continue
        parts.append(pass_features(engine, chunk, options, spec))
        if path is not None:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes may write the same chunk
            torch.save(parts[-1], tmp)
            tmp.replace(path)
        log(f"contextual features: {start + len(chunk)}/{len(queries)} queries "
            f"({time.perf_counter() - began:.0f}s this chunk)", flush=True)
    return torch.cat([q for q, _ in parts]), torch.cat([o for _, o in parts])


@torch.no_grad()
def query_prefill(engine, ids: list[int], spec: FeatureSpec, batch: int = 1
                  ) -> tuple[DecoderCache, torch.Tensor]:
    """What the engine's prefill of a turn leaves (not part of the decision): the KV of layers
    0..L in a cache and the spec's query features [batch, Dq] (`batch` copies of the turn)."""
    tokens = torch.tensor([ids] * batch)
    cache, positions = engine.new_cache(batch), torch.arange(len(ids))
    h = engine.hf.model.embed_tokens(tokens)  # [B, T, D]
    found = [h]
    for idx in range(spec.route_layer + 1):
        h = engine._run_layers(h, cache, idx, idx + 1, positions)
        found.append(h)
    cache.tokens = tokens
    return cache, query_from_states(found, spec)


@torch.no_grad()
def option_pass(engine, cache: DecoderCache, options: list[list[int]], layer: int
                ) -> torch.Tensor:
    """The decision's temporary pass: every option name, in order, after the turn whose KV
    `cache` holds, through layers 0..layer on a branch of the cache (the cache is left as it
    was) -> each option's mean layer state [B, O, D]."""
    seq, spans = one_pass([], options)
    branch = DecoderCache(kv=list(cache.kv), tokens=cache.tokens)
    b, p0 = cache.tokens.shape[0], cache.num_positions
    tokens = torch.tensor([seq]).expand(b, -1)
    h = engine._run_layers(engine.hf.model.embed_tokens(tokens), branch, 0, layer + 1,
                           torch.arange(p0, p0 + len(seq)))  # [B, T_options, D]
    return torch.stack([h[:, a:z].mean(1) for a, z in spans[1:]], dim=1)


def main(argv: list[str] | None = None) -> None:
    """Fill the pass cache of settings without training (a long pass run in the background
    on its own; the training run then reads every chunk from the cache)."""
    import argparse

    from engine_ext.data import default_text_dir
    from engine_ext.routers.layer_cache import FeatureSpec
    from engine_ext.routers.settings import load_settings, short_names
    from engine_ext.routers.states import load_route_engine, turn_ids

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", required=True)
    parser.add_argument("--feature-layers", type=int, nargs="+", required=True)
    parser.add_argument("--feature-poolings", nargs="+", default=["mean"])
    parser.add_argument("--train-per-class", type=int, default=None)
    parser.add_argument("--val-per-class", type=int, default=None)
    parser.add_argument("--splits", nargs="+", choices=SPLITS, default=["train", "test"],
                        help="the splits to pass, in this order (test and validation first "
                             "make a partial pass usable)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=FEATURE_CACHE)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sets = load_settings(default_text_dir(), args.train_per_class, args.val_per_class)
    spec = FeatureSpec(tuple(args.feature_layers), tuple(args.feature_poolings))
    engine, tokenizer = load_route_engine()
    for name in args.settings:
        fill_pass_cache(engine, lambda t: turn_ids(tokenizer, t), sets[name],
                        short_names(sets[name]), spec, args.cache, STAMP, splits=args.splits)


SPLITS = ("train", "val", "test")


def fill_pass_cache(engine, tokenize, routing_set, names, spec: FeatureSpec, folder: Path,
                    stamp: str, log=print, splits=("train", "test")) -> None:
    """The pass over a setting's `splits` (in that order), into `folder` (what the training
    run then reads without running the model)."""
    options = [tokenize(" " + n) for n in names]
    log(f"{routing_set.name}: {len(options)} options, {sum(len(o) for o in options)} option "
        "tokens per query", flush=True)
    for split in splits:
        log(f"{routing_set.name} {split}: {len(routing_set.split(split))} queries", flush=True)
        cached_pass_features(engine, [tokenize(t) for t in routing_set.split(split).texts],
                             options, spec, folder, stamp, log=log)


if __name__ == "__main__":
    main()
