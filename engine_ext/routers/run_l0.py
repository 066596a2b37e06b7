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
    prefix_cache,
    request_lowers,
    route_prompts,
    time_decision,
    train_l0,
)
from engine_ext.routers.measure import measure, setting_result
from engine_ext.routers.settings import short_names, subsample
from engine_ext.train_smollm2 import BASE_MODEL, top_layers_spec
from sim.strategies.router_card import DecisionWork, SettingResult

NUM_LAYERS, RANK = 4, 8
"""LoRA on every linear of layers 26-29: above the routing layer k = 25."""
STEPS, BATCH, LR = 30, 8, 3e-3
"""30 steps of 8: 240 label samples, what this shared CPU affords per setting and seed."""
MAX_TRAIN, MAX_TEST = STEPS * BATCH, 60
"""Training and test samples per setting: a seeded subsample of the split beyond these."""
EVAL_NAME = "l0"


def l0_spec(num_hidden_layers: int):
    """The L0 adapter's placement (the same as the domain adapters of train_smollm2)."""
    return top_layers_spec(num_hidden_layers, NUM_LAYERS, RANK, BASE_MODEL)


def l0_setting(engine, tokenizer, routing_set: RoutingSet, seeds: list[int],
               adapters_dir: Path) -> tuple[SettingResult, int]:
    """Train L0 per seed over the cached option-list prefix, decode the test labels, time seed
    0's. Returns the card row and the LoRA's parameter count."""
    names = short_names(routing_set)
    train_texts, train_labels = subsample(routing_set.train, MAX_TRAIN)
    test_texts, test_labels = subsample(routing_set.test, MAX_TEST)
    train_prompts = route_prompts(tokenizer, names, train_texts, train_labels)
    test_prompts = route_prompts(tokenizer, names, test_texts, test_labels)
    start = time.perf_counter()
    prefix = prefix_cache(engine, train_prompts.prefix)
    lower = lower_states(engine, prefix, train_prompts)
    lowers = request_lowers(engine, prefix, test_prompts)
    print(f"l0 {routing_set.name}: prefix of {len(train_prompts.prefix)} tokens, lower states "
          f"of {len(train_texts)} + {len(test_texts)} in {time.perf_counter() - start:.0f}s",
          flush=True)
    spec = l0_spec(len(engine.layers))
    accs, seconds = [], []
    for seed in seeds:
        start = time.perf_counter()
        weights, losses = train_l0(engine, spec, prefix, lower, steps=STEPS, batch=BATCH, lr=LR,
                                   seed=seed)
        seconds.append(time.perf_counter() - start)
        engine.add_adapter(EVAL_NAME, weights)
        try:
            accs.append(l0_accuracy(engine, tokenizer, EVAL_NAME, prefix, lowers, names,
                                    test_labels))
            if seed == seeds[0]:
                num_params = sum(a.numel() + b.numel() for a, b in weights.tensors.values())
                save_peft_adapter(weights, adapters_dir / f"l0_{routing_set.name}")
                decision = measure(lambda i, b: time_decision(engine, tokenizer, EVAL_NAME,
                                                              prefix, test_prompts, i, b), 30,
                                   f"prefill of the request part of the route prompt under L0 "
                                   f"(every layer) over the option list's cached prefix KV "
                                   f"({len(test_prompts.prefix)} tokens, prefilled once per "
                                   "option set) + greedy decode of the label up to the newline")
        finally:
            engine.registry.remove(EVAL_NAME)
        print(f"l0 {routing_set.name} seed {seed}: loss {losses[0]:.3f}->"
              f"{statistics.fmean(losses[-10:]):.3f} accuracy {accs[-1]:.4f} "
              f"({seconds[-1]:.0f}s)", flush=True)
    work = DecisionWork(
        num_prefill_tokens=round(statistics.fmean(len(r) for r in test_prompts.requests)),
        num_decode_tokens=round(statistics.fmean(len(t) for t in test_prompts.targets)),
        num_head_params=0, num_cached_prefix_tokens=len(test_prompts.prefix))
    return setting_result(routing_set, len(test_texts), accs, seconds, decision, work), num_params
