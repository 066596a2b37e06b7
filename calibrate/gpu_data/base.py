"""Shared pieces of the GPU dataset importers: located errors, typed CSV cells, the import result.

Every record an importer returns carries `source_file` (relative to the dataset folder) and
`source_line` (1-based line of a text file; 1-based index of an array element for `.npy` files),
so any number can be traced back to the upstream file it came from.
"""

from __future__ import annotations

import csv
import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR_ENV = "MOLCAP_DATA_DIR"


class GpuDataError(ValueError):
    """A malformed or unknown value in a dataset file, located by file, line and field."""

    def __init__(self, file: str, line: int, field_name: str, value: object, allowed: str):
        self.file, self.line, self.field_name, self.value = file, line, field_name, value
        super().__init__(f"{file}:{line}: {field_name}={value!r}: {allowed}")


class DatasetMissingError(FileNotFoundError):
    """A dataset folder that is absent or lacks a file the importer needs (one-line message)."""


@dataclass
class ImportResult:
    """What one dataset import produced: records per kind, and rows legitimately left out."""

    dataset: str
    records: dict[str, list] = field(default_factory=dict)
    """Kind -> frozen records, in file order."""
    excluded: dict[str, int] = field(default_factory=dict)
    """Reason -> rows or runs not turned into records (failed runs, ...), never silent."""
    absent_parts: list[str] = field(default_factory=list)
    """Optional parts of the dataset not present in this folder (a slice holds fewer)."""

    def add(self, kind: str, items: list) -> None:
        self.records.setdefault(kind, []).extend(items)

    def exclude(self, reason: str, count: int = 1) -> None:
        self.excluded[reason] = self.excluded.get(reason, 0) + count

    def summary(self) -> str:
        """One line: rows per kind, then exclusions and absent parts."""
        kinds = ", ".join(f"{kind} {len(rows):,}" for kind, rows in self.records.items())
        line = f"{self.dataset}: {kinds or 'no records'}"
        if self.excluded:
            line += "; excluded: " + ", ".join(f"{n:,} {why}" for why, n in self.excluded.items())
        if self.absent_parts:
            line += "; not in this folder: " + ", ".join(self.absent_parts)
        return line


def rel(path: Path, root: Path) -> str:
    """`path` relative to the dataset folder, with forward slashes."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def read_csv_rows(path: Path, root: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """(line, row) of a CSV file (gzip when it ends in .gz) whose header must hold `columns`;
    a row with a different number of cells is a located error."""
    name = rel(path, root)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise GpuDataError(name, 1, "header", "", "the file is empty")
        missing = [c for c in columns if c not in header]
        if missing:
            raise GpuDataError(name, 1, "header", ",".join(header),
                               f"missing column(s) {', '.join(missing)}")
        for row in reader:
            line = reader.line_num
            if len(row) != len(header):
                raise GpuDataError(name, line, "row", ",".join(row),
                                   f"{len(header)} cells expected, {len(row)} found")
            yield line, dict(zip(header, row, strict=True))


@dataclass(frozen=True)
class Cell:
    """Parses one CSV cell with its location, so a bad value names file, line and field."""

    file: str
    line: int
    row: dict

    def float(self, name: str, *, optional: bool = False, min_value: float | None = 0.0):
        raw = self.row[name].strip()
        if raw == "" and optional:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise GpuDataError(self.file, self.line, name, raw, "a number expected") from None
        if value != value or (min_value is not None and value < min_value):
            raise GpuDataError(self.file, self.line, name, raw,
                               f"a number >= {min_value} expected")
        return value

    def int(self, name: str, *, optional: bool = False, min_value: int = 0):
        value = self.float(name, optional=optional, min_value=min_value)
        if value is None:
            return None
        if value != int(value):
            raise GpuDataError(self.file, self.line, name, self.row[name], "an integer expected")
        return int(value)

    def str(self, name: str, *, allowed: tuple[str, ...] | None = None) -> str:
        value = self.row[name].strip()
        if allowed is not None and value not in allowed:
            raise GpuDataError(self.file, self.line, name, value,
                               f"allowed: {', '.join(allowed)}")
        return value

    def floats(self, name: str) -> tuple[float, ...]:
        """A space-separated list of numbers ('' -> ())."""
        raw = self.row[name].strip()
        try:
            return tuple(float(x) for x in raw.split())
        except ValueError:
            raise GpuDataError(self.file, self.line, name, raw,
                               "space-separated numbers expected") from None


def data_dir(explicit: Path | None) -> Path | None:
    """The data root: `explicit`, else $MOLCAP_DATA_DIR, else None (the caller falls back)."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else None


def require(root: Path, dataset: str, parts: tuple[str, ...]) -> None:
    """One-line DatasetMissingError when `root` or any of `parts` under it is absent."""
    if not root.is_dir():
        raise DatasetMissingError(f"{dataset}: dataset folder {root} does not exist")
    missing = [p for p in parts if not (root / p).exists()]
    if missing:
        raise DatasetMissingError(f"{dataset}: {root} is incomplete: missing {', '.join(missing)}")


def text_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (undecodable bytes replaced: logs hold terminal output)."""
    return open(path, encoding="utf-8", errors="replace").read().splitlines()
