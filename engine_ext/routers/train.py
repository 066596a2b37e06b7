"""Train and measure the three routers on real text; write one router card per trained router.

    nice -n 10 python -m engine_ext.routers.train [--routers mol2 contextual_ced
        contextual_smollm2 l0] [--seeds 0 1 2 3 4] [--cards scenarios/router_cards]

Reproducible: fixed data splits (`settings.DATA_SEED`), every router trained once per seed, on
one torch thread by default. Frozen routing-layer states of SmolLM2 are cached under .cache, so a
second run trains heads only. Each router's card is written as soon as it is done. The MoL2 heads
of clinc_domains10 (trained, and the shuffled-label control) go to data/routers/ for the vLLM test.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from engine_ext.data import default_text_dir
from engine_ext.routers import train_mol2 as tm
from engine_ext.routers.contextual_start import add_contextual_options
from engine_ext.routers.measure import hardware
from engine_ext.routers.run_l0 import add_l0_options
from engine_ext.routers.settings import load_settings
from engine_ext.routers.states import ROUTE_LAYER
from sim.strategies.router_card import RegimeResult, RouterCard, load_router_card, write_router_card

ROUTERS = ("mol2", "mol2_regimes", "mol2_ced", "contextual_ced", "contextual_smollm2", "l0")
CARDS_DIR = Path("scenarios/router_cards")
HEADS_DIR = Path("data/routers")
CACHE_DIR = Path(".cache/engine_ext/routers")
LAYER_CACHE = CACHE_DIR / "layers"
"""The all-layer pooled states (routers.layer_cache) MoL2 reads at another layer or pooling."""
VLLM_SETTING = "clinc_domains10"
ALL_SETTINGS = ("domains4", "clinc_domains10", "clinc_intents150", "banking77")


LOCK_DIR = CACHE_DIR / "locks"
"""Where the card locks live: outside the cards' folder, so no lock file lands in the repo."""


@contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (runs of different settings merge into one card)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"{path.stem}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


TRAINING_SEPARATOR = " || "
"""Between the `training` texts of rows trained differently: 'settings: text || settings: text'."""


def _training_per_row(card: RouterCard) -> list[str]:
    """How each of the card's rows was trained, read back from its `training`."""
    if TRAINING_SEPARATOR not in card.training:
        return [card.training] * len(card.settings)
    how = {}
    for part in card.training.split(TRAINING_SEPARATOR):
        names, text = part.split(": ", 1)
        how.update({name: text for name in names.split(", ")})
    return [how[s.setting] for s in card.settings]


def _merge(card: RouterCard, old: RouterCard) -> RouterCard:
    """`card` plus the settings of `old` that this run did not train (same router, model,
    layer and seeds), in ALL_SETTINGS order."""
    same = (old.router, old.model, old.routing_layer, old.seeds) == \
        (card.router, card.model, card.routing_layer, card.seeds)
    if not same:
        return card
    mine = {s.setting for s in card.settings}
    kept = [s for s in old.settings if s.setting not in mine]
    rows = sorted([*card.settings, *kept], key=lambda s: ALL_SETTINGS.index(s.setting)
                  if s.setting in ALL_SETTINGS else len(ALL_SETTINGS))
    # an old command whose settings this run all retrains made no row that remains
    commands = list(dict.fromkeys([*(c for c in old.command.split("; ")
                                     if not tm.trained_settings(c, ALL_SETTINGS) <= mine),
                                    card.command]))
    how = {s.setting: text for s, text in zip(old.settings, _training_per_row(old), strict=True)}
    how.update({s.setting: text for s, text in zip(card.settings, _training_per_row(card),
                                                   strict=True)})
    training = _grouped_training(rows, how)
    return card.model_copy(update={
        "settings": tuple(rows), "command": "; ".join(commands), "regimes": old.regimes,
        "training": training,
        "data_sources": tuple(sorted({*old.data_sources, *card.data_sources}))})


def _grouped_training(rows, how: dict[str, str]) -> str:
    """One `training` text for rows trained as `how` says, by setting (rows trained alike
    share one part)."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(how[row.setting], []).append(row.setting)
    return next(iter(groups)) if len(groups) == 1 else TRAINING_SEPARATOR.join(
        f"{', '.join(names)}: {text}" for text, names in groups.items())


def _card(name: str, router: str, model: str, layer: int, num_params: int, args, rows,
          training: str, sets, **extra) -> RouterCard:
    sources = sorted({src for s in sets for src in s.sources})
    path = args.cards / f"{name}.json"
    # kept decision times stay with the machine that measured them
    source = tm.timing_source(args, name)
    hardware = load_router_card(source).hardware if source else args.hardware
    card = RouterCard(name=name, router=router, model=model, routing_layer=layer,
                      num_params=num_params, seeds=tuple(args.seeds), training=training,
                      command=args.command, data_sources=tuple(sources), hardware=hardware,
                      settings=tuple(rows), **extra)
    with _locked(path):
        if path.exists() and set(args.settings) != set(ALL_SETTINGS):
            card = _merge(card, load_router_card(path))
        write_router_card(card, path)
    print(f"wrote {path}", flush=True)
    return card


def run_mol2(args, sets, backbone, card_name: str, router_key: str) -> None:
    """MoL2 on one backbone; the SmolLM2 head of VLLM_SETTING (and its shuffled-label control)
    goes to data/routers for the vLLM test."""
    from engine_ext.routers import run_mol2 as m

    rows, timed, chosen = [], tm.timed_rows(args, card_name), {}
    search = tm.head_search(args)
    for name in args.settings:
        row, head, chosen[name] = m.mol2_setting(
            backbone, sets[name], args.seeds, args.head_cache / card_name, tuple(args.mol2_steps),
            timed.get(name), is_timed=not args.untimed, search=search)
        rows.append(row)
        # the vLLM test's heads read layer ROUTE_LAYER mean-pooled: only that card makes them
        if name == VLLM_SETTING and card_name == "mol2-smollm2":
            m.save_head(head, args.heads / f"mol2_smollm2_{name}.safetensors")
            tasks = m.mol2_tasks(backbone, sets[name])
            control, _ = m.train_seeds(backbone.d_model, [m.shuffled(tasks["train"], 1)],
                                       args.seeds[:1])
            m.save_head(control[0], args.heads / f"mol2_smollm2_{name}_shuffled.safetensors")
    common = (f"pointer head {search.shape if search else m.HEAD_SHAPE}, query standardised "
              "per feature, "
              + ("AdamW one-cycle" if search else "AdamW lr 2e-3 one-cycle")
              + f", batches of {search.batch if search else m.BATCH} "
              + tm.query_text(backbone) + ", ")
    tail = ((", decision times kept from the card's earlier measurement"
             if args.keep_timings else "") + (tm.PENDING if args.untimed else ""))
    if search is not None:
        how = {n: common + tm.train_sizes(sets, [n]) + "; " + chosen[n] + tail
               for n in args.settings}
        training = _grouped_training(rows, how)
    else:
        training = (common + f"{tm.train_sizes(sets, args.settings)}, "
                    + (f"steps per setting chosen among {args.mol2_steps} by seed 0's "
                       "validation accuracy (printed in the log; the test split is not looked "
                       "at)" if len(args.mol2_steps) > 1
                       else tm.epochs(sets, args.settings, (args.mol2_steps or [m.STEPS])[0],
                                    m.BATCH)) + tail)
    _card(card_name, "mol2", backbone.name, backbone.layer, rows[0].work.num_head_params, args,
          rows, training, [sets[n] for n in args.settings])


def time_mol2(args, sets, backbone, card_name: str) -> None:
    """--time-only: measure the decision times of the card's saved seed-0 heads of
    args.settings on this machine, now; nothing is trained, the accuracies stay."""
    from engine_ext.routers import run_mol2 as m

    path = args.cards / f"{card_name}.json"
    with _locked(path):
        card = load_router_card(path)
        have = {r.setting: r for r in card.settings}
        lost = [n for n in args.settings if n not in have]
        heads = {n: args.head_cache / card_name / f"mol2_{backbone.name}_{n}.safetensors"
                 for n in args.settings}
        missing = [str(f) for f in heads.values() if not f.exists()]
        if lost or missing:
            print(f"{path}: cannot time {lost or missing}: "
                  + ("no such row (train the setting first)" if lost else
                     "no saved seed-0 head (train the setting first, or pass --head-cache)"),
                  file=sys.stderr)
            raise SystemExit(2)
        rows = {}
        for name in args.settings:
            rows[name] = m.retime_setting(backbone, sets[name], have[name], heads[name])
            print(f"timed {name}: p50 {rows[name].decision.p50_ms:.3f} ms", flush=True)
        how = dict(zip(have, _training_per_row(card), strict=True))
        write_router_card(tm.retimed(card, rows, how, args.hardware, args.command,
                                     _grouped_training), path)
    print(f"wrote {path}", flush=True)


def run_mol2_regimes(args, sets, backbone, wait_s: float = 3600) -> None:
    """Mixed vs staged training, added to the MoL2 card (waits for it when another process
    is still writing it)."""
    from engine_ext.routers import run_mol2 as m

    found = m.regimes(backbone, sets["clinc_intents150"], sets["domains4"], args.seeds)
    regimes = tuple(RegimeResult(regime=k, accuracy_per_seed=v) for k, v in found.items())
    path = args.cards / "mol2-smollm2.json"
    deadline = time.time() + wait_s
    while not path.exists() and time.time() < deadline:
        time.sleep(10)
    with _locked(path):
        card = load_router_card(path)
        write_router_card(card.model_copy(update={"regimes": regimes}), path)
    print(f"added the training regimes to {path}", flush=True)


def run_contextual(args, sets, backbone, card_name: str, router_key: str,
                   engine=None) -> None:
    from engine_ext.routers import run_contextual as c

    if args.feature_layers and engine is not None:  # SmolLM2 over a feature set
        from engine_ext.routers.contextual_start import feature_grid

        grid = feature_grid(args, c.FEATURE_GRID)
        c.run_feature_card(args, sets, engine, backbone.tokenize, _card, grid=grid)
        return
    rows = [c.contextual_setting(backbone, sets[n], args.seeds)
            for n in args.settings]
    _card(card_name, "contextual_mol", backbone.name, backbone.layer,
          rows[0].work.num_head_params, args, rows,
          f"q/k head d_head {c.D_HEAD}, AdamW lr 2e-3 one-cycle, {c.STEPS} steps of 64; a "
          f"seeded subsample of {c.MAX_QUERIES} queries per split ({c.MAX_QUERIES_MANY} beyond "
          "10 options)",
          [sets[n] for n in args.settings])


def run_l0(args, sets, engine, tokenizer) -> None:
    from engine_ext.routers import run_l0 as r

    r.run_card(args, sets, engine, tokenizer, _card, CACHE_DIR / "l0")


def ced_backbone_trained():
    """The CED model engine_ext.train trained (run it first: `python -m engine_ext.train`)."""
    from engine_ext.ced.engine import CEDEngine
    from engine_ext.routers.backbones import ced_backbone
    from engine_ext.train import DEFAULT_OUT, load_base

    ced = CEDEngine(load_base(DEFAULT_OUT))
    return ced_backbone(ced, DEFAULT_OUT / "model.safetensors", CACHE_DIR / "states")


def mol2_card_name(layer: int, pooling: str) -> str:
    """The SmolLM2 MoL2 card of a layer and pooling (today's layer, mean: mol2-smollm2)."""
    if (layer, pooling) == (ROUTE_LAYER, "mean"):
        return "mol2-smollm2"
    return f"mol2-smollm2-l{layer}" + ("" if pooling == "mean" else f"-{pooling}")


def mol2_feature_card_name(spec) -> str:
    """The SmolLM2 MoL2 card of a feature set: mol2-smollm2-l8-x6-mean-max for six layers up
    to 8, mean and max pooled."""
    return (f"mol2-smollm2-l{spec.route_layer}-x{len(spec.layers)}-"
            + "-".join(spec.poolings))


def _mol2_smollm2(args, smollm2, engine, tokenizer):
    """MoL2's SmolLM2 backbone and card name for --route-layer / --pooling / --layer-cache /
    --feature-layers."""
    from engine_ext.routers.backbones import LayerCacheBackbone, smollm2_backbone
    from engine_ext.routers.layer_cache import LayerCache
    from engine_ext.routers.states import load_route_engine

    if args.feature_layers:
        from engine_ext.routers import layer_cache as pf
        from engine_ext.routers.backbones import FeatureBackbone

        spec = pf.FeatureSpec(tuple(args.feature_layers), tuple(args.feature_poolings))
        cache = LayerCache(args.layer_cache or pf.DEFAULT_CACHE, pf.MAX_LAYER + 1)
        backbone = FeatureBackbone(smollm2, cache, spec).with_engine(engine)
        return backbone, mol2_feature_card_name(spec)

    layer = ROUTE_LAYER if args.route_layer is None else args.route_layer
    if (layer, args.pooling, args.layer_cache) == (ROUTE_LAYER, "mean", None):
        return smollm2, "mol2-smollm2"
    if layer != engine.route_layer:
        engine, tokenizer = load_route_engine(layer)
    cache = LayerCache(args.layer_cache or LAYER_CACHE)
    backbone = LayerCacheBackbone(smollm2_backbone(engine, tokenizer), cache, args.pooling)
    return backbone.with_engine(engine), mol2_card_name(layer, args.pooling)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routers", nargs="+", choices=ROUTERS, default=list(ROUTERS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--settings", nargs="+", choices=ALL_SETTINGS, default=list(ALL_SETTINGS),
                        help="settings to train (the card keeps its other settings' rows)")
    parser.add_argument("--cards", type=Path, default=CARDS_DIR)
    parser.add_argument("--heads", type=Path, default=HEADS_DIR)
    parser.add_argument("--mol2-steps", nargs="*", type=int, default=[],
                        help="MoL2: candidate training lengths, chosen per setting on the "
                             "validation split (default: 100 steps)")
    parser.add_argument("--text-dir", type=Path, default=None,
                        help="labelled text (default: $MOLCAP_DATA_DIR/text if set, else "
                             "the repository's data/text slices)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--train-per-class", type=int, default=None,
                        help="training rows per class of CLINC150 and BANKING77 (default: "
                             "settings.CLINC_PER_INTENT's)")
    parser.add_argument("--route-layer", type=int, default=None,
                        help="MoL2 on SmolLM2: read this layer (default states.ROUTE_LAYER); "
                             "another layer or pooling writes the card mol2-smollm2-l<layer>"
                             "[-last]")
    parser.add_argument("--pooling", choices=("mean", "last"), default="mean",
                        help="MoL2 on SmolLM2: mean over the turn's tokens or its last token")
    parser.add_argument("--layer-cache", type=Path, default=None,
                        help="MoL2 on SmolLM2: read queries from this all-layer cache "
                             "(routers.layer_cache, filled on demand); implied by --route-layer "
                             "or --pooling last (default folder .cache/engine_ext/routers/layers)")
    parser.add_argument("--feature-layers", type=int, nargs="+", default=None,
                        help="MoL2 on SmolLM2: read a feature set (probe_features): these "
                             "layers' pooled states side by side (-1: token embeddings), from "
                             "the --features layer cache (default out/routers/layers_l9); "
                             "Contextual MoL on SmolLM2: the same query, options read in its "
                             "context at the deepest of these layers (run_contextual)")
    parser.add_argument("--feature-poolings", nargs="+", choices=("mean", "last", "max"),
                        default=["mean"], help="with --feature-layers: the poolings")
    add_contextual_options(parser)
    add_l0_options(parser)
    parser.add_argument("--untimed", action="store_true",
                        help="MoL2, L0, Contextual MoL over a feature set: do not time "
                             "decisions (a loaded machine); the card's "
                             "decision times stay pending")
    parser.add_argument("--keep-timings", action="store_true",
                        help="MoL2: keep the decision times of the card's existing rows "
                             "instead of timing again")
    tm.add_head_options(parser, CACHE_DIR)
    args = parser.parse_args(argv)
    tm.check_head_options(parser, args)
    args.command = "python -m engine_ext.routers.train " + shlex.join(
        tm.recorded_args(sys.argv[1:] if argv is None else argv))
    torch.set_num_threads(args.threads)
    args.hardware = hardware()
    sets = load_settings(args.text_dir or default_text_dir(), args.train_per_class,
                         args.val_per_class)
    start = time.time()
    if {"mol2", "mol2_regimes", "contextual_smollm2", "l0"} & set(args.routers):
        from engine_ext.routers.backbones import smollm2_backbone
        from engine_ext.routers.states import load_route_engine

        engine, tokenizer = load_route_engine()
        smollm2 = smollm2_backbone(engine, tokenizer)
        if "mol2" in args.routers:
            backbone, card_name = _mol2_smollm2(args, smollm2, engine, tokenizer)
            if args.time_only:
                time_mol2(args, sets, backbone, card_name)
            else:
                run_mol2(args, sets, backbone, card_name, "mol2")
        if "mol2_regimes" in args.routers:
            run_mol2_regimes(args, sets, smollm2)
        if "contextual_smollm2" in args.routers:
            run_contextual(args, sets, smollm2, "contextual-smollm2", "contextual_smollm2",
                           engine)
        if "l0" in args.routers:
            run_l0(args, sets, engine, tokenizer)
    if {"contextual_ced", "mol2_ced"} & set(args.routers):
        ced = ced_backbone_trained()
        if "mol2_ced" in args.routers:
            run_mol2(args, sets, ced, "mol2-ced", "mol2_ced")
        if "contextual_ced" in args.routers:
            run_contextual(args, sets, ced, "contextual-ced", "contextual_ced")
    print(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
