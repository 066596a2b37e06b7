"""Read what `molcap run` and `molcap sweep` wrote under out/<name>/, without recomputing.

A run folder holds `report.html`, `comparisons.parquet` and `tables/*.parquet`; a sweep folder
`report.html` and `sweep.parquet`. Tables are read from parquet (CSV when parquet is absent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class OutputFolder:
    """One finished run or sweep."""

    path: Path
    kind: str
    """"run", "sweep", or "points" (only stored points, no tables yet)."""
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    report_path: Path | None = None
    num_points: int = 0
    """Finished points stored under points/."""


def _read(stem: Path) -> pd.DataFrame | None:
    parquet, csv = stem.with_suffix(".parquet"), stem.with_suffix(".csv")
    if parquet.exists():
        return pd.read_parquet(parquet)
    if csv.exists():
        return pd.read_csv(csv)
    return None


def list_output_folders(out_root: str | Path) -> list[Path]:
    """Folders under `out_root` that hold a run, a sweep or stored points, newest first."""
    root = Path(out_root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and (
        (p / "report.html").exists() or (p / "sweep.parquet").exists() or (p / "points").is_dir())]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def load_output_folder(path: str | Path) -> OutputFolder:
    """The tables of a run or sweep folder; raises FileNotFoundError when it holds neither."""
    path = Path(path)
    report = path / "report.html"
    points = len(list((path / "points").glob("*.json"))) if (path / "points").is_dir() else 0
    sweep = _read(path / "sweep")
    if sweep is not None:
        return OutputFolder(path, "sweep", {"sweep": sweep}, report if report.exists() else None,
                            points)
    tables = {}
    comparisons = _read(path / "comparisons")
    if comparisons is not None:
        tables["comparisons"] = comparisons
    for stem in sorted({p.with_suffix("") for p in (path / "tables").glob("*.*")}):
        df = _read(stem)
        if df is not None:
            tables[stem.name] = df
    if not tables and not points:
        raise FileNotFoundError(f"{path}: no run or sweep tables (report.html, comparisons.*, "
                                f"tables/*, sweep.*) and no stored points")
    return OutputFolder(path, "run" if tables else "points", tables,
                        report if report.exists() else None, points)


def sweep_parameters(table: pd.DataFrame) -> list[str]:
    """The varied fields of a sweep table: the columns between `point` and `strategy`."""
    columns = list(table.columns)
    if "point" not in columns or "strategy" not in columns:
        return []
    return columns[columns.index("point") + 1: columns.index("strategy")]
