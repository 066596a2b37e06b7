"""Contextual MoL on SmolLM2's layer k and on the CED model's H19 (its last encoder layer)."""

from __future__ import annotations

import hashlib
import time

import torch

from engine_ext.routers.backbones import Backbone
from engine_ext.routers.contextual import (
    cached_contextual_states,
    contextual_accuracy,
    time_decision,
    train_contextual,
)
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
