"""Contextual MoL on SmolLM2's layer k and on the CED model's H19 (its last encoder layer)."""

from __future__ import annotations

import hashlib
import time
from itertools import product
from pathlib import Path

import torch

from engine_ext.routers.backbones import Backbone
from engine_ext.routers.contextual import (
    cached_contextual_states,
    contextual_accuracy,
    time_decision,
    train_contextual,
)
from engine_ext.routers.contextual_features import FEATURE_CACHE, STAMP
from engine_ext.routers.datasets import RoutingSet
from engine_ext.routers.measure import measure, setting_result
from engine_ext.routers.mol2 import num_params
from engine_ext.routers.settings import short_names, subsample
from engine_ext.routing import ContextualHead
from sim.strategies.router_card import DecisionWork, SettingResult

STEPS = 300
D_HEAD = 64
MAX_QUERIES = {"train": 300, "test": 300}
MAX_QUERIES_MANY = {"train": 120, "test": 120}
"""Training and test queries per setting, a seeded subsample of the split (`subsample`): the
pass over every option, per query, is this router's cost and cannot be cached (the options are
read in the query's context), so settings with more than 10 options get fewer."""
TIMED_MANY = {"num_timed": 5, "num_batches": 1, "batch_size": 4}
"""Decisions timed beyond 10 options (5 at batch 1, one batch of 4): each is a pass over 77-150
option names; below, measure's defaults."""


def _states(backbone: Backbone, texts: tuple[str, ...], names: tuple[str, ...]):
    digest = hashlib.sha256(f"{backbone.stamp}|{backbone.layer}|".encode())
    digest.update("\x1f".join(names + texts).encode())
    path = backbone.cache_dir / f"ctx_{digest.hexdigest()[:20]}.pt"
    options = [backbone.tokenize(" " + n) for n in names]
    return cached_contextual_states(backbone.state_fn, [backbone.tokenize(t) for t in texts],
                                    options, path)


def contextual_setting(backbone: Backbone, routing_set: RoutingSet, seeds: list[int]
                       ) -> SettingResult:
    """Heads per seed on the cached states; the decision timed on seed 0's head."""
    names = short_names(routing_set)
    many = len(names) > 10
    cap = MAX_QUERIES_MANY if many else MAX_QUERIES
    train_texts, train_labels = subsample(routing_set.train, cap["train"])
    test_texts, test_labels = subsample(routing_set.test, cap["test"])
    start = time.perf_counter()
    tq, to = _states(backbone, train_texts, names)
    eq, eo = _states(backbone, test_texts, names)
    print(f"contextual {backbone.name} {routing_set.name}: states of {len(train_texts)} + "
          f"{len(test_texts)} queries in {time.perf_counter() - start:.0f}s", flush=True)
    ty, ey = torch.tensor(train_labels), torch.tensor(test_labels)
    heads, accs, seconds = [], [], []
    for seed in seeds:
        start = time.perf_counter()
        torch.manual_seed(seed)
        head = ContextualHead(backbone.d_model, D_HEAD)
        train_contextual(head, tq, to, ty, steps=STEPS, seed=seed)
        seconds.append(time.perf_counter() - start)
        heads.append(head)
        accs.append(contextual_accuracy(head, eq, eo, ey))
    print(f"contextual {backbone.name} {routing_set.name}: {[round(a, 4) for a in accs]}",
          flush=True)
    options = [backbone.tokenize(" " + n) for n in names]
    queries = [backbone.tokenize(t) for t in test_texts[:30]]
    with torch.no_grad():
        decision = measure(lambda i, b: time_decision(backbone.state_fn, heads[0], queries[i],
                                                      options, b), len(queries),
                           "one pass over the user turn and every option description to the "
                           "routing layer + q/k head", **(TIMED_MANY if many else {}))
    work = DecisionWork(num_prefill_tokens=round(sum(len(q) for q in queries) / len(queries)
                                                 + sum(len(o) for o in options)),
                        num_decode_tokens=0, num_head_params=num_params(heads[0]),
                        num_tokens_per_option=sum(len(o) for o in options) / len(options))
    return setting_result(routing_set, len(test_texts), accs, seconds, decision, work)


FEATURE_GRID = {"epochs": (3, 10), "weight_decay": (0.01, 0.3, 3.0), "query_term": (False,)}
"""Training lengths (epochs of 64-query batches), AdamW weight decays and whether the head has
a query-only term (`ContextualHead(num_options=...)`) tried for the feature-set head; seed 0 on
the training split less its validation carve chooses one. AdamW's decay is decoupled (weights
shrink by lr x decay per step): 0.01 is next to none over a few thousand steps at lr 2e-3, 3.0
a strong pull towards zero on 6,912 query features."""
VAL_FRACTION = 0.1
"""Share of the training split carved out (seeded) to choose the length and weight decay; the
heads then train on the whole training split."""
BATCH = 64
CHECKS_PER_EPOCH = 1
"""Validation accuracy checks per epoch of each candidate (its curve, in the log and card)."""


def carve(num: int, fraction: float = VAL_FRACTION) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded (SUBSAMPLE_SEED) split of range(num): (fit indices, validation indices)."""
    from engine_ext.routers.settings import SUBSAMPLE_SEED

    perm = torch.randperm(num, generator=torch.Generator().manual_seed(SUBSAMPLE_SEED))
    cut = max(1, round(num * fraction))
    return perm[cut:].sort().values, perm[:cut].sort().values


def _feature_head(tq, to, ty, seed: int, epochs: int, weight_decay: float,
                  query_term: bool = False, on_check=None) -> ContextualHead:
    """One head trained on (tq, to, ty); `on_check(head)` every epoch's worth of steps."""
    torch.manual_seed(seed)
    head = ContextualHead(tq.shape[1], D_HEAD, d_option=to.shape[2],
                          num_options=to.shape[1] if query_term else None)
    steps = max(1, round(epochs * len(ty) / BATCH))
    train_contextual(head, tq, to, ty, steps=steps, batch=BATCH, seed=seed,
                     weight_decay=weight_decay,
                     check_every=max(1, round(len(ty) / BATCH / CHECKS_PER_EPOCH)),
                     on_check=None if on_check is None else lambda step: on_check(head))
    return head


def choose_feature_training(tq, to, ty, grid: dict = FEATURE_GRID) -> tuple[dict, dict, dict]:
    """(epochs, weight decay, query term) with the best validation accuracy of seed 0 trained
    on the rest of the training split (ties: fewer epochs, more decay, no query term); the
    test split is not read. Returns the choice, each candidate's final validation accuracy and
    its curve (the validation accuracy every epoch's worth of steps, rounded)."""
    fit, val = carve(len(ty))
    found, curves = {}, {}
    for key in product(grid["epochs"], grid["weight_decay"], grid.get("query_term", (False,))):
        curve = curves.setdefault(key, [])
        head = _feature_head(tq[fit], to[fit], ty[fit], 0, *key, on_check=lambda h, c=curve:
                             c.append(round(contextual_accuracy(h, tq[val], to[val], ty[val]),
                                            4)))
        found[key] = contextual_accuracy(head, tq[val], to[val], ty[val])
    best = max(found, key=lambda k: (found[k], -k[0], k[1], not k[2]))
    return ({"epochs": best[0], "weight_decay": best[1], "query_term": best[2],
             "num_val": len(val)}, found, curves)


def contextual_feature_setting(engine, tokenize, routing_set: RoutingSet, seeds: list[int],
                               spec, cache_dir, *, stamp: str, is_timed: bool = False,
                               grid: dict = FEATURE_GRID) -> tuple[SettingResult, list, dict]:
    """Contextual MoL over a feature set (`contextual_features`) on the whole training split:
    length, weight decay and query term chosen on a validation carve, then one head per seed on
    the whole split, tested on the whole test split; the decision timed on seed 0's head when
    `is_timed`. Returns the row, the heads and the choice."""
    from engine_ext.routers.contextual_features import cached_pass_features

    names = short_names(routing_set)
    options = [tokenize(" " + n) for n in names]
    start = time.perf_counter()
    tq, to = cached_pass_features(engine, [tokenize(t) for t in routing_set.train.texts],
                                  options, spec, cache_dir, stamp)
    eq, eo = cached_pass_features(engine, [tokenize(t) for t in routing_set.test.texts],
                                  options, spec, cache_dir, stamp)
    print(f"contextual {spec.label} {routing_set.name}: states of {len(tq)} + {len(eq)} "
          f"queries in {time.perf_counter() - start:.0f}s", flush=True)
    ty, ey = torch.tensor(routing_set.train.labels), torch.tensor(routing_set.test.labels)
    if grid.get("validation") == "split":
        from engine_ext.routers.contextual_start import split_heads

        vq, vo = cached_pass_features(engine, [tokenize(t) for t in routing_set.val.texts],
                                      options, spec, cache_dir, stamp)
        heads, seconds, text = split_heads((tq, to, ty),
                                           (vq, vo, torch.tensor(routing_set.val.labels)),
                                           seeds, grid)
        accs = [contextual_accuracy(h, eq, eo, ey) for h in heads]
        print(f"contextual {spec.label} {routing_set.name}: {text}; test accuracy per seed "
              f"{[round(a, 4) for a in accs]}", flush=True)
        choice = {"text": text, "num_val": len(vq)}
    else:
        heads, seconds, accs, choice = _carve_heads(tq, to, ty, eq, eo, ey, seeds, grid)
        print(f"contextual {spec.label} {routing_set.name}: chose {choice}; test accuracy per "
              f"seed {[round(a, 4) for a in accs]}", flush=True)
    decision = time_feature_decisions(engine, heads[0], spec, routing_set, tokenize) \
        if is_timed else None
    work = DecisionWork(num_prefill_tokens=sum(len(o) for o in options), num_decode_tokens=0,
                        num_head_params=num_params(heads[0]),
                        num_tokens_per_option=sum(len(o) for o in options) / len(options))
    row = setting_result(routing_set, len(ey), accs, seconds, decision, work)
    return row, heads, choice


def _carve_heads(tq, to, ty, eq, eo, ey, seeds, grid):
    """Length, decay and query term chosen on the carve, then one head per seed on the whole
    training split: (heads, seconds, test accuracies, choice)."""
    choice, val, curves = choose_feature_training(tq, to, ty, grid)
    heads, accs, seconds = [], [], []
    for seed in seeds:
        start = time.perf_counter()
        heads.append(_feature_head(tq, to, ty, seed, choice["epochs"], choice["weight_decay"],
                                   choice["query_term"]))
        seconds.append(time.perf_counter() - start)
        accs.append(contextual_accuracy(heads[-1], eq, eo, ey))
    return heads, seconds, accs, choice | {"validation": val, "curves": curves}


def time_feature_decisions(engine, head: ContextualHead, spec, routing_set: RoutingSet,
                           tokenize):
    """The in-engine decision on 30 test turns: the option pass over the turn's KV to layer L
    and the head (the turn's prefill, which the engine runs anyway, is not timed)."""
    from engine_ext.routers.contextual_features import option_pass, query_prefill

    options = [tokenize(" " + n) for n in short_names(routing_set)]
    turns = [tokenize(t) for t in routing_set.test.texts[:30]]
    many = len(options) > 10
    batch_size = TIMED_MANY["batch_size"] if many else 16
    prefilled = {(i, b): query_prefill(engine, turns[i], spec, b)
                 for i in range(len(turns)) for b in (1, batch_size)}

    def one(i: int, batch: int) -> float:
        cache, query = prefilled[(i, batch)]
        start = time.perf_counter()
        head(query, option_pass(engine, cache, options, spec.route_layer)).argmax(-1)
        return time.perf_counter() - start

    with torch.no_grad():
        return measure(one, len(turns), f"the {spec.label} query features the request's "
                       f"prefill already computed + a temporary pass of every option name over "
                       f"the turn's KV to layer {spec.route_layer} + q/k head",
                       **(TIMED_MANY if many else {}))


def feature_card_name(spec) -> str:
    """contextual-smollm2-l8-x6-mean-max for six layers up to 8, mean and max pooled."""
    return f"contextual-smollm2-l{spec.route_layer}-x{len(spec.layers)}-" + "-".join(spec.poolings)


def head_file(heads_dir: Path, card_name: str, setting: str) -> Path:
    """Where seed 0's head of a setting is kept (the timing-only run reads it)."""
    return heads_dir / f"{card_name}_{setting}.safetensors"




def run_feature_card(args, sets, engine, tokenize, write_card,
                     cache_dir: Path | None = None, grid: dict = FEATURE_GRID) -> None:
    """Contextual MoL on SmolLM2 over --feature-layers / --feature-poolings: every setting of
    args.settings, seed 0's head kept for the timing-only run, one card (`write_card`:
    train._card)."""
    from safetensors.torch import save_file

    from engine_ext.routers.layer_cache import FeatureSpec

    spec = FeatureSpec(tuple(args.feature_layers), tuple(args.feature_poolings))
    name, rows, how = feature_card_name(spec), [], []
    cache_dir = cache_dir or FEATURE_CACHE
    args = kept_hardware(args, args.cards / f"{name}.json")
    for setting in args.settings:
        row, heads, choice = contextual_feature_setting(
            engine, tokenize, sets[setting], args.seeds, spec, cache_dir,
            stamp=STAMP, is_timed=not args.untimed, grid=grid)
        path = head_file(cache_dir / "heads", name, setting)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in heads[0].state_dict().items()}, str(path))
        rows.append(row)
        how.append(_setting_text(setting, len(sets[setting].train), choice))
    head_text = (f"q/k head d_head {D_HEAD}; query: the feature set {spec.label} (pooled states "
                 "of those layers side by side, L-1 the token embeddings), standardised per "
                 f"feature; options: each option name's mean layer-{spec.route_layer} state read "
                 "after the query (one pass of every option name over the turn's KV); ")
    write_card(name, "contextual_mol", "smollm2-135m", spec.route_layer,
               rows[0].work.num_head_params, args, rows,
               head_text + (_split_text(grid) if grid.get("validation") == "split" else
                            _carve_text(grid)) + "; ".join(how)
               + ("; decision times pending (not timed on a loaded machine: "
                  "python -m engine_ext.routers.contextual_timing --time-card CARD)"
                  if args.untimed else ""),
               [sets[n] for n in args.settings])


def _carve_text(grid: dict) -> str:
    return ("AdamW lr 2e-3 one-cycle; length, weight decay and query-only term (a linear map "
            "of the standardised query features to one logit per option, added to the q/k "
            f"score) chosen among {grid} by seed 0's accuracy on a seeded {VAL_FRACTION:.0%} "
            "validation carve of the training split (the test split is not read), then trained "
            "on the whole training split: ")


def _split_text(grid: dict) -> str:
    return ("a query-only term (a linear map of the standardised query features to one logit "
            "per option, added to the q/k score); AdamW one-cycle, batches of 64; chosen on the "
            "setting's validation split (CLINC150's own, BANKING77's every 10th training row; "
            "the test split is not read) among "
            + str({k: v for k, v in grid.items() if k != "validation"})
            + ", each seed keeping its state of best validation accuracy (contextual_start): ")


def _setting_text(setting: str, num: int, choice: dict) -> str:
    """How one setting's heads were trained and chosen."""
    if "text" in choice:
        return (f"{setting} {num} training queries, validation {choice['num_val']} queries, "
                + choice["text"])
    steps = max(1, round(choice["epochs"] * num / BATCH))
    return (f"{setting} {num} training queries, {steps} steps of {BATCH} "
            f"({choice['epochs']} epochs), weight decay {choice['weight_decay']}"
            + (", query-only term" if choice["query_term"] else "")
            + f" ({candidates_text(choice)})")


def kept_hardware(args, card_path: Path):
    """args with the card's hardware when an untimed run leaves some of its timed rows in it
    (their decision times stay with the machine that measured them)."""
    from copy import copy

    from sim.strategies.router_card import load_router_card

    if not args.untimed or not card_path.exists():
        return args
    card = load_router_card(card_path)
    if not any(r.decision is not None and r.setting not in args.settings for r in card.settings):
        return args
    args = copy(args)
    args.hardware = card.hardware
    return args


def candidates_text(choice: dict) -> str:
    """Each candidate's validation accuracy and curve (a check every epoch's worth of steps,
    rounded), in percent."""
    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    return f"validation on {choice['num_val']} carved rows, (epochs, decay, query term): " + \
        "; ".join(f"{key} {pct(acc)}% [{' '.join(pct(x) for x in choice['curves'][key])}]"
                  for key, acc in choice["validation"].items())
