"""Write the repository's small slices of CLINC150 and BANKING77 (data/text) from the full copies.

    python -m engine_ext.routers.slices [--src FULL_DATA/text] [--dst data/text]

A seeded, fixed number of rows per intent from each official split, in the original file formats
(`clinc150/data_slice.json` has the layout of `data_full.json`), plus the licences.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
from pathlib import Path

from engine_ext.data import REPO_TEXT_DIR, full_text_dir

CLINC_PER_INTENT = {"train": 3, "val": 1, "test": 2}
BANKING_PER_CLASS = {"train": 3, "test": 2}


def _take(rows: list, key, num: int, seed: int) -> list:
    rng = random.Random(seed)
    by_label: dict[str, list] = {}
    for row in rows:
        by_label.setdefault(key(row), []).append(row)
    out = []
    for label in sorted(by_label):
        group = list(by_label[label])
        rng.shuffle(group)
        out += group[:num]
    return out


def write_slices(src: Path, dst: Path, seed: int = 0) -> None:
    """Copy licences and category files; write seeded per-class slices."""
    (dst / "clinc150").mkdir(parents=True, exist_ok=True)
    (dst / "banking77").mkdir(parents=True, exist_ok=True)
    for name in ("clinc150/LICENSE", "clinc150/domains.json", "banking77/LICENSE",
                 "banking77/categories.json"):
        shutil.copyfile(src / name, dst / name)
    data = json.loads((src / "clinc150" / "data_full.json").read_text())
    clinc = {s: _take(data[s], lambda r: r[1], n, seed) for s, n in CLINC_PER_INTENT.items()}
    (dst / "clinc150" / "data_slice.json").write_text(json.dumps(clinc, indent=0) + "\n")
    for split, num in BANKING_PER_CLASS.items():
        with (src / "banking77" / f"{split}.csv").open() as f:
            rows = list(csv.DictReader(f))
        with (dst / "banking77" / f"{split}.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "category"])
            writer.writeheader()
            writer.writerows(_take(rows, lambda r: r["category"], num, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=full_text_dir(),
                        required=full_text_dir() is None)
    parser.add_argument("--dst", type=Path, default=REPO_TEXT_DIR)
    args = parser.parse_args(argv)
    write_slices(args.src, args.dst)
    print(f"wrote slices to {args.dst}")


if __name__ == "__main__":
    main()
