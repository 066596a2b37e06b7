"""Contextual MoL feature-set cards, timing only: each row's decision timed on a quiet machine
after its heads were trained `--untimed` (on a loaded one), written into the card.

    python -m engine_ext.routers.contextual_timing --time-card CARD [--settings S ...]
        [--shape-only]
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from engine_ext.routers.contextual_features import FEATURE_CACHE
from engine_ext.routers.mol2 import num_params
from engine_ext.routers.run_contextual import D_HEAD, head_file, time_feature_decisions
from engine_ext.routers.train import TRAINING_SEPARATOR
from engine_ext.routing import ContextualHead

COMMAND = "python -m engine_ext.routers.contextual_timing --time-card CARD"
TIMING_CLAUSE = re.compile(r"; decision (times pending \(not timed on a loaded machine: "
                           r"python -m engine_ext\.routers\.\w+ --time-card CARD\)|timed "
                           r"afterwards on a quiet machine with .*? \("
                           + re.escape(COMMAND) + r"\))")
"""The clause an `--untimed` training run leaves in a setting's training text, or the one a
timing-only run wrote there."""


def time_card(card_path: Path, heads_dir: Path, engine, tokenize, sets: dict,
              only: set[str] | None = None, shape_only: bool = False) -> None:
    """Timing only: time the decisions of a feature-set card's rows (those in `only`, when
    given) with the seed-0 heads its training kept, and write them (and this machine as the
    card's hardware) into the card. shape_only: a row whose saved head is missing is timed with
    a head of its recorded shape (the same layers and parameter count, untrained weights):
    the decision's work does not depend on the weights' values."""

    from engine_ext.routers.layer_cache import FeatureSpec
    from engine_ext.routers.measure import hardware
    from sim.strategies.router_card import load_router_card, write_router_card

    card = load_router_card(card_path)
    spec = spec_of(card.training, FeatureSpec)
    rows, timed = [], {}
    for row in card.settings:
        if only is not None and row.setting not in only:
            rows.append(row)
            continue
        path = head_file(heads_dir, card.name, row.setting)
        head = _saved_head(path) if path.exists() or not shape_only else \
            _head_of_shape(row, spec, engine.cfg.hidden_size)
        head.eval()
        decision = time_feature_decisions(engine, head, spec, sets[row.setting], tokenize)
        rows.append(row.model_copy(update={"decision": decision}))
        timed[row.setting] = "its saved seed-0 head" if path.exists() else \
            "a head of its recorded shape (untrained weights: the same work)"
        print(f"timed {card.name} {row.setting} ({timed[row.setting]}): "
              f"p50 {decision.p50_ms:.2f} ms", flush=True)
    write_router_card(card.model_copy(update={
        "settings": tuple(rows), "hardware": hardware(),
        "training": timed_text(card.training, timed)}), card_path)
    print(f"wrote {card_path}")


def _saved_head(path: Path) -> ContextualHead:
    from safetensors.torch import load_file

    state = load_file(str(path))
    head = ContextualHead(state["q.weight"].shape[1], D_HEAD, d_option=state["k.weight"].shape[1],
                          num_options=state["query_logits.weight"].shape[0]
                          if "query_logits.weight" in state else None)
    head.load_state_dict(state)
    return head


def _head_of_shape(row, spec, hidden: int) -> ContextualHead:
    """A head of the row's recorded size: the query is the spec's pooled layers side by side,
    the options one layer's states; with a query-only term when the recorded size has one."""
    width = len(spec.layers) * len(spec.poolings) * hidden
    for num_options in (None, row.num_options):
        head = ContextualHead(width, D_HEAD, d_option=hidden, num_options=num_options)
        if num_params(head) == row.work.num_head_params:
            return head
    raise ValueError(f"{row.setting}: no head of {row.work.num_head_params} parameters fits the "
                     f"feature set (query width {width}, option width {hidden}, d_head {D_HEAD})")


def timed_text(training: str, timed: dict[str, str]) -> str:
    """The card's training text with the timing clause ('decision times pending', or how an
    earlier timing-only run timed it) of each timed setting's segment ('setting: ...'; a card
    of one run has one unnamed segment) replaced by how it was timed now."""
    segments = []
    for segment in training.split(TRAINING_SEPARATOR):
        setting = segment.split(":", 1)[0]
        how = timed.get(setting) if setting in timed else "; ".join(
            f"{name}: {text}" for name, text in timed.items()) if " " in setting else None
        if how:
            segment = TIMING_CLAUSE.sub(
                f"; decision timed afterwards on a quiet machine with {how} ({COMMAND})",
                segment)
        segments.append(segment)
    return TRAINING_SEPARATOR.join(segments)


def spec_of(training: str, spec_type):
    """The feature set a card's training text names ('... the feature set L-1,0,8 mean+max
    (...')."""
    if "the feature set " not in training:
        raise ValueError("the card's training text names no feature set: not a feature-set card")
    layers, poolings = training.split("the feature set ", 1)[1].split(" (", 1)[0].split(" ")
    return spec_type(tuple(int(x) for x in layers.removeprefix("L").split(",")),
                     tuple(poolings.split("+")))


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Contextual MoL feature-set cards: timing only")
    parser.add_argument("--time-card", type=Path, required=True)
    parser.add_argument("--heads", type=Path,
                        default=FEATURE_CACHE / "heads")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--settings", nargs="+", help="time these rows only (default: all)")
    parser.add_argument("--shape-only", action="store_true",
                        help="time a row whose saved head is missing with a head of its "
                             "recorded shape (untrained weights; the work is the same)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from engine_ext.data import default_text_dir
    from engine_ext.routers.settings import load_settings
    from engine_ext.routers.states import load_route_engine, turn_ids

    engine, tokenizer = load_route_engine()
    time_card(args.time_card, args.heads, engine, lambda t: turn_ids(tokenizer, t),
              load_settings(default_text_dir()),
              only=set(args.settings) if args.settings else None, shape_only=args.shape_only)


if __name__ == "__main__":
    main()
