"""Contextual MoL on SmolLM2's layer k and on the CED model's H19 (its last encoder layer)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from engine_ext.data import encode
from engine_ext.routers.contextual import (
    StateFn,
    cached_contextual_states,
    contextual_accuracy,
    time_decision,
    train_contextual,
)
from engine_ext.routers.datasets import RoutingSet
from engine_ext.routers.measure import measure, setting_result
from engine_ext.routers.mol2 import num_params
from engine_ext.routers.settings import short_names
from engine_ext.routers.states import MODEL_NAME, STATE_CACHE, turn_ids
from engine_ext.routing import ContextualHead
from planner.router_card import DecisionWork, SettingResult

STEPS = 300
D_HEAD = 64
MAX_QUERIES, MAX_QUERIES_MANY = 200, 90
"""Training and test queries per setting (each): a pass over every option per query is this
router's cost, so settings with more than 10 options get fewer."""


class Backbone:
    """A frozen model seen as: token ids of text, and padded ids -> routing-layer states."""

    def __init__(self, name: str, tokenize, state_fn: StateFn, d_model: int, layer: int,
                 stamp: str) -> None:
        self.name, self.tokenize, self.state_fn = name, tokenize, state_fn
        self.d_model, self.layer, self.stamp = d_model, layer, stamp


def smollm2_backbone(engine, tokenizer) -> Backbone:
    """SmolLM2 up to layer k (layers above are not run)."""
    def state_fn(tokens: torch.Tensor) -> torch.Tensor:
        return engine.prefill_shared(engine.new_cache(tokens.shape[0]), tokens)

    return Backbone(MODEL_NAME, lambda t: turn_ids(tokenizer, t), state_fn,
                    engine.cfg.hidden_size, engine.route_layer, "smollm2")


def ced_backbone(ced_engine, model_file: Path) -> Backbone:
    """The trained byte-level CED model; states are its encoder output (H19 of the layout)."""
    def state_fn(tokens: torch.Tensor) -> torch.Tensor:
        return ced_engine.prefill(ced_engine.new_state(tokens.shape[0]), tokens,
                                  None).encoder_hidden

    cfg = ced_engine.model.config
    stat = model_file.stat()
    return Backbone("ced-small", encode, state_fn, cfg.d_model, cfg.first_decoder_layer - 1,
                    f"ced:{stat.st_size}:{stat.st_mtime_ns}")


def _states(backbone: Backbone, texts: tuple[str, ...], names: tuple[str, ...]):
    digest = hashlib.sha256(f"{backbone.stamp}|{backbone.layer}|".encode())
    digest.update("\x1f".join(names + texts).encode())
    path = STATE_CACHE / f"ctx_{digest.hexdigest()[:20]}.pt"
    options = [backbone.tokenize(" " + n) for n in names]
    return cached_contextual_states(backbone.state_fn, [backbone.tokenize(t) for t in texts],
                                    options, path)


def contextual_setting(backbone: Backbone, routing_set: RoutingSet, seeds: list[int]
                       ) -> SettingResult:
    """Heads per seed on the cached states; the decision timed on seed 0's head."""
    names = short_names(routing_set)
    train, test = routing_set.train, routing_set.test
    cap = MAX_QUERIES if len(names) <= 10 else MAX_QUERIES_MANY
    n_train, n_test = min(cap, len(train)), min(cap, len(test))
    tq, to = _states(backbone, train.texts[:n_train], names)
    eq, eo = _states(backbone, test.texts[:n_test], names)
    ty, ey = torch.tensor(train.labels[:n_train]), torch.tensor(test.labels[:n_test])
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
    queries = [backbone.tokenize(t) for t in test.texts[:30]]
    with torch.no_grad():
        decision = measure(lambda i, b: time_decision(backbone.state_fn, heads[0], queries[i],
                                                      options, b), len(queries),
                           "one pass over the user turn and every option description to the "
                           "routing layer + q/k head")
    work = DecisionWork(num_prefill_tokens=round(sum(len(q) for q in queries) / len(queries)
                                                 + sum(len(o) for o in options)),
                        num_decode_tokens=0, num_head_params=num_params(heads[0]),
                        num_tokens_per_option=sum(len(o) for o in options) / len(options))
    return setting_result(routing_set, n_test, accs, seconds, decision, work)
