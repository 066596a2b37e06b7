"""Real request traces as workloads: Azure (CSV), Mooncake (JSON lines with prefix-block hash
ids), ServeGen per-client rates as adapter popularity. Bad files fail with FILE:LINE messages.

The repository ships small slices of each trace in data/traces (see data/README.md). Point the
environment variable MOLCAP_DATA_DIR at a folder laid out the same way (traces/<dataset>/...) to
use the full upstream files instead.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from sim.workload.generate import Workload, popularity_domains, single_turn_workload

DATA_DIR_ENV = "MOLCAP_DATA_DIR"
"""Environment variable naming a data folder with the full traces (default: the repository's)."""
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DATA_DIR = Path(os.environ.get(DATA_DIR_ENV) or REPO_DATA_DIR)
TRACES_DIR = DATA_DIR / "traces"
SERVEGEN_RATES = "client_rates.csv"
"""The shipped ServeGen slice: one mean rate per client (data/cut_slices.py writes it)."""


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


MAX_TOKENS = 100_000_000
"""Largest token count a trace cell may hold (far above any model's context)."""


def _parse_time(text: str, unit: str, where: str) -> float:
    try:
        if unit == "datetime":
            return datetime.fromisoformat(str(text).strip()[:26]).timestamp()
        value = float(text)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"{where}: cannot parse arrival time {text!r} as {unit}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: arrival time {text!r} is not a finite time >= 0")
    return value / 1000.0 if unit == "ms" else value


def _parse_int(value, column: str, where: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"{where}: column {column!r}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise TraceError(f"{where}: column {column!r}: {value!r} is not a finite number")
    if number < 0:
        raise TraceError(f"{where}: column {column!r}: {value!r} is negative")
    if number > MAX_TOKENS:
        raise TraceError(f"{where}: column {column!r}: {value!r} is above {MAX_TOKENS} tokens")
    return int(number)


def _hash_ids(value, column: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                              for h in value):
        raise TraceError(f"{where}: column {column!r}: hash ids must be a list of integers")
    return tuple(value)


def read_trace_rows(path: Path, fmt: str, max_rows: int | None) -> list[tuple[str, dict]]:
    """(location, row) pairs of a CSV (header row) or JSON-lines file."""
    if path.exists() and not path.is_file():
        raise TraceError(f"{path}: is not a file")
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    rows: list[tuple[str, dict]] = []
    line = [0]  # the line being read, for errors raised while reading it
    try:
        with path.open(encoding="utf-8", newline="") as f:
            reader = _csv_rows(f, line) if fmt == "csv" else _jsonl_rows(f, line)
            for line_no, row in reader:
                rows.append((f"{path}:{line_no}", row))
                if max_rows is not None and len(rows) >= max_rows:
                    break
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: cannot read: byte 0x{err.object[err.start]:02x} is not UTF-8 "
                         f"text (near line {line[0] + 1})") from None
    except csv.Error as err:
        raise TraceError(f"{path}:{line[0]}: not CSV: {err}") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror or err}") from None
    if not rows:
        raise TraceError(f"{path}: no rows")
    return rows


def _csv_rows(f, line: list[int]):
    reader = csv.DictReader(f)
    for row in reader:
        line[0] = reader.line_num
        yield reader.line_num, row


def _jsonl_rows(f, line: list[int]):
    for line_no, text in enumerate(f, start=1):
        line[0] = line_no
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise TraceError(f"{f.name}:{line_no}: not JSON: "
                             f"{getattr(err, 'msg', 'nested too deeply')}") from None
        if not isinstance(row, dict):
            raise TraceError(f"{f.name}:{line_no}: a JSON object is needed, got "
                             f"{type(row).__name__}")
        yield line_no, row


def _cached_rows(path: Path, fmt: str) -> list[tuple[str, dict]]:
    """Every row of a trace, read once per file version (the capacity search cuts the same trace
    for every point it simulates)."""
    try:
        stat = path.stat()
    except OSError:
        return read_trace_rows(path, fmt, None)  # raises the located "no such file"
    return _rows_of_version(str(path), fmt, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _rows_of_version(path: str, fmt: str, mtime_ns: int, size: int) -> list[tuple[str, dict]]:
    return read_trace_rows(Path(path), fmt, None)


_COLUMN_NAME = re.compile(r"^[A-Za-z_][\w .()\[\]/-]{0,39}$")


def _found(row: dict) -> str:
    """The columns a file has, named only when they look like column names: the file may not be
    a trace at all, and its contents are not echoed."""
    names = [str(k) for k in row]
    if not all(_COLUMN_NAME.match(n) for n in names):
        return f"its first row has {len(names)} field(s) that are not column names (a trace file?)"
    shown = sorted(names)[:20]
    return f"found {shown}" + (f" and {len(names) - 20} more" if len(names) > 20 else "")


@dataclass(frozen=True)
class TraceTable:
    """The replayed rows of a trace, in arrival order, with their file locations."""

    where: list[str]
    """FILE:LINE of each row."""
    rows: list[dict]
    arrival_s: np.ndarray
    """Arrival times as read (seconds, not shifted or rate-scaled)."""
    input_tokens: np.ndarray
    """Prompt tokens, after `length_scale`."""
    output_tokens: np.ndarray
    """Output tokens, after `length_scale`."""


def read_trace(path: str | Path, *, fmt: str = "csv", arrival_column: str = "timestamp",
               input_column: str = "input_length", output_column: str = "output_length",
               hash_ids_column: str | None = None, adapter_column: str | None = None,
               time_unit: str = "s", length_scale: float = 1.0,
               max_requests: int | None = None) -> TraceTable:
    """The rows a replay uses: every arrival parsed and sorted first, then the earliest
    `max_requests` rows kept and checked; a bad cell raises TraceError at FILE:LINE."""
    path = Path(path)
    rows = _cached_rows(path, fmt)
    needed = [arrival_column, input_column, output_column, hash_ids_column, adapter_column]
    missing = [c for c in needed if c is not None and c not in rows[0][1]]
    if missing:
        raise TraceError(f"{rows[0][0]}: missing column(s) {missing}; {_found(rows[0][1])}")
    arrival = np.array([_parse_time(r[arrival_column], time_unit, w) for w, r in rows])
    # Sorted before the cut: `max_requests` keeps the earliest requests, whatever the file order.
    order = np.argsort(arrival, kind="stable")[:max_requests]
    rows, arrival = [rows[i] for i in order], arrival[order]
    inputs = np.array([_parse_int(r[input_column], input_column, w) for w, r in rows])
    outputs = np.array([_parse_int(r[output_column], output_column, w) for w, r in rows])
    if hash_ids_column is not None:
        for w, r in rows:
            _hash_ids(r[hash_ids_column], hash_ids_column, w)
    return TraceTable(
        where=[w for w, _ in rows], rows=[r for _, r in rows], arrival_s=arrival,
        input_tokens=np.maximum(1, np.rint(inputs * length_scale)).astype(np.int64),
        output_tokens=np.maximum(1, np.rint(outputs * length_scale)).astype(np.int64))


def trace_workload(rng: np.random.Generator, path: str | Path, *, num_domains: int,
                   fmt: str = "csv", arrival_column: str = "timestamp",
                   input_column: str = "input_length", output_column: str = "output_length",
                   hash_ids_column: str | None = None, adapter_column: str | None = None,
                   time_unit: str = "s", hash_block_tokens: int = 512, rate_scale: float = 1.0,
                   length_scale: float = 1.0, max_requests: int | None = None,
                   domain_weights: np.ndarray | None = None) -> Workload:
    """Replay a trace: arrivals relative to the first row and divided by `rate_scale`, lengths
    multiplied by `length_scale`; adapters from a column, else drawn (by `domain_weights`)."""
    table = read_trace(path, fmt=fmt, arrival_column=arrival_column, input_column=input_column,
                       output_column=output_column, hash_ids_column=hash_ids_column,
                       adapter_column=adapter_column, time_unit=time_unit,
                       length_scale=length_scale, max_requests=max_requests)
    rows, count = table.rows, len(table.rows)
    arrival = (table.arrival_s - table.arrival_s.min()) / rate_scale
    if adapter_column is not None:
        names = [str(r[adapter_column]) for r in rows]
        codes = {n: i for i, n in enumerate(dict.fromkeys(names))}
        domains = np.array([codes[n] for n in names]) % num_domains
    elif domain_weights is not None:
        p = np.asarray(domain_weights, dtype=float)
        domains = rng.choice(p.size, size=count, p=p / p.sum()) % num_domains
    else:
        domains = popularity_domains(rng, count, num_domains, "uniform")
    hash_ids = None
    if hash_ids_column is not None:
        hash_ids = [r[hash_ids_column] for r in rows]
    return single_turn_workload(arrival, table.input_tokens, table.output_tokens, domains,
                                hash_ids, hash_block_tokens)


def servegen_client_rates(folder: str | Path = TRACES_DIR / "servegen_m_small") -> np.ndarray:
    """Mean request rate of each ServeGen client, ordered by id: from the full per-client series
    (chunk-<id>-trace.csv) when the folder has them, else from the shipped client_rates.csv."""
    folder = Path(folder)
    files = sorted(folder.glob("chunk-*-trace.csv"), key=lambda p: int(p.stem.split("-")[1]))
    if not files and (folder / SERVEGEN_RATES).is_file():
        return _read_client_rates(folder / SERVEGEN_RATES)
    if not files:
        raise TraceError(f"{folder}: neither chunk-<id>-trace.csv files nor {SERVEGEN_RATES}")
    rates = []
    for file in files:
        data = np.genfromtxt(file, delimiter=",", usecols=(1,), invalid_raise=False)
        if data.size == 0 or np.isnan(data).all():
            raise TraceError(f"{file}:1: no readable rate_rps column")
        rates.append(float(np.nanmean(data)))
    return np.array(rates)


def _read_client_rates(path: Path) -> np.ndarray:
    rates = []
    with path.open(encoding="utf-8") as f:
        for line_no, row in enumerate(csv.DictReader(f), start=2):
            try:
                rates.append(float(row["mean_rate_rps"]))
            except (KeyError, TypeError, ValueError):
                raise TraceError(f"{path}:{line_no}: mean_rate_rps is not a number") from None
    if not rates:
        raise TraceError(f"{path}: no rows")
    return np.array(rates)


def servegen_popularity(num_domains: int, folder: str | Path | None = None) -> np.ndarray:
    """Adapter popularity weights: the `num_domains` busiest ServeGen clients' mean rates."""
    rates = servegen_client_rates(folder or TRACES_DIR / "servegen_m_small")
    return np.sort(rates)[::-1][:num_domains]
