"""MoL L0 on SmolLM2: one label-decoding LoRA per setting and seed, accuracy, timing, card rows."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from engine_ext.peft_io import save_peft_adapter
from engine_ext.routers.datasets import RoutingSet, RoutingSplit
from engine_ext.routers.l0 import (
    Validation,
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
WHOLE_SPLIT_SETTINGS = ("domains4", "clinc_domains10")
"""The settings rebuild trains with the validated recipe (`--l0-epochs`, rebuild.L0_EPOCHS) on
their whole default training split; the others keep the fixed recipe's subsample."""


@dataclass(frozen=True)
class Recipe:
    """L0 on the whole splits it is given (train, validation, test: no subsample), trained up
    to `epochs` epochs (one-cycle over them), each seed keeping its state of best validation
    accuracy, checked every epoch (and before the first); stopped after `patience` checks
    without a gain (0: never)."""

    epochs: int
    lr: float = LR
    batch: int = BATCH
    patience: int = 0

    def steps_per_epoch(self, num_train: int) -> int:
        return -(-num_train // self.batch)


def l0_spec(num_hidden_layers: int):
    """The L0 adapter's placement (the same as the domain adapters of train_smollm2)."""
    return top_layers_spec(num_hidden_layers, NUM_LAYERS, RANK, BASE_MODEL)


def train_rows(routing_set: RoutingSet) -> RoutingSplit:
    """The training rows of the shipped card's row of a setting (default split): the whole
    split for WHOLE_SPLIT_SETTINGS, else the fixed recipe's subsample (the TF-IDF baseline's
    "L0's rows")."""
    if routing_set.name in WHOLE_SPLIT_SETTINGS:
        return routing_set.train
    return RoutingSplit(*subsample(routing_set.train, MAX_TRAIN))


def _samples(routing_set: RoutingSet, whole: bool):
    """Training and test (texts, labels): the whole splits (the validated recipe), or the
    seeded subsamples of the fixed recipe."""
    if whole:
        return ((routing_set.train.texts, routing_set.train.labels),
                (routing_set.test.texts, routing_set.test.labels))
    return subsample(routing_set.train, MAX_TRAIN), subsample(routing_set.test, MAX_TEST)


def _train_seed(engine, spec, prefix, lower, val, recipe: Recipe | None, seed: int):
    """One seed's LoRA: the fixed 30 steps of 8, or the recipe's validated run."""
    if recipe is None:
        return train_l0(engine, spec, prefix, lower, steps=STEPS, batch=BATCH, lr=LR, seed=seed)
    every = recipe.steps_per_epoch(len(lower.tokens))
    return train_l0(engine, spec, prefix, lower, steps=recipe.epochs * every,
                    batch=recipe.batch, lr=recipe.lr, seed=seed,
                    val=Validation(val, every, recipe.patience))


def l0_setting(engine, tokenizer, routing_set: RoutingSet, seeds: list[int],
               adapters_dir: Path, recipe: Recipe | None = None, is_timed: bool = True
               ) -> tuple[SettingResult, int, list[dict]]:
    """Train L0 per seed over the cached option-list prefix, decode the test labels, time seed
    0's (unless not `is_timed`). Returns the card row, the LoRA's parameter count and per seed
    its training curve (loss per epoch, validation accuracy per check, the chosen step)."""
    names = short_names(routing_set)
    (train_texts, train_labels), (test_texts, test_labels) = _samples(routing_set,
                                                                      recipe is not None)
    train_prompts = route_prompts(tokenizer, names, train_texts, train_labels)
    test_prompts = route_prompts(tokenizer, names, test_texts, test_labels)
    start = time.perf_counter()
    prefix = prefix_cache(engine, train_prompts.prefix)
    lower = lower_states(engine, prefix, train_prompts)
    val = None if recipe is None else lower_states(engine, prefix, route_prompts(
        tokenizer, names, routing_set.val.texts, routing_set.val.labels))
    lowers = request_lowers(engine, prefix, test_prompts)
    print(f"l0 {routing_set.name}: prefix of {len(train_prompts.prefix)} tokens, lower states "
          f"of {len(train_texts)} + {0 if val is None else len(val.tokens)} + {len(test_texts)} "
          f"in {time.perf_counter() - start:.0f}s", flush=True)
    spec = l0_spec(len(engine.layers))
    accs, seconds, curves, decision = [], [], [], None
    for seed in seeds:
        start = time.perf_counter()
        weights, losses, checks = _train_seed(engine, spec, prefix, lower, val, recipe, seed)
        seconds.append(time.perf_counter() - start)
        engine.add_adapter(EVAL_NAME, weights)
        try:
            accs.append(l0_accuracy(engine, tokenizer, EVAL_NAME, prefix, lowers, names,
                                    test_labels))
            if seed == seeds[0]:
                num_params = sum(a.numel() + b.numel() for a, b in weights.tensors.values())
                save_peft_adapter(weights, adapters_dir / f"l0_{routing_set.name}")
                if is_timed:
                    decision = time_setting(engine, tokenizer, prefix, test_prompts)
        finally:
            engine.registry.remove(EVAL_NAME)
        curves.append(curve(losses, checks, recipe, len(train_texts)))
        print(f"l0 {routing_set.name} seed {seed}: loss {losses[0]:.3f}->"
              f"{statistics.fmean(losses[-10:]):.3f} accuracy {accs[-1]:.4f} "
              f"({seconds[-1]:.0f}s) {curves[-1]}", flush=True)
    return (setting_result(routing_set, len(test_texts), accs, seconds, decision,
                           decision_work(test_prompts)), num_params, curves)


def curve(losses: list[float], checks: list[tuple[int, float]], recipe: Recipe | None,
          num_train: int) -> dict:
    """A seed's training curve: mean loss per epoch, validation accuracy per check (epochs),
    the epoch whose state was kept."""
    if recipe is None:
        return {"loss_first_last10": [round(losses[0], 3),
                                      round(statistics.fmean(losses[-10:]), 3)]}
    every = recipe.steps_per_epoch(num_train)
    loss = [round(statistics.fmean(losses[i : i + every]), 3)
            for i in range(0, len(losses), every)]
    val = [round(a, 4) for _, a in checks]
    return {"loss_per_epoch": loss, "val_per_epoch": val,
            "chosen_epoch": max(range(len(val)), key=lambda i: (val[i], -i))}


def decision_work(prompts) -> DecisionWork:
    """What one decision prefills and decodes (means over the test prompts)."""
    return DecisionWork(
        num_prefill_tokens=round(statistics.fmean(len(r) for r in prompts.requests)),
        num_decode_tokens=round(statistics.fmean(len(t) for t in prompts.targets)),
        num_head_params=0, num_cached_prefix_tokens=len(prompts.prefix))


def time_setting(engine, tokenizer, prefix, test_prompts):
    """The decision time of the adapter loaded as EVAL_NAME over the first 30 test prompts."""
    return measure(lambda i, b: time_decision(engine, tokenizer, EVAL_NAME, prefix,
                                              test_prompts, i, b), 30,
                   "prefill of the request part of the route prompt under L0 "
                   "(every layer) over the option list's cached prefix KV "
                   f"({len(test_prompts.prefix)} tokens, prefilled once per "
                   "option set) + greedy decode of the label up to the newline")


def add_l0_options(parser) -> None:
    """train's L0 options: the validated recipe (--l0-epochs) instead of the fixed 30 steps."""
    parser.add_argument("--l0-epochs", type=int, default=0, metavar="MAX",
                        help="L0: train on the whole training split (no subsample) for at most "
                             "MAX epochs, each seed keeping its state of best validation "
                             "accuracy (checked every epoch); test on the whole test split")
    parser.add_argument("--l0-patience", type=int, default=0,
                        help="with --l0-epochs: stop after this many checks without a gain")
    parser.add_argument("--l0-lr", type=float, default=LR, help="with --l0-epochs: peak lr")


def recipe_of(args) -> Recipe | None:
    """The validated recipe of --l0-epochs, or None (the fixed 30 steps of 8)."""
    if not getattr(args, "l0_epochs", 0):
        return None
    return Recipe(args.l0_epochs, lr=args.l0_lr, patience=args.l0_patience)


def training_text(spec, recipe: Recipe | None, rows, curves: dict[str, list[dict]],
                  sets, untimed: bool) -> str:
    """The card's `training` text of this run's rows."""
    head = (f"LoRA rank {spec.rank} on every linear of layers {spec.layers[0]}-"
            f"{spec.layers[-1]}, on the request and label positions after the option list's "
            "cached base-model prefix; ")
    if recipe is None:
        return head + (f"AdamW lr {LR} one-cycle, {STEPS} steps of {BATCH} on a seeded "
                       f"subsample of at most {MAX_TRAIN} samples; test on at most {MAX_TEST}")
    parts = []
    for row in rows:
        n, every = len(sets[row.setting].train), recipe.steps_per_epoch(len(sets[row.setting]
                                                                              .train))
        chosen = [c["chosen_epoch"] for c in curves[row.setting]]
        parts.append(f"{row.setting} {n} training samples ({every} steps per epoch), "
                     f"validation {len(sets[row.setting].val)}, test {row.num_test}: epochs "
                     f"kept per seed {chosen} (steps {[e * every for e in chosen]})")
    return head + (f"AdamW lr {recipe.lr} one-cycle over at most {recipe.epochs} epochs, "
                   f"batches of {recipe.batch}, on the whole training split; every seed keeps "
                   "its state of best validation accuracy (the label decoded exactly, teacher "
                   "forced, on the whole validation split, checked every epoch; the test split "
                   "is not read)" + (f", stopped after {recipe.patience} checks without a gain"
                                     if recipe.patience else "") + "; " + "; ".join(parts)
                   + (UNTIMED if untimed else ""))


UNTIMED = ("; decision times pending (not timed on a loaded machine: python -m "
           "engine_ext.routers.run_l0 --time-card CARD --settings ...)")


def run_card(args, sets, engine, tokenizer, write_card, cache_dir: Path) -> None:
    """L0 on args.settings, one card (`write_card`: train._card); an untimed run that leaves
    earlier timed rows in the card keeps the card's hardware (their times stay with it)."""
    from engine_ext.routers.states import MODEL_NAME

    recipe, found, curves = recipe_of(args), [], {}
    args = kept_hardware(args, args.cards / f"{CARD_NAME}.json")
    for name in args.settings:
        row, num_params, curves[name] = l0_setting(engine, tokenizer, sets[name], args.seeds,
                                                   cache_dir, recipe, not args.untimed)
        found.append(row)
    spec = l0_spec(len(engine.layers))
    write_card(CARD_NAME, "mol_l0", MODEL_NAME, min(spec.layers), num_params, args, found,
               training_text(spec, recipe, found, curves, sets, args.untimed),
               [sets[n] for n in args.settings])


CARD_NAME = "l0-smollm2"


def kept_hardware(args, card_path: Path):
    """args with the card's hardware when an untimed run leaves some timed rows in it."""
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


TIMED_LATER = ("; decision times measured on the seed-0 adapter by python -m "
               "engine_ext.routers.run_l0 --time-card CARD --settings ... (the card's hardware)")
"""The card's `command` keeps the training commands (what rebuild reruns); the timing run is
named here."""


def seed0_adapter(engine, tokenizer, routing_set: RoutingSet, adapters_dir: Path, training: str):
    """The saved seed-0 L0 of a setting; a fixed-recipe row's is retrained when missing (30
    seeded steps, the same adapter), a validated row's must be there."""
    from engine_ext.peft_io import load_peft_adapter

    path = adapters_dir / f"l0_{routing_set.name}"
    if path.exists():
        return load_peft_adapter(path, engine.hf, max_lora_rank=RANK)
    if "--l0-epochs" in training or routing_set.name in WHOLE_SPLIT_SETTINGS:
        raise SystemExit(f"{path}: no saved seed-0 adapter (train the setting first)")
    names = short_names(routing_set)
    prompts = route_prompts(tokenizer, names, *_samples(routing_set, False)[0])
    prefix = prefix_cache(engine, prompts.prefix)
    lower = lower_states(engine, prefix, prompts)
    return _train_seed(engine, l0_spec(len(engine.layers)), prefix, lower, None, None, 0)[0]


def time_card(card_path: Path, settings: list[str], adapters_dir: Path) -> None:
    """Time the decisions of `settings` (every timed row of the card: one machine) from their
    seed-0 adapters, on this machine, now; the accuracies stay."""
    from engine_ext.data import default_text_dir
    from engine_ext.routers.measure import hardware
    from engine_ext.routers.settings import load_settings
    from engine_ext.routers.states import load_route_engine
    from sim.strategies.router_card import load_router_card, write_router_card

    card = load_router_card(card_path)
    left = [r.setting for r in card.settings if r.setting not in settings and r.decision]
    if left:
        raise SystemExit(f"{card_path}: {left} keep times of another machine: time them too")
    engine, tokenizer = load_route_engine()
    sets = load_settings(default_text_dir())
    rows = {}
    for row in card.settings:
        if row.setting not in settings:
            continue
        routing_set = sets[row.setting]
        weights = seed0_adapter(engine, tokenizer, routing_set, adapters_dir, card.training)
        names = short_names(routing_set)
        test = route_prompts(tokenizer, names, *_samples(
            routing_set, row.setting in WHOLE_SPLIT_SETTINGS)[1])
        engine.add_adapter(EVAL_NAME, weights)
        try:
            decision = time_setting(engine, tokenizer, prefix_cache(engine, test.prefix), test)
        finally:
            engine.registry.remove(EVAL_NAME)
        rows[row.setting] = row.model_copy(update={"decision": decision})
        print(f"timed {row.setting}: p50 {decision.p50_ms:.1f} ms", flush=True)
    write_router_card(card.model_copy(update={
        "settings": tuple(rows.get(r.setting, r) for r in card.settings),
        "hardware": hardware(), "training": card.training.replace(UNTIMED, TIMED_LATER)}),
        card_path)
    print(f"wrote {card_path}")


def main(argv: list[str] | None = None) -> None:
    import argparse

    import torch

    parser = argparse.ArgumentParser(description="Time a card's L0 decisions (a quiet machine)")
    parser.add_argument("--time-card", type=Path, required=True)
    parser.add_argument("--settings", nargs="+", required=True)
    parser.add_argument("--adapters", type=Path, default=Path(".cache/engine_ext/routers/l0"),
                        help="the seed-0 adapters train saved (train.CACHE_DIR / 'l0')")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    time_card(args.time_card, args.settings, args.adapters)


if __name__ == "__main__":
    main()
