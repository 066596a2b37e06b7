"""The routing settings the routers are trained and measured on, with their fixed sizes."""

from __future__ import annotations

import random
from pathlib import Path

from engine_ext.routers.datasets import (
    RoutingSet,
    RoutingSplit,
    banking77_set,
    clinc_sets,
    domains4_set,
)

DATA_SEED = 0
"""Seed of the split subsampling (fixed: every router and training seed sees the same data)."""
CLINC_PER_INTENT = {"train": 10, "val": 2, "test": 5}
BANKING_PER_CLASS = {"train": 10, "val": 2, "test": 5}
DOMAINS4_PER_DOMAIN = {"train": 100, "val": 20, "test": 50}
"""Rows per class of each split (the repository's slices give what they hold)."""
LARGE_TRAIN_PER_CLASS = 30
"""Training rows per class of CLINC150 and BANKING77 for the routers whose heads read cached
pooled states (MoL2, the probes): 4,500 of CLINC150's 15,000 and 2,310 of BANKING77's 9,002,
what one SmolLM2 pass over the training text costs on a shared 2-core machine (about 15 min per
5,000 utterances). Validation and test stay the same."""
SUBSAMPLE_SEED = 0
"""Seed of the per-router subsamples of a split (Contextual MoL, L0), fixed like DATA_SEED."""


def load_settings(text_dir: Path, train_per_class: int | None = None,
                  val_per_class: int | None = None) -> dict[str, RoutingSet]:
    """domains4, clinc_domains10, clinc_intents150 and banking77, by name; `train_per_class`
    and `val_per_class` replace the training and validation rows per class of CLINC150 and
    BANKING77 (validation: CLINC150's own split, BANKING77's every 10th training row; never
    test rows)."""
    train = {} if train_per_class is None else {"train": train_per_class}
    train |= {} if val_per_class is None else {"val": val_per_class}
    domains10, intents150 = clinc_sets(text_dir, CLINC_PER_INTENT | train, DATA_SEED)
    sets = [domains4_set(DOMAINS4_PER_DOMAIN, DATA_SEED), domains10, intents150,
            banking77_set(text_dir, BANKING_PER_CLASS | train, DATA_SEED)]
    return {s.name: s for s in sets}


def short_names(routing_set: RoutingSet) -> tuple[str, ...]:
    """Option names as the per-query routers read them (Contextual MoL's pass, L0's prompt)."""
    return tuple(o.replace("_", " ") for o in routing_set.options)


def subsample(split: RoutingSplit, num: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A seeded subsample of `num` (texts, labels) of a split, in split order (all of it when
    smaller)."""
    pick = sorted(random.Random(SUBSAMPLE_SEED).sample(range(len(split)), min(num, len(split))))
    return tuple(split.texts[i] for i in pick), tuple(split.labels[i] for i in pick)
