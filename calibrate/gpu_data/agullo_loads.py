"""Per-load adapter timings of agullo-dt's `predictor_loading` runs, from the fork's server log.

The fork's `vllm/lora/worker_manager.py` logs, after every load, the cumulative count and
seconds of loads from disk (the adapter's files into the host cache) and, separately, of loads
from host memory into a GPU slot. At start-up the server registers `max_cpu_loras` adapters,
each loaded from disk and then into a slot; during the benchmark every request's adapter is
already in the host cache, so its loads are from host memory only. A host load whose count is
at most the run's number of disk loads is therefore a start-up load.

The repository's slice keeps only those log lines (`server_out.loads.log`, cut by
data/gpu/cut_agullo_loads.py); a full upstream `server_out.log` reads the same.
"""

from __future__ import annotations

import re
from pathlib import Path

from calibrate.gpu_data.agullo_records import AdapterLoadTimeRecord
from calibrate.gpu_data.base import GpuDataError, rel, text_lines

LOADING = "raw/digital_twin_dynamic/estimators/predictor_loading"
LOG_NAMES = ("server_out.loads.log", "server_out.log")
_LINE = re.compile(r"Total loads from (disk|memory): (\S+)\. "
                   r"Total loading time from (?:disk|memory): (\S+) seconds\.")
_RUN = re.compile(r"([^/]+)/adapter_rank_(\d+)/_(\d+)_$")


def read_load_times(root: Path) -> list[AdapterLoadTimeRecord]:
    """Every timed load of every predictor_loading run folder under `root`, in file order."""
    out = []
    for folder in sorted(p for p in (root / LOADING).glob("*/adapter_rank_*/_*_") if p.is_dir()):
        log = next((folder / n for n in LOG_NAMES if (folder / n).is_file()), None)
        if log is not None:
            out += read_run_loads(log, root)
    return out


def read_run_loads(log: Path, root: Path) -> list[AdapterLoadTimeRecord]:
    """The loads of one run's log (model and ranks from its folder names)."""
    name = rel(log, root)
    match = _RUN.search(log.parent.as_posix())
    if match is None:
        raise GpuDataError(name, 0, "folder", log.parent.name,
                           "<model>/adapter_rank_<r>/_<max_lora_rank>_ expected")
    model, rank, max_rank = match.group(1), int(match.group(2)), int(match.group(3))
    totals = {"disk": (0, 0.0), "memory": (0, 0.0)}
    rows = []
    for number, text in enumerate(text_lines(log), start=1):
        if "Total loads from" not in text:
            continue
        found = _LINE.search(text)
        if found is None:
            raise GpuDataError(name, number, "line", text.strip()[:120],
                               "'Total loads from disk|memory: N. Total loading time from "
                               "disk|memory: S seconds.' expected")
        kind, count = found.group(1), _number(found, 2, name, number, int)
        cumulative = _number(found, 3, name, number, float)
        last_count, last_total = totals[kind]
        if count != last_count + 1 or cumulative < last_total:
            raise GpuDataError(name, number, f"{kind} loads", f"{count}, {cumulative} s",
                               f"count {last_count + 1} and a total of at least "
                               f"{last_total} s (the log's totals only grow)")
        totals[kind] = (count, cumulative)
        rows.append((kind, count, cumulative - last_total, number))
    num_disk = totals["disk"][0]
    return [AdapterLoadTimeRecord(
        model=model, max_lora_rank=max_rank, adapter_rank=rank,
        source="disk" if kind == "disk" else "host",
        phase="startup" if kind == "disk" or count <= num_disk else "benchmark",
        load_index=count, seconds=seconds, source_file=name, source_line=number)
        for kind, count, seconds, number in rows]


def _number(found: re.Match, group: int, name: str, line: int, kind: type):
    try:
        return kind(found.group(group))
    except ValueError:
        raise GpuDataError(name, line, "number", found.group(group),
                           f"{'a whole' if kind is int else 'a decimal'} number expected"
                           ) from None
