"""Routing data from real labelled text: fixed, seeded train/validation/test splits.

Settings (each a `RoutingSet`: options with descriptions, and three splits of (text, label)):
* `domains4`: the project's four domain corpora (chat, code, legal, prose; `engine_ext.data`),
  one snippet of a few lines per sample, split by position (train from the first 80% of each
  text, validation the next 10%, test the last 10%) so no snippet crosses splits;
* `clinc_domains10`: CLINC150 utterances labelled by their domain (domains.json groups the 150
  intents into 10 domains);
* `clinc_intents150`: the same utterances labelled by intent (the many-candidate setting);
* `banking77`: BANKING77's 77 fine-grained banking intents (validation carved from its train).

CLINC150 keeps its own train/val/test; every split is subsampled per class with a fixed seed
(the data seed, independent of the training seeds). Text lives in `data/text/` of the repository
(small slices, enough for tests) or, for training, in the full copies under $MOLCAP_DATA_DIR/text
(`full_text_dir`); the file layout is the same.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from engine_ext.data import REPO_TEXT_DIR, default_text_dir, full_text_dir  # noqa: F401

CLINC_FULL, CLINC_SLICE = "data_full.json", "data_slice.json"
DOMAIN_DESCRIPTIONS = {
    "chat": "chat: everyday requests and questions a user asks an assistant",
    "code": "code: Python source code, functions, classes and imports",
    "legal": "legal: software license terms, conditions, warranty and liability",
    "prose": "prose: technical documentation written in English sentences",
}


class RoutingDataError(ValueError):
    """A routing data file or split that cannot be used; names the file and the field."""

    def __init__(self, file: Path | str, field: str, message: str) -> None:
        super().__init__(f"{file}: {field}: {message}")
        self.file, self.field = str(file), field


@dataclass(frozen=True)
class RoutingSplit:
    """Texts and their option index."""

    texts: tuple[str, ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class RoutingSet:
    """One routing setting: options (name and description) and train/val/test splits."""

    name: str
    options: tuple[str, ...]
    descriptions: tuple[str, ...]
    train: RoutingSplit
    val: RoutingSplit
    test: RoutingSplit
    sources: tuple[str, ...]
    """Files the text came from."""

    def split(self, name: str) -> RoutingSplit:
        """'train', 'val' or 'test'."""
        return {"train": self.train, "val": self.val, "test": self.test}[name]


def source_name(dataset: str, path: Path) -> str:
    """How a card names a data file: the dataset and its path relative to $MOLCAP_DATA_DIR
    (the full copies) or to the repository (the slices), never this machine's absolute path."""
    path = Path(path).resolve()
    full = full_text_dir()
    for root, label in ((full.parent.resolve() if full else None, "MOLCAP_DATA_DIR"),
                        (REPO_TEXT_DIR.parents[1], "repository")):
        if root is not None and path.is_relative_to(root):
            return f"{dataset} ({label}/{path.relative_to(root).as_posix()})"
    return f"{dataset} ({path.name})"


def readable(name: str) -> str:
    """'credit_cards' -> 'credit cards'."""
    return name.replace("_", " ")


def _per_class(items: list[tuple[str, int]], num_per_class: int | None, seed: int,
               file: Path, field: str) -> RoutingSplit:
    """Up to num_per_class items of every label (seeded), in a seeded order."""
    if not items:
        raise RoutingDataError(file, field, "split is empty")
    rng = random.Random(seed)
    by_label: dict[int, list[str]] = {}
    for text, label in items:
        by_label.setdefault(label, []).append(text)
    chosen = []
    for label in sorted(by_label):
        texts = sorted(by_label[label])
        rng.shuffle(texts)
        chosen += [(t, label) for t in texts[:num_per_class]]
    rng.shuffle(chosen)
    return RoutingSplit(tuple(t for t, _ in chosen), tuple(lab for _, lab in chosen))


def _clinc_file(root: Path) -> Path:
    folder = root / "clinc150"
    for name in (CLINC_FULL, CLINC_SLICE):
        if (folder / name).exists():
            return folder / name
    raise RoutingDataError(folder, CLINC_FULL, f"neither {CLINC_FULL} nor {CLINC_SLICE} found")


def _read_clinc(root: Path) -> tuple[Path, dict, dict[str, list[str]]]:
    path = _clinc_file(root)
    data = json.loads(path.read_text())
    domains = json.loads((root / "clinc150" / "domains.json").read_text())
    for split in ("train", "val", "test"):
        rows = data.get(split)
        if not rows:
            raise RoutingDataError(path, split, "split is missing or empty")
        bad = next((r for r in rows if len(r) != 2 or not r[0] or not r[1]), None)
        if bad is not None:
            raise RoutingDataError(path, split, f"unlabelled or malformed row {bad!r}; "
                                   "each row is [utterance, intent]")
    return path, data, domains


def clinc_sets(root: Path, per_intent: dict[str, int | None], seed: int = 0
               ) -> tuple[RoutingSet, RoutingSet]:
    """CLINC150 as 10 domains and as 150 intents, over the same sampled utterances."""
    path, data, domains = _read_clinc(root)
    domain_names = tuple(sorted(domains))
    intent_names = tuple(sorted(i for d in domain_names for i in domains[d]))
    domain_of = {i: d for d in domain_names for i in domains[d]}
    splits = {}
    for split in ("train", "val", "test"):
        unknown = sorted({intent for _, intent in data[split]} - set(domain_of))
        if unknown:
            raise RoutingDataError(path, split, f"intents {unknown[:5]} are in no domain of "
                                   "domains.json")
        items = [(text, intent_names.index(intent)) for text, intent in data[split]]
        splits[split] = _per_class(items, per_intent.get(split), seed, path, split)

    def relabel(s: RoutingSplit) -> RoutingSplit:
        return RoutingSplit(s.texts, tuple(domain_names.index(domain_of[intent_names[i]])
                                           for i in s.labels))

    sources = (source_name("CLINC150", path),
               source_name("CLINC150", root / "clinc150" / "domains.json"))
    intents = RoutingSet("clinc_intents150", intent_names,
                         tuple(readable(i) for i in intent_names), splits["train"], splits["val"],
                         splits["test"], sources)
    domain_desc = tuple(f"{readable(d)}: " + ", ".join(readable(i) for i in sorted(domains[d]))
                        for d in domain_names)
    domains10 = RoutingSet("clinc_domains10", domain_names, domain_desc,
                           *(relabel(splits[s]) for s in ("train", "val", "test")), sources)
    return domains10, intents


def banking77_set(root: Path, per_class: dict[str, int | None], seed: int = 0) -> RoutingSet:
    """BANKING77; validation is every 10th training row (by file order) per category."""
    folder = root / "banking77"
    names = tuple(sorted(json.loads((folder / "categories.json").read_text())))
    rows = {}
    for split in ("train", "test"):
        path = folder / f"{split}.csv"
        with path.open() as f:
            rows[split] = [(r["text"], r["category"]) for r in csv.DictReader(f)]
        bad = next((r for r in rows[split] if not r[0] or r[1] not in names), None)
        if bad is not None:
            raise RoutingDataError(path, "category", f"unlabelled or unknown row {bad!r}")
    train = [(t, names.index(c)) for k, (t, c) in enumerate(rows["train"]) if k % 10]
    val = [(t, names.index(c)) for k, (t, c) in enumerate(rows["train"]) if not k % 10]
    test = [(t, names.index(c)) for t, c in rows["test"]]
    splits = [_per_class(items, per_class.get(s), seed, folder / f"{s}.csv", s)
              for s, items in (("train", train), ("val", val), ("test", test))]
    return RoutingSet("banking77", names, tuple(readable(n) for n in names), *splits,
                      (source_name("BANKING77", folder / "train.csv"),
                       source_name("BANKING77", folder / "test.csv")))


def _snippets(text: str, min_chars: int = 40, max_chars: int = 160) -> list[str]:
    """Consecutive non-empty lines joined until min_chars, cut at max_chars."""
    out, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.strip())
        if sum(len(c) for c in current) >= min_chars:
            out.append(" ".join(current)[:max_chars])
            current = []
    return out


def domains4_set(per_domain: dict[str, int | None], seed: int = 0,
                 max_bytes: int = 200_000) -> RoutingSet:
    """The project's four domain corpora as a routing set (positional 80/10/10 splits)."""
    from engine_ext.data import DOMAINS, domain_text

    splits: dict[str, list[tuple[str, int]]] = {"train": [], "val": [], "test": []}
    for label, domain in enumerate(DOMAINS):
        pieces = _snippets(domain_text(domain, max_bytes))
        a, b = int(len(pieces) * 0.8), int(len(pieces) * 0.9)
        for split, part in (("train", pieces[:a]), ("val", pieces[a:b]), ("test", pieces[b:])):
            splits[split] += [(p, label) for p in part]
    built = [_per_class(splits[s], per_domain.get(s), seed, f"engine_ext.data:{s}", s)
             for s in ("train", "val", "test")]
    return RoutingSet("domains4", DOMAINS, tuple(DOMAIN_DESCRIPTIONS[d] for d in DOMAINS),
                      *built, ("engine_ext.data.domain_text",))


def fingerprint(routing_set: RoutingSet) -> str:
    """sha256 of the options and every split: which exact data a router saw."""
    digest = hashlib.sha256()
    for part in (routing_set.options, routing_set.descriptions):
        digest.update("\x1f".join(part).encode())
    for split in (routing_set.train, routing_set.val, routing_set.test):
        digest.update("\x1f".join(split.texts).encode())
        digest.update(",".join(map(str, split.labels)).encode())
    return digest.hexdigest()[:16]
