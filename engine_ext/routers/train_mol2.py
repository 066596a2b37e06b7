"""MoL2's training options of `routers.train`: the validation-chosen head search, timing a
card's saved heads later (`--time-only`), and commands that name no cache path.

    python -m engine_ext.routers.train --routers mol2 --settings S --untimed \
        --mol2-steps MAX --mol2-early-stop EVERY --mol2-weight-decay 0.01 0.1 ...
    python -m engine_ext.routers.train --routers mol2 --settings S --time-only

A loaded machine trains (accuracy does not depend on the load) and leaves the decision times
pending; a quiet one times the saved seed-0 heads without training again.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from sim.strategies.router_card import Hardware, RouterCard, load_router_card

PENDING = (", decision times pending (not timed on a loaded machine; the card's --time-only "
           "command times them)")
TIMED_LATER = ", decision times measured by --time-only on the saved seed-0 head"
CACHE_OPTIONS = ("--layer-cache", "--head-cache")
"""Where caches live changes nothing a run computes (they are keyed by content): a card's
command leaves them out, so it names no path of the machine that made it."""


def recorded_args(argv: list[str]) -> list[str]:
    """argv without the cache-location options and their values."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in CACHE_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in CACHE_OPTIONS)):
            out.append(arg)
    return out


def trained_settings(command: str, every: tuple[str, ...]) -> set[str]:
    """The settings a recorded command trains or times (`every` without --settings)."""
    words = shlex.split(command)
    if "--settings" not in words:
        return set(every)
    rest = words[words.index("--settings") + 1:]
    return set(next((rest[:i] for i, w in enumerate(rest) if w.startswith("--")), rest))


def add_head_options(parser: argparse.ArgumentParser, cache_dir: Path) -> None:
    """MoL2's head search (--mol2-early-stop), validation size, timing-only and head cache."""
    parser.add_argument("--val-per-class", type=int, default=None,
                        help="validation rows per class of CLINC150 and BANKING77 (default: "
                             "settings.CLINC_PER_INTENT's); never test rows")
    parser.add_argument("--mol2-early-stop", type=int, default=0, metavar="EVERY",
                        help="MoL2: check the validation accuracy every EVERY steps and keep "
                             "the best state; --mol2-steps is then the most steps, and seed "
                             "0's validation accuracy chooses among the --mol2-lr x "
                             "--mol2-weight-decay x --mol2-dropout combinations")
    parser.add_argument("--mol2-lr", type=float, nargs="+", default=[2e-3])
    parser.add_argument("--mol2-weight-decay", type=float, nargs="+", default=[0.01])
    parser.add_argument("--mol2-dropout", type=float, nargs="+", default=[0.0],
                        help="share of the standardised query features dropped in training")
    parser.add_argument("--mol2-batch", type=int, default=64,
                        help="with --mol2-early-stop: queries per training step")
    parser.add_argument("--mol2-start-l2", type=float, nargs="+", default=[],
                        help="with --mol2-early-stop: start every head as the ridge map of the "
                             "training rows (mol2_init), its l2 chosen among these on "
                             "validation; needs --mol2-d-head above the number of options")
    parser.add_argument("--mol2-start-lbfgs", type=int, default=0, metavar="ITERS",
                        help="with --mol2-start-l2: refine the ridge start by ITERS L-BFGS "
                             "iterations of logistic regression (kept unless validation "
                             "prefers the ridge map)")
    parser.add_argument("--mol2-d-head", type=int, default=None,
                        help="with --mol2-early-stop: the head's width (default run_mol2's "
                             "HEAD_SHAPE)")
    parser.add_argument("--mol2-patience", type=int, default=4,
                        help="with --mol2-early-stop: checks without a gain before stopping")
    parser.add_argument("--time-only", action="store_true",
                        help="MoL2: only time the decisions of the card's saved seed-0 heads "
                             "(--head-cache) of --settings on this machine; no training")
    parser.add_argument("--head-cache", type=Path, default=cache_dir / "heads",
                        help="where each setting's seed-0 MoL2 head is saved, a folder per "
                             "card (--time-only reads it there)")


def check_head_options(parser: argparse.ArgumentParser, args) -> None:
    """Refuse combinations that cannot mean anything (exit 2 with the reason)."""
    if args.mol2_early_stop and len(args.mol2_steps) != 1:
        parser.error(f"--mol2-early-stop needs exactly one --mol2-steps value (the most steps), "
                     f"got {args.mol2_steps}")
    if args.mol2_early_stop < 0 or args.mol2_patience < 1 or args.mol2_batch < 1:
        parser.error("--mol2-early-stop must be >= 0, --mol2-patience and --mol2-batch >= 1")
    if (args.mol2_start_l2 or args.mol2_d_head) and not args.mol2_early_stop:
        parser.error("--mol2-start-l2 and --mol2-d-head need --mol2-early-stop (the search)")
    if args.mol2_start_lbfgs and not args.mol2_start_l2:
        parser.error("--mol2-start-lbfgs refines the start of --mol2-start-l2: give both")
    if [v for v in args.mol2_start_l2 if v <= 0] or (args.mol2_d_head or 4) % 4:
        parser.error(f"--mol2-start-l2 {args.mol2_start_l2} must be > 0 and --mol2-d-head "
                     f"{args.mol2_d_head} a positive multiple of 4 (the head count)")
    bad = [p for p in args.mol2_dropout if not 0 <= p < 1]
    if bad:
        parser.error(f"--mol2-dropout {bad}: allowed 0 <= p < 1")
    if args.time_only and (args.routers != ["mol2"] or args.untimed):
        parser.error("--time-only times MoL2 cards only: use it with --routers mol2 and "
                     "without --untimed")


def head_search(args):
    """The HeadSearch of --mol2-early-stop, or None (the fixed-length training)."""
    from engine_ext.routers.run_mol2 import HeadSearch

    if not args.mol2_early_stop:
        return None
    return HeadSearch(args.mol2_steps[0], args.mol2_early_stop, tuple(args.mol2_lr),
                      tuple(args.mol2_weight_decay), tuple(args.mol2_dropout),
                      args.mol2_patience, args.mol2_batch, tuple(args.mol2_start_l2),
                      args.mol2_start_lbfgs, args.mol2_d_head)


def retimed(card: RouterCard, rows: dict, how: dict[str, str], hardware: Hardware,
            command: str, group) -> RouterCard:
    """The card with the re-timed `rows` (by setting), their `training` no longer pending, this
    machine as its hardware and the timing command added to its commands."""
    how = {name: text.replace(PENDING, TIMED_LATER) if name in rows else text
           for name, text in how.items()}
    settings = tuple(rows.get(r.setting, r) for r in card.settings)
    commands = list(dict.fromkeys([*card.command.split("; "), command]))
    return card.model_copy(update={"settings": settings, "hardware": hardware,
                                   "command": "; ".join(commands),
                                   "training": group(settings, how)})


def query_text(backbone) -> str:
    """What a MoL2 head reads, for the card."""
    spec = getattr(backbone, "spec", None)
    if spec is not None:
        return (f"queries of the feature set {spec.label} ({backbone.d_query} features: the "
                "pooled states of those layers side by side, L-1 the token embeddings)")
    return f"{getattr(backbone, 'pooling', 'mean')}-pooled layer-{backbone.layer} states"


def train_sizes(sets, names) -> str:
    """Training rows per setting, for the card."""
    return "training queries " + ", ".join(f"{n} {len(sets[n].train)}" for n in names)


def epochs(sets, names, steps: int, batch: int) -> str:
    """A fixed length in epochs per setting, for the card."""
    return f"{steps} steps of {batch} (" + ", ".join(
        f"{n} {steps * batch / len(sets[n].train):.1f} epochs" for n in names) + ")"


def timing_source(args, card_name: str) -> Path | None:
    """With --keep-timings: the card whose decision times (and hardware) are kept: the card
    itself, or for a new MoL2 card of another SmolLM2 layer, mol2-smollm2 (same head and
    options: the in-engine decision, pool + head, does not depend on the layer; the kept
    out-of-engine time, a prefill to layer 25, is an upper bound for a lower layer)."""
    if not getattr(args, "keep_timings", False):
        return None
    path = args.cards / f"{card_name}.json"
    if not path.exists() and card_name.startswith("mol2-smollm2-l"):
        path = args.cards / "mol2-smollm2.json"
    return path if path.exists() else None


def timed_rows(args, card_name: str) -> dict:
    """With --keep-timings: the decision times of the card's existing rows, by setting (the
    accuracy is re-measured, the timing is not: a loaded machine's times would be noise)."""
    path = timing_source(args, card_name)
    if path is None:
        return {}
    return {row.setting: row for row in load_router_card(path).settings}
