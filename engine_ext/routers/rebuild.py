"""Rebuild every router card with the commands that made them: one entry point, timed.

    nice -n 19 python -m engine_ext.routers.rebuild [--quick] [--jobs 2] [--cards DIR]
        [--routers mol2 mol2_regimes l0 contextual_smollm2 mol2_ced contextual_ced]

Runs `python -m engine_ext.train` first when the CED model is missing (the CED cards are trained
on it), then every command below as its own `python -m engine_ext.routers.train` process (per router
and setting, as the shipped cards were made), `--jobs` at a time, longest first. The shipped
cards record these same commands (a test checks it). --quick trains seed 0 only and
writes to out/router_cards_quick (heads to out/router_heads_quick), leaving the shipped cards
and data/routers alone: a check that the pipeline runs, not the table's numbers. Then the
reference rows (`engine_ext.routers.baselines`: TF-IDF baseline, linear probes; then
`engine_ext.routers.ced_probe`: the CED model's probe per layer, docs/router_ced_probe.md) and
the table (`bench/bench_routers.py`; with --quick into out/router_baselines_quick.json and
out/router_table_quick.*, else data/routers/baselines.json and docs/router_table.*). The wall time
of every process and of the whole rebuild is printed and written to
out/router_rebuild_logs/rebuild_times.json, beside each process's log.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SETTINGS = ("domains4", "clinc_domains10", "clinc_intents150", "banking77")
MOL2_LARGE = ("--train-per-class", "30", "--keep-timings")
"""MoL2 on SmolLM2 trains on 30 rows per class (settings.LARGE_TRAIN_PER_CLASS) and keeps the
decision times its card measured before (a card without them times again)."""
CHOOSE_STEPS = ("--mol2-steps", "100", "300")
MOL2_STEPS = {"clinc_domains10": 350, "clinc_intents150": 350}
"""About 5 epochs of 64 on CLINC150's 4,500 rows (domains4 and BANKING77 keep their rows: 100
steps on 400, and 300 steps on 770 chosen on validation)."""

MOL2_LAYER8 = (*MOL2_LARGE, "--mol2-steps", "350", "--route-layer", "8")
"""MoL2 on SmolLM2 layer 8 (card mol2-smollm2-l8) on CLINC150, where the probe sweep
(docs/router_probe_layers.md) finds the label best carried (150 intents; 10 domains: layer 9,
93.6%, layer 8 93.1%, one card per layer); the same rows and steps as the layer-25 card."""

MOL2_LAYER8_FULL = ("--train-per-class", "1000000", "--keep-timings", "--mol2-steps", "1170",
                    "--route-layer", "8")
"""150 intents on layer 8 from the whole training split (15,000 rows, 5 epochs of 64): with
4,500 rows the head overfit (79.4%); needs the pass over all of CLINC150's training text."""


FEATURE_SET = ("--feature-layers", "-1", "0", "2", "4", "6", "8", "--feature-poolings", "mean",
               "max")
"""MoL2 on a feature set (card mol2-smollm2-l8-x6-mean-max): the token embeddings and every
second layer up to 8, mean and max pooled, the set whose probe reaches TF-IDF on the whole
training splits (docs/router_probe_layers.md)."""
FEATURE_SEARCH = ("--train-per-class", "1000000", "--val-per-class", "10", "--untimed",
                  "--mol2-lr", "0.001", "0.003")
"""domains4 on it: its 400 training rows; seed 0's validation accuracy (its 80 validation rows,
never test rows) chooses the learning rate and the regularisation, and every seed keeps its
best validation state. Trained untimed (a loaded machine), timed by FEATURE_TIMING later."""
FEATURE_STEPS = {
    "domains4": ("--mol2-weight-decay", "0.01", "0.1", "--mol2-dropout", "0", "0.5",
                 "--mol2-steps", "400", "--mol2-early-stop", "20")}
"""domains4's candidates beyond the learning rate (weight decay 0.01 or 0.1 gave the same
validation curves), the most steps (64 epochs of 64) and the steps between checks."""
FEATURE_START = ("--train-per-class", "1000000", "--val-per-class", "10", "--untimed",
                 "--mol2-start-l2", "0.01", "0.03", "0.1")
"""The larger settings on it: the whole training splits; every head starts as the ridge map of
the training rows (mol2_init; its l2 chosen on validation: CLINC150's own validation split,
10 per intent, and a carve-out of BANKING77's training split), written into a head wider than
the options, and then only its query side trains, early-stopped on validation with the start
as step 0. From a random start the head stayed 0.6-2.5 points under TF-IDF while the probe on
the same features was above it (docs/routers.md)."""
_LONGER = ("--mol2-start-lbfgs", "100", "--mol2-lr", "1e-05", "3e-05", "--mol2-batch", "256",
           "--mol2-steps", "200", "--mol2-early-stop", "25", "--mol2-patience", "2")
FEATURE_STARTS = {
    "clinc_domains10": (*_LONGER, "--mol2-d-head", "64"),
    "banking77": (*_LONGER, "--mol2-d-head", "128"),
    "clinc_intents150": ("--mol2-lr", "1e-05", "--mol2-batch", "256", "--mol2-steps", "50",
                         "--mol2-early-stop", "25", "--mol2-patience", "2", "--mol2-d-head",
                         "256", "--mol2-start-lbfgs", "100")}
"""Per setting: the map's refinement by logistic regression (kept only where validation prefers
it), the learning rates after the start, the most steps (batches of 256, a check every 25
steps, stop after 2 without a gain) and the head's width, above the number of options (10, 77,
150). The 150 intents train at most 50 steps (every step there costs 4 times a 64-wide head's)."""
FEATURE_TIMING = ("--time-only", *FEATURE_SET)
"""Times every row of the card from its saved seed-0 head (on a quiet machine)."""


L0_EPOCHS = ("--l0-epochs", "6", "--l0-patience", "2", "--untimed")
"""L0 on domains4 and clinc_domains10 (run_l0.WHOLE_SPLIT_SETTINGS): their whole default
training splits (400; 1,500, 10 per intent), at most 6 epochs, each seed keeping its state of
best validation accuracy, stopped after 2 checks without a gain; decision times pending (`python
-m engine_ext.routers.run_l0 --time-card CARD --settings ...` on a quiet machine)."""


CONTEXTUAL_FEATURES = ("--train-per-class", "1000000", "--untimed", *FEATURE_SET)
"""Contextual MoL over the same feature set (card contextual-smollm2-l8-x6-mean-max): options
read in the query's context at layer 8, the whole training splits, length and weight decay
chosen on a validation carve; trained untimed, timed afterwards on a quiet machine (`python -m
engine_ext.routers.contextual_timing --time-card CARD --shape-only`)."""


CONTEXTUAL_SPLIT = ("--contextual-validation", "split", "--contextual-start-l2", "0.01", "0.03",
                    "0.1", "--contextual-start-lbfgs", "100", "--contextual-epochs", "5",
                    "--contextual-lrs", "0.0001", "0.001", "0.003")
"""The larger settings: chosen on the setting's own validation split (contextual_start; CLINC150
all 3,000 validation queries, BANKING77 10 per class of its every 10th training row), the
query-only term started as the ridge map of the training rows, each seed keeping its best
validation state. On a carve of the training rows every 10-domain candidate scored 98.0-98.3%
and the chosen head 97.0% on test (docs/routers.md)."""
CONTEXTUAL_VAL = {"clinc_domains10": ("--val-per-class", "1000000"),
                  "banking77": ("--val-per-class", "10"),
                  "clinc_intents150": ("--val-per-class", "1000000")}


def _train(router: str, *settings: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    return ("--routers", router, *(("--settings", *settings) if settings else ()), *extra)


CHAINS: tuple[tuple[tuple[str, ...], ...], ...] = (
    *((_train("contextual_smollm2", s, extra=(*CONTEXTUAL_FEATURES[:2], *v,
                                             *CONTEXTUAL_FEATURES[2:], *CONTEXTUAL_SPLIT)),)
      for s, v in reversed(CONTEXTUAL_VAL.items())),
    (_train("mol2"), _train("mol2", "banking77", extra=CHOOSE_STEPS),
     *(_train("mol2", s, extra=(*MOL2_LARGE, "--mol2-steps", str(n)))
       for s, n in MOL2_STEPS.items()), _train("mol2_regimes")),
    (_train("mol2", "clinc_intents150", extra=MOL2_LAYER8_FULL),),
    (_train("mol2", "clinc_domains10", extra=MOL2_LAYER8),),
    (*(_train("mol2", s, extra=(*FEATURE_SEARCH, *how, *FEATURE_SET))
       for s, how in FEATURE_STEPS.items()),
     *(_train("mol2", s, extra=(*FEATURE_START, *how, *FEATURE_SET))
       for s, how in FEATURE_STARTS.items()),
     _train("mol2", *SETTINGS, extra=FEATURE_TIMING)),
    (_train("l0", "clinc_intents150"),), (_train("l0", "banking77"),),
    (_train("l0", "domains4", "clinc_domains10", extra=L0_EPOCHS),),
    (_train("contextual_smollm2", "clinc_intents150"),),
    (_train("contextual_smollm2", "banking77"),),
    (_train("contextual_smollm2", "domains4", "clinc_domains10"),),
    (_train("contextual_smollm2", "domains4", extra=CONTEXTUAL_FEATURES),),
    *((_train("mol2_ced", s),) for s in SETTINGS),
    *((_train("contextual_ced", s),) for s in SETTINGS),
)
"""The arguments of each training process. A chain's processes run one after the other (the
MoL2 card: every setting on the default rows, then the larger settings again on 30 rows per
class, then the mixed-vs-staged table); chains run `--jobs`
at a time, in this order (the slowest first: Contextual MoL's whole-split run on the 150
intents, 18,750 passes over 306 option tokens). Each process keeps train's one torch thread:
a second one, beside another job, oversubscribes two cores and slowed the rebuild
(docs/routers.md)."""

TRAIN_MODULE = "engine_ext.routers.train"


def command_text(args: tuple[str, ...]) -> str:
    """The command a card records for these arguments (`train` writes it the same way)."""
    return f"python -m {TRAIN_MODULE} " + shlex.join(args)


def _run(args: list[str], log: Path) -> float:
    """One process, its output in `log`; returns its wall seconds (raises on failure)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-u", *args], stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    print(f"{seconds:7.0f}s  {shlex.join(args[2:])}  (log {log})", flush=True)
    if done.returncode:
        raise RuntimeError(f"{shlex.join(args)} failed ({done.returncode}); see {log}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="seed 0 only, into out/router_cards_quick (the shipped cards stay)")
    parser.add_argument("--jobs", type=int, default=2, help="training processes at a time")
    parser.add_argument("--cards", type=Path, default=None)
    parser.add_argument("--routers", nargs="+", default=None,
                        help="only the commands training these (train's --routers names)")
    args = parser.parse_args(argv)
    from engine_ext.decoder_only import DEFAULT_HF_CACHE, load_smollm2
    from engine_ext.routers.baselines import BASELINES_FILE
    from engine_ext.routers.train import CARDS_DIR, HEADS_DIR
    from engine_ext.train import DEFAULT_OUT

    cards = args.cards or (Path("out/router_cards_quick") if args.quick else CARDS_DIR)
    heads = Path("out/router_heads_quick") if args.quick else HEADS_DIR
    extra = ["--seeds", "0", "--heads", str(heads)] if args.quick else []
    extra += [] if cards == CARDS_DIR else ["--cards", str(cards)]
    logs = Path("out/router_rebuild_logs")
    logs.mkdir(parents=True, exist_ok=True)
    start, times = time.perf_counter(), {}
    if not (DEFAULT_HF_CACHE / "gguf_source.json").exists():  # written once, not by 2 jobs
        load_smollm2()
    if not (DEFAULT_OUT / "model.safetensors").exists():
        times["python -m engine_ext.train"] = _run(["-m", "engine_ext.train"],
                                                   logs / "ced_model.log")

    chains = [tuple(r for r in chain if args.routers is None or r[1] in args.routers)
              for chain in CHAINS]

    def run_chain(i: int) -> dict[str, float]:
        return {command_text(recipe): _run(["-m", TRAIN_MODULE, *recipe, *extra],
                                           logs / f"train_{i:02d}_{j}.log")
                for j, recipe in enumerate(chains[i])}

    with ThreadPoolExecutor(args.jobs) as pool:
        for found in pool.map(run_chain, range(len(chains))):
            times.update(found)
    refs = Path("out/router_baselines_quick.json") if args.quick else BASELINES_FILE
    table = Path("out/router_table_quick.json") if args.quick else Path("docs/router_table.json")
    times["python -m engine_ext.routers.baselines"] = _run(
        ["-m", "engine_ext.routers.baselines", "--out", str(refs)], logs / "baselines.log")
    probe = Path("out/router_ced_probe_quick.json") if args.quick else Path(
        "docs/router_ced_probe.json")
    times["python -m engine_ext.routers.ced_probe"] = _run(
        ["-m", "engine_ext.routers.ced_probe", "--baselines", str(refs), "--out", str(probe)],
        logs / "ced_probe.log")
    times["python bench/bench_routers.py"] = _run(
        ["bench/bench_routers.py", "--cards", str(cards), "--baselines", str(refs),
         "--out", str(table)], logs / "table.log")
    total = time.perf_counter() - start
    print(f"rebuilt the router cards in {cards} in {total:.0f}s ({args.jobs} jobs, load "
          f"{os.getloadavg()[0]:.1f})", flush=True)
    (logs / "rebuild_times.json").write_text(json.dumps(
        {"total_s": total, "jobs": args.jobs, "quick": args.quick, "cards": str(cards),
         "process_s": times,
         "load_average_end": os.getloadavg()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
