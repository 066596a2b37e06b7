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
import shlex
import sys
import time
from pathlib import Path

import torch

from engine_ext.data import default_text_dir
from engine_ext.routers.measure import hardware
from engine_ext.routers.settings import load_settings
from engine_ext.routers.states import MODEL_NAME
from planner.router_card import RegimeResult, RouterCard, load_router_card, write_router_card

ROUTERS = ("mol2", "mol2_regimes", "contextual_ced", "contextual_smollm2", "l0")
CARDS_DIR = Path("scenarios/router_cards")
HEADS_DIR = Path("data/routers")
CACHE_DIR = Path(".cache/engine_ext/routers")
VLLM_SETTING = "clinc_domains10"
SETTINGS_PER_ROUTER = {
    "mol2": ("domains4", "clinc_domains10", "clinc_intents150", "banking77"),
    "contextual_ced": ("domains4", "clinc_domains10"),
    "contextual_smollm2": ("domains4", "clinc_domains10"),
    "l0": ("domains4", "clinc_domains10"),
}


def _card(name: str, router: str, model: str, layer: int, num_params: int, args, rows,
          training: str, sets, **extra) -> RouterCard:
    sources = sorted({src for s in sets for src in s.sources})
    card = RouterCard(name=name, router=router, model=model, routing_layer=layer,
                      num_params=num_params, seeds=tuple(args.seeds), training=training,
                      command=args.command, data_sources=tuple(sources), hardware=args.hardware,
                      settings=tuple(rows), **extra)
    path = write_router_card(card, args.cards / f"{name}.json")
    print(f"wrote {path}", flush=True)
    return card


def run_mol2(args, sets, engine, tokenizer) -> None:
    from engine_ext.routers import run_mol2 as m

    rows = []
    for name in SETTINGS_PER_ROUTER["mol2"]:
        row, head = m.mol2_setting(engine, tokenizer, sets[name], args.seeds,
                                   CACHE_DIR / "heads")
        rows.append(row)
        if name == VLLM_SETTING:
            m.save_head(head, args.heads / f"mol2_smollm2_{name}.safetensors")
            tasks = m.mol2_tasks(engine, tokenizer, sets[name])
            control, _ = m.train_seeds(engine.cfg.hidden_size,
                                       [m.shuffled(tasks["train"], 1)], args.seeds[:1])
            m.save_head(control[0], args.heads / f"mol2_smollm2_{name}_shuffled.safetensors")
    _card("mol2-smollm2", "mol2", MODEL_NAME, engine.route_layer,
          rows[0].work.num_head_params, args, rows,
          f"pointer head {m.HEAD_SHAPE}, query standardised per feature, AdamW lr 2e-3 "
          f"one-cycle, {m.STEPS} steps of 64 pooled layer-k states per setting",
          [sets[n] for n in SETTINGS_PER_ROUTER["mol2"]])


def run_mol2_regimes(args, sets, engine, tokenizer, wait_s: float = 3600) -> None:
    """Mixed vs staged training, added to the MoL2 card (waits for it when another process
    is still writing it)."""
    from engine_ext.routers import run_mol2 as m

    found = m.regimes(engine, tokenizer, sets["clinc_intents150"], sets["domains4"], args.seeds)
    regimes = tuple(RegimeResult(regime=k, accuracy_per_seed=v) for k, v in found.items())
    path = args.cards / "mol2-smollm2.json"
    deadline = time.time() + wait_s
    while not path.exists() and time.time() < deadline:
        time.sleep(10)
    card = load_router_card(path)
    write_router_card(card.model_copy(update={"regimes": regimes}), path)
    print(f"added the training regimes to {path}", flush=True)


def run_contextual(args, sets, backbone, card_name: str, router_key: str) -> None:
    from engine_ext.routers import run_contextual as c

    rows = [c.contextual_setting(backbone, sets[n], args.seeds)
            for n in SETTINGS_PER_ROUTER[router_key]]
    _card(card_name, "contextual_mol", backbone.name, backbone.layer,
          rows[0].work.num_head_params, args, rows,
          f"q/k head d_head {c.D_HEAD}, AdamW lr 2e-3 one-cycle, {c.STEPS} steps of 64; at most "
          f"{c.MAX_QUERIES} training and test queries per setting ({c.MAX_QUERIES_MANY} "
          "beyond 10 options)",
          [sets[n] for n in SETTINGS_PER_ROUTER[router_key]])


def run_l0(args, sets, engine, tokenizer) -> None:
    from engine_ext.routers import run_l0 as r

    found = [r.l0_setting(engine, tokenizer, sets[n], args.seeds, CACHE_DIR / "l0")
             for n in SETTINGS_PER_ROUTER["l0"]]
    rows, num_params = [row for row, _ in found], found[0][1]
    spec = r.l0_spec(len(engine.layers))
    _card("l0-smollm2", "mol_l0", MODEL_NAME, min(spec.layers), num_params, args,
          rows, f"LoRA rank {spec.rank} on every linear of layers {spec.layers[0]}-"
          f"{spec.layers[-1]}, AdamW lr {r.LR}, {r.STEPS} steps of {r.BATCH} on at most "
          f"{r.MAX_TRAIN} samples; test on at most {r.MAX_TEST}",
          [sets[n] for n in SETTINGS_PER_ROUTER["l0"]])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routers", nargs="+", choices=ROUTERS, default=list(ROUTERS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--cards", type=Path, default=CARDS_DIR)
    parser.add_argument("--heads", type=Path, default=HEADS_DIR)
    parser.add_argument("--text-dir", type=Path, default=None,
                        help="labelled text (default: $MOLCAP_DATA_DIR/text if set, else "
                             "the repository's data/text slices)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    args.command = "python -m engine_ext.routers.train " + shlex.join(sys.argv[1:] if argv is None
                                                                      else argv)
    torch.set_num_threads(args.threads)
    args.hardware = hardware()
    sets = load_settings(args.text_dir or default_text_dir())
    start = time.time()
    if {"mol2", "mol2_regimes", "contextual_smollm2", "l0"} & set(args.routers):
        from engine_ext.routers.run_contextual import smollm2_backbone
        from engine_ext.routers.states import load_route_engine

        engine, tokenizer = load_route_engine()
        if "mol2" in args.routers:
            run_mol2(args, sets, engine, tokenizer)
        if "mol2_regimes" in args.routers:
            run_mol2_regimes(args, sets, engine, tokenizer)
        if "contextual_smollm2" in args.routers:
            run_contextual(args, sets, smollm2_backbone(engine, tokenizer),
                           "contextual-smollm2", "contextual_smollm2")
        if "l0" in args.routers:
            run_l0(args, sets, engine, tokenizer)
    if "contextual_ced" in args.routers:
        from engine_ext.ced.engine import CEDEngine
        from engine_ext.routers.run_contextual import ced_backbone
        from engine_ext.train import DEFAULT_OUT, load_base

        ced = CEDEngine(load_base(DEFAULT_OUT))
        run_contextual(args, sets, ced_backbone(ced, DEFAULT_OUT / "model.safetensors"),
                       "contextual-ced", "contextual_ced")
    print(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
