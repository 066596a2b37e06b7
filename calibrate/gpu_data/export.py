"""`import_dataset` (find a dataset, run its importer) and `write_records` (parquet + CSV per
record kind); `run` is what `molcap calibrate import` does; `main` the same as a module
command line without Typer.

    python -m calibrate.gpu_data agullo-dt --data-dir "$MOLCAP_DATA_DIR" --out out/gpu/agullo-dt

The data root holds `gpu/<dataset>/` (and Splitwise under `perf/`), as the team's shared data and
the repository's `data/` slices do; without --data-dir, $MOLCAP_DATA_DIR, else the slices.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from calibrate.gpu_data.base import DatasetMissingError, GpuDataError, ImportResult, data_dir

REPO_DATA = Path(__file__).resolve().parents[2] / "data"


def _importers() -> dict[str, tuple[Callable[[Path], ImportResult], tuple[str, ...]]]:
    """Dataset name -> (importer, folders it may sit in under the data root)."""
    from calibrate.gpu_data.agullo import import_agullo
    from calibrate.gpu_data.llmservingsim import import_llmservingsim
    from calibrate.gpu_data.memory_gap import import_memory_gap
    from calibrate.gpu_data.splitwise import import_splitwise
    from calibrate.gpu_data.vidur import import_vidur

    return {
        "agullo-dt": (import_agullo, ("gpu/agullo-dt",)),
        "memory-gap": (import_memory_gap, ("gpu/memory-gap",)),
        "vidur": (import_vidur, ("gpu/vidur",)),
        "llmservingsim-profiles": (import_llmservingsim, ("gpu/llmservingsim-profiles",)),
        "splitwise": (import_splitwise, ("perf", "gpu/splitwise")),
    }


def dataset_names() -> tuple[str, ...]:
    return tuple(_importers())


def locate(dataset: str, root: Path) -> Path:
    """The dataset's folder under the data root `root` (or `root` itself when it is the
    dataset folder: it holds the dataset's LICENSE but no `gpu/`)."""
    _, places = _importers()[dataset]
    for place in places:
        if (root / place).is_dir():
            return root / place
    if (root / "LICENSE").exists() and not (root / "gpu").exists():
        return root
    raise DatasetMissingError(
        f"{dataset}: no dataset folder under {root} (looked for {', '.join(places)})")


def import_dataset(dataset: str, root: Path | None = None) -> ImportResult:
    """Every record of `dataset` under the data root (default: $MOLCAP_DATA_DIR, else the
    repository's data/ slices). Raises DatasetMissingError or GpuDataError."""
    importers = _importers()
    if dataset not in importers:
        raise DatasetMissingError(
            f"dataset {dataset!r} is unknown; allowed: {', '.join(importers)}")
    base = data_dir(root) or REPO_DATA
    if not base.is_dir():
        raise DatasetMissingError(f"{dataset}: data folder {base} does not exist")
    return importers[dataset][0](locate(dataset, base))


def write_records(result: ImportResult, out: Path) -> list[Path]:
    """OUT/<kind>.parquet and OUT/<kind>.csv per record kind (tuples: lists in parquet,
    space-separated in CSV). Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, records in result.records.items():
        frame = _frame(records)
        frame.to_parquet(out / f"{kind}.parquet", index=False)
        flat = frame.copy()
        for column in flat.columns:
            if flat[column].map(lambda v: isinstance(v, tuple | list)).any():
                flat[column] = flat[column].map(lambda v: " ".join(map(str, v)))
            elif flat[column].map(lambda v: isinstance(v, dict)).any():
                flat[column] = flat[column].map(repr)
        flat.to_csv(out / f"{kind}.csv", index=False)
        written += [out / f"{kind}.parquet", out / f"{kind}.csv"]
    return written


def _frame(records: list) -> pd.DataFrame:
    """Records as columns, typed from the values: integer columns with missing values stay
    integers (Int64) instead of becoming floats."""
    frame = pd.DataFrame([asdict(r) for r in records], dtype=object)
    for column in frame.columns:
        values = frame[column].dropna()
        kinds = {type(v) for v in values}
        if kinds == {bool}:
            frame[column] = frame[column].astype("boolean" if len(values) < len(frame) else bool)
        elif kinds == {int}:
            frame[column] = frame[column].astype("Int64" if len(values) < len(frame) else "int64")
        elif kinds and kinds <= {int, float}:
            frame[column] = frame[column].astype(float)
        elif kinds == {str}:
            frame[column] = frame[column].astype(str)
    return frame


def run(dataset: str, data_root: Path | None, out: Path) -> ImportResult:
    """Import and write: what `molcap calibrate import` does."""
    result = import_dataset(dataset, data_root)
    write_records(result, out)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate.gpu_data",
                                     description="Import a public GPU dataset into records.")
    parser.add_argument("dataset", help=f"one of: {', '.join(dataset_names())}")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data root holding gpu/<dataset> (default: $MOLCAP_DATA_DIR, "
                             "else the repository's data/ slices)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        result = run(args.dataset, args.data_dir, args.out)
    except (DatasetMissingError, GpuDataError) as err:
        print(f"calibrate import: {err}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0
