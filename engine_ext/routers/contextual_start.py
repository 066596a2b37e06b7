"""Contextual MoL's feature-set head chosen on a validation split and started from a linear map.

The levers that made MoL2 meet the TF-IDF baseline, applied to `routing.ContextualHead` with
its query-only term: the term starts as the ridge map of the training rows (standardised query
features -> one-hot labels, its l2 chosen on validation), optionally refined by L-BFGS logistic
regression in the span of its rows (`mol2_init`), sharpened to the validation rows' least
cross-entropy; the q/k part starts with q at zero, so the untrained head decides exactly as the
map does (checked as step 0). Training then moves both parts; every seed keeps its state of
best validation accuracy (step 0 included), and the training length, learning rate and weight
decay are chosen by seed 0's validation accuracy. Validation is a split of its own (CLINC150's
validation split, BANKING77's every 10th training row): the test split is never read.
"""

from __future__ import annotations

import copy
import time
from itertools import product

import torch
import torch.nn.functional as F

from engine_ext.routers.contextual import contextual_accuracy, train_contextual
from engine_ext.routers.mol2_init import TEMPERATURES, _refine, fit_ridge
from engine_ext.routing import ContextualHead

D_HEAD = 64
BATCH = 64
SPLIT_GRID = {"start_l2": (0.01, 0.03, 0.1), "start_lbfgs": 100, "epochs": (3,),
              "lr": (1e-4, 1e-3), "weight_decay": (0.01,)}
"""Ridge l2s (relative to unit-variance features), L-BFGS refinement iterations (0: none), and
the training lengths (epochs of 64-query batches), peak learning rates and AdamW decays tried."""


def ridge_start(head: ContextualHead, tq, ty, vq, vy, l2s: tuple[float, ...], lbfgs: int
                ) -> tuple[tuple[torch.Tensor, torch.Tensor], str]:
    """The query term's start (weight [O, F], bias [O]) in the head's standardised query space
    (its scales fitted), and what the card records: each l2's validation accuracy, the
    refinement's and whether it was kept."""
    x, val_x = head.feature_scale(tq), head.feature_scale(vq)
    fits = fit_ridge(x, ty, head.query_logits.out_features, l2s)
    accs = [float(((val_x @ w.T + b).argmax(-1) == vy).float().mean()) for w, b in fits]
    best = max(range(len(l2s)), key=lambda i: (accs[i], -i))
    weight, bias = fits[best]
    logits = val_x @ weight.T + bias
    sharpen = min(TEMPERATURES, key=lambda t: float(F.cross_entropy(t * logits, vy)))
    start, refined = (sharpen * weight, sharpen * bias), ""
    if lbfgs:
        with torch.no_grad():
            found, acc = _refine(x, ty, fits[best], val_x, vy, lbfgs)
        refined = (f"; refined by {lbfgs} L-BFGS iterations of logistic regression in the span "
                   f"of its rows: validation {100 * acc:.1f}%, "
                   + ("kept" if acc >= accs[best] else "not kept"))
        if acc >= accs[best]:
            start = found
    text = ("query term started as the ridge map of the training rows (l2, validation accuracy: "
            + ", ".join(f"{l2:g} {100 * a:.1f}%" for l2, a in zip(l2s, accs, strict=True))
            + f"; chosen {l2s[best]:g}{refined}), q at zero")
    return start, text


@torch.no_grad()
def write_start(head: ContextualHead, start: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """Query term := the linear map, q := 0: the head decides as the map does."""
    if start is None:
        return
    head.query_logits.weight.copy_(start[0])
    head.query_logits.bias.copy_(start[1])
    head.q.weight.zero_()
    head.q.bias.zero_()


def new_head(tq, to, seed: int) -> ContextualHead:
    """A head with a query term, its scales fitted on the training states."""
    torch.manual_seed(seed)
    head = ContextualHead(tq.shape[1], D_HEAD, d_option=to.shape[2], num_options=to.shape[1])
    head.fit_scales(tq, to)
    return head


def train_kept(head: ContextualHead, train, val, seed: int, epochs: int, lr: float,
               weight_decay: float) -> tuple[ContextualHead, list[float], int]:
    """Train (queries, options, labels) `train` for `epochs`, checking validation every epoch;
    the head left in its best validation state (the first best; step 0 is the start). Returns
    the head, the curve (step 0 first) and the kept step."""
    per_epoch = max(1, round(len(train[2]) / BATCH))
    curve = [contextual_accuracy(head, *val)]
    best = (curve[0], 0, copy.deepcopy(head.state_dict()))

    def check(step: int) -> None:
        nonlocal best
        curve.append(contextual_accuracy(head, *val))
        if curve[-1] > best[0]:
            best = (curve[-1], step, copy.deepcopy(head.state_dict()))

    if epochs:
        train_contextual(head, *train, steps=epochs * per_epoch, batch=BATCH, lr=lr, seed=seed,
                         weight_decay=weight_decay, check_every=per_epoch, on_check=check)
    head.load_state_dict(best[2])
    head.eval()
    return head, curve, best[1]


def split_heads(train, val, seeds: list[int], grid: dict = SPLIT_GRID
                ) -> tuple[list[ContextualHead], list[float], str]:
    """Heads per seed chosen on the validation split (module docstring): the heads, their
    training seconds and the card's text of how they were chosen."""
    tq, to, ty = train
    template = new_head(tq, to, 0)
    start, start_text = (ridge_start(template, tq, ty, val[0], val[2], tuple(grid["start_l2"]),
                                     grid["start_lbfgs"])
                         if grid["start_l2"] else (None, "query term and q/k from scratch"))
    found = {}
    for key in product(grid["epochs"], grid["lr"], grid["weight_decay"]):
        head = new_head(tq, to, 0)
        write_start(head, start)
        _, curve, step = train_kept(head, train, val, 0, *key)
        found[key] = (max(curve), step, curve)
        print(f"contextual split candidate {key}: validation {max(curve):.4f} @ step {step}, "
              f"curve {[round(a, 4) for a in curve]}", flush=True)
    chosen = max(found, key=lambda k: (found[k][0], -k[0], -k[1], k[2]))
    heads, seconds, kept = [], [], []
    for seed in seeds:
        began = time.perf_counter()
        head = new_head(tq, to, seed)
        write_start(head, start)
        head, _, step = train_kept(head, train, val, seed, *chosen)
        seconds.append(time.perf_counter() - began)
        heads.append(head)
        kept.append(step)
    text = (f"{start_text}; candidates (epochs, lr, weight decay: seed 0's best validation "
            "accuracy @ step; curve, a check every epoch from step 0): "
            + "; ".join(f"{k} {100 * v[0]:.1f}% @{v[1]} [{_pcts(v[2])}]"
                        for k, v in found.items())
            + f"; chosen {chosen}; steps kept per seed {kept}; seed 0 without its q/k term: "
            f"validation {100 * qk_off_accuracy(heads[0], val):.1f}%")
    return heads, seconds, text


def _pcts(curve: list[float]) -> str:
    return " ".join(f"{100 * a:.1f}" for a in curve)


@torch.no_grad()
def qk_off_accuracy(head: ContextualHead, val) -> float:
    """Validation accuracy of the head's query term alone (what the q/k score adds is the
    difference to the whole head's)."""
    queries, _, labels = val
    logits = head.query_logits(head.feature_scale(queries))
    return float((logits.argmax(-1) == labels).float().mean())


def add_contextual_options(parser) -> None:
    """train's options of Contextual MoL over a feature set."""
    parser.add_argument("--contextual-epochs", type=int, nargs="+", default=None,
                        help="Contextual MoL over a feature set: the training lengths (epochs) "
                             "the validation carve chooses among (default run_contextual's)")
    parser.add_argument("--contextual-decays", type=float, nargs="+", default=None,
                        help="Contextual MoL over a feature set: the AdamW weight decays the "
                             "validation carve chooses among (default run_contextual's)")
    parser.add_argument("--contextual-query-term", nargs="+", choices=("no", "yes"),
                        default=None, help="Contextual MoL over a feature set: heads without "
                        "and/or with a query-only term beside the q/k score, chosen on the "
                        "validation carve (default: without)")
    parser.add_argument("--contextual-validation", choices=("carve", "split"), default="carve",
                        help="Contextual MoL over a feature set: choose on a 10%% carve of the "
                             "training split (run_contextual) or on the setting's validation "
                             "split with the ridge-map start (contextual_start)")
    parser.add_argument("--contextual-start-l2", type=float, nargs="*", default=None,
                        help="with --contextual-validation split: the ridge l2s of the query "
                             "term's start (none given: no start)")
    parser.add_argument("--contextual-start-lbfgs", type=int, default=None,
                        help="with --contextual-validation split: L-BFGS iterations refining "
                             "the start (0: none)")
    parser.add_argument("--contextual-lrs", type=float, nargs="+", default=None,
                        help="with --contextual-validation split: the peak learning rates tried")


def feature_grid(args, carve_grid: dict) -> dict:
    """The candidates of Contextual MoL over a feature set: `carve_grid` (run_contextual's, on
    the validation carve) or SPLIT_GRID (on the validation split), with the options' values."""
    is_split = getattr(args, "contextual_validation", "carve") == "split"
    grid = dict(SPLIT_GRID, validation="split") if is_split else dict(carve_grid)
    grid.update({k: tuple(v) for k, v in (("epochs", args.contextual_epochs),
                                          ("weight_decay", args.contextual_decays),
                                          ("lr", getattr(args, "contextual_lrs", None))) if v})
    if getattr(args, "contextual_query_term", None):
        grid["query_term"] = tuple(t == "yes" for t in args.contextual_query_term)
    if getattr(args, "contextual_start_l2", None) is not None:
        grid["start_l2"] = tuple(args.contextual_start_l2)
    if getattr(args, "contextual_start_lbfgs", None) is not None:
        grid["start_lbfgs"] = args.contextual_start_lbfgs
    return grid
