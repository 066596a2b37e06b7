"""Benchmark results as data: one JSON file per benchmark under bench/results/.

Each file holds a title, a paragraph on what is measured, the value columns (with units in their
labels) and the rows. Every row says on which machine, at which load average and when it was
measured, the commit when known, and where the numbers come from, because on a shared machine a
number without its load is not comparable with another. `bench/tables.py` renders every file into
docs/benchmarks.md; the benchmark scripts append their rows with `append_rows`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULTS_DIR_ENV = "MOLCAP_BENCH_RESULTS_DIR"
"""Set to another folder to keep a trial run's rows out of the committed results."""

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Value = str | int | float | None


class Column(BaseModel):
    """One value column of a benchmark's table."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key: Text
    """The key of the value in each row's `values`."""
    label: Text
    """The column heading, with its unit."""


class ResultRow(BaseModel):
    """One measurement: the values and the conditions they were measured under."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    machine: Text
    """What ran it: processor, cores, and whether the machine was shared."""
    load_average: Text | float
    """The 1-minute load average while it ran (a number, or a range such as "1.0-1.3")."""
    date: Text
    """When it ran, UTC (an ISO timestamp, or a date with a time range)."""
    commit: Text | None = None
    """The commit of the code measured, when known."""
    source: Text
    """Where the numbers come from: the command run, or the document they were copied from."""
    values: dict[str, Value]
    """The measured values by column key."""


class BenchmarkResults(BaseModel):
    """A benchmark's results file."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    benchmark: Text
    """The file's name without .json, e.g. bench_sim."""
    title: Text
    about: Text
    """What is measured and how to reproduce it."""
    columns: list[Column] = Field(min_length=1)
    rows: list[ResultRow] = []

    @model_validator(mode="after")
    def _values_have_columns(self) -> BenchmarkResults:
        keys = [c.key for c in self.columns]
        if len(set(keys)) != len(keys):
            raise ValueError(f"columns: a key appears twice (given: {keys})")
        for i, row in enumerate(self.rows):
            unknown = sorted(set(row.values) - set(keys))
            if unknown:
                raise ValueError(f"rows.{i}.values: keys {unknown} have no column "
                                 f"(allowed: {keys})")
        return self


class ResultsError(ValueError):
    """A results file that cannot be read; the message names the file, the row and the field."""


def load_results(path: Path) -> BenchmarkResults:
    """Read and validate one results file, or raise ResultsError naming what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ResultsError(f"{display(path)}: cannot read: {error}") from None
    try:
        return BenchmarkResults.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        if not first["loc"]:  # a cross-field rule: its message names the place
            message = first["msg"].removeprefix("Value error, ")
            raise ResultsError(f"{display(path)}: {message}") from None
        where = ".".join(str(part) for part in first["loc"])
        given = first.get("input")
        shown = "" if isinstance(given, dict | list) else f" (given: {given!r})"
        raise ResultsError(f"{display(path)}: {where}: {first['msg']}{shown}") from None


def display(path: Path) -> str:
    """A path relative to the repository when it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def machine_description() -> str:
    """Processor model and core count of this machine, from /proc/cpuinfo where there is one."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, {platform.system()}"


def current_commit() -> str | None:
    """The checked-out commit (short hash, "-dirty" with uncommitted changes), if in git."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def results_dir() -> Path:
    """bench/results, or the folder named by MOLCAP_BENCH_RESULTS_DIR."""
    return Path(os.environ.get(RESULTS_DIR_ENV) or RESULTS_DIR)


def append_rows(benchmark: str, values: list[dict[str, Value]], *, source: str,
                load_average: float | str | None = None) -> Path:
    """Append measured rows to bench/results/<benchmark>.json, stamped with this machine, the load
    average during the runs (`load_average`, e.g. "0.4-1.2"; by default the 1-minute load average
    now), the time and the commit. A key no column has yet gets a column headed by the key; a
    missing file is created with a plain title, to be worded by hand."""
    path = results_dir() / f"{benchmark}.json"
    if path.exists():
        current = load_results(path)
    else:
        current = BenchmarkResults(benchmark=benchmark, title=benchmark,
                                   about=f"Rows appended by {source}.",
                                   columns=[Column(key=k, label=k) for k in values[0]])
    known = [c.key for c in current.columns]
    new_keys = [k for k in dict.fromkeys(k for v in values for k in v) if k not in known]
    if load_average is None:
        load_average = round(os.getloadavg()[0], 2)
    stamp = dict(machine=machine_description(), load_average=load_average,
                 date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                 commit=current_commit(), source=source)
    updated = BenchmarkResults.model_validate(current.model_dump() | dict(
        columns=[*current.model_dump()["columns"], *(dict(key=k, label=k) for k in new_keys)],
        rows=[*current.model_dump()["rows"], *(dict(stamp, values=v) for v in values)]))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(updated.model_dump(), indent=1, ensure_ascii=False) + "\n",
                       encoding="utf-8")
    partial.replace(path)
    return path
