"""MoL L0 on SmolLM2: one label-decoding LoRA per setting and seed, accuracy, timing, card rows."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from engine_ext.peft_io import save_peft_adapter
from engine_ext.routers.datasets import RoutingSet
from engine_ext.routers.l0 import (
    l0_accuracy,
    lower_states,
    prompt_caches,
    route_samples,
    time_decision,
    train_l0,
)
from engine_ext.routers.measure import measure, setting_result
from engine_ext.routers.settings import short_names
from engine_ext.train_smollm2 import BASE_MODEL, top_layers_spec
from planner.router_card import DecisionWork, SettingResult

NUM_LAYERS, RANK = 4, 8
"""LoRA on every linear of layers 26-29: above the routing layer k = 25."""
STEPS, BATCH, LR = 24, 8, 2e-3
MAX_TRAIN, MAX_TEST = 160, 60
EVAL_NAME = "l0"


def l0_spec(num_hidden_layers: int):
    """The L0 adapter's placement (the same as the domain adapters of train_smollm2)."""
    return top_layers_spec(num_hidden_layers, NUM_LAYERS, RANK, BASE_MODEL)


def l0_setting(engine, tokenizer, routing_set: RoutingSet, seeds: list[int],
               adapters_dir: Path) -> tuple[SettingResult, int]:
    """Train L0 per seed on a few hundred samples, decode the test labels, time seed 0's.

    Returns the card row and the LoRA's parameter count."""
    names = short_names(routing_set)
    train, test = routing_set.train, routing_set.test
    n_train, n_test = min(MAX_TRAIN, len(train)), min(MAX_TEST, len(test))
    train_samples = route_samples(tokenizer, names, train.texts[:n_train], train.labels[:n_train])
    test_samples = route_samples(tokenizer, names, test.texts[:n_test], test.labels[:n_test])
    lower = lower_states(engine, train_samples)
    caches = prompt_caches(engine, test_samples)
    spec = l0_spec(len(engine.layers))
    accs, seconds = [], []
    for seed in seeds:
        start = time.perf_counter()
        weights, losses = train_l0(engine, spec, lower, steps=STEPS, batch=BATCH, lr=LR,
                                   seed=seed)
        seconds.append(time.perf_counter() - start)
        engine.add_adapter(EVAL_NAME, weights)
        try:
            accs.append(l0_accuracy(engine, tokenizer, EVAL_NAME, caches, names,
                                    test.labels[:n_test]))
            if seed == seeds[0]:
                num_params = sum(a.numel() + b.numel() for a, b in weights.tensors.values())
                save_peft_adapter(weights, adapters_dir / f"l0_{routing_set.name}")
                decision = measure(lambda i, b: time_decision(engine, tokenizer, EVAL_NAME,
                                                              test_samples[i], b), 30,
                                   "prefill of the route prompt under L0 (every layer) + "
                                   "greedy decode of the label up to the newline")
        finally:
            engine.registry.remove(EVAL_NAME)
        print(f"l0 {routing_set.name} seed {seed}: loss {losses[0]:.3f}->{losses[-1]:.3f} "
              f"accuracy {accs[-1]:.4f} ({seconds[-1]:.0f}s)", flush=True)
    work = DecisionWork(
        num_prefill_tokens=round(statistics.fmean(len(s.prompt) for s in test_samples)),
        num_decode_tokens=round(statistics.fmean(len(s.target) for s in test_samples)),
        num_head_params=0)
    return setting_result(routing_set, n_test, accs, seconds, decision, work), num_params
