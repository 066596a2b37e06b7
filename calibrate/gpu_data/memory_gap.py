"""Importer of memory-gap (FerranAgulloLopez/vLLMBatchingMemoryGap): vLLM 0.5.2 fork (V0 engine)
without LoRA on the same 64 GB H100 as agullo-dt.

* `benchmarks/definitive_results/advisor/output_length/_<out>/<model>/_<max_num_seqs>__2000/`:
  2,000 fixed-length requests at once per run; `serving_run` (ServingRunRecord, `gpu_blocks`
  from cache_config.txt) and `forward_interval` records (the ~1 s engine metrics, differenced);
* `benchmarks_simple/**/log_*.out`: offline runs that prefill a batch, then decode it;
  `phase_timing` records.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from calibrate.gpu_data.agullo_runs import run_from_folder, run_model
from calibrate.gpu_data.base import (
    Cell,
    DatasetMissingError,
    GpuDataError,
    ImportResult,
    read_csv_rows,
    rel,
    text_lines,
)
from calibrate.gpu_data.bench_run import parse_launcher

DATASET = "memory-gap"
ADVISOR = "raw/benchmarks/definitive_results/advisor/output_length"
OFFLINE = "raw/benchmarks_simple/definitive_results"
METRICS = "metrics_engine.csv.gz"
METRIC_COLUMNS = ("time [s]", "scheduler_total_time", "model_forward_total_time",
                  "gpu_cache_usage_perc", "num_requests_running", "num_requests_waiting",
                  "num_preemptions_total", "request_success_total", "prompt_tokens_total",
                  "generation_tokens_total")


@dataclass(frozen=True)
class ForwardIntervalRecord:
    """One interval between consecutive ~1 s engine-metric samples of a serving run: the
    model-forward and scheduler seconds spent in it and the running batch at its end."""

    run_id: str
    model: str
    max_num_seqs: int | None
    output_len: int | None
    time_s: float
    """End of the interval, seconds since the server's metrics started."""
    interval_s: float
    forward_s: float
    """Model forward seconds inside the interval (difference of the cumulative counter)."""
    scheduler_s: float
    num_running: float
    num_waiting: float
    gpu_cache_usage: float
    prompt_tokens: float
    """Prompt tokens computed inside the interval."""
    generation_tokens: float
    preemptions: float
    finished_requests: float
    source_file: str
    source_line: int
    """Line of the interval's end sample (the previous line is its start)."""


@dataclass(frozen=True)
class PhaseTimingRecord:
    """An offline run (`decoding_offline_profiler.py`): `batch_size` prompts of `prompt_len`
    tokens prefilled (`prefill_s`), then decoded together for `output_len` tokens
    (`decode_s`). The log prints one line per engine loop iteration of each phase."""

    experiment: str
    """Folder under benchmarks_simple/definitive_results (analysis/prefill_vs_decode/...)."""
    model: str
    engine: str
    batch_size: int
    prompt_len: int
    output_len: int
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enforce_eager: bool
    prefill_s: float
    decode_s: float
    num_prefill_lines: int
    num_decode_lines: int
    total_gpu_memory_gib: float | None
    """vLLM's memory profile line (None when not logged)."""
    kv_cache_gib: float | None
    source_file: str
    source_line: int
    """Line of 'Decode elapsed time'."""


def import_memory_gap(root: Path) -> ImportResult:
    """`serving_run`, `forward_interval` and `phase_timing` records of the folders present."""
    if not root.is_dir():
        raise DatasetMissingError(f"{DATASET}: dataset folder {root} does not exist")
    parts = [p for p in (ADVISOR, OFFLINE) if (root / p).is_dir()]
    if not parts:
        raise DatasetMissingError(f"{DATASET}: {root} is incomplete: none of {ADVISOR}, {OFFLINE}")
    result = ImportResult(DATASET, absent_parts=[p for p in (ADVISOR, OFFLINE) if p not in parts])
    engine = _engine(root)
    if (root / ADVISOR).is_dir():
        read_advisor_runs(root, engine, result)
    if (root / OFFLINE).is_dir():
        read_phase_timings(root, result)
    return result


def _engine(root: Path) -> str:
    """The fork's version string from SOURCE.txt ('vllm 0.5.2.dev1210+g6f078ea3c')."""
    source = root / "SOURCE.txt"
    match = re.search(r"version string (\S+)", source.read_text()) if source.exists() else None
    return f"vllm {match.group(1).rstrip(',')}" if match else "vllm"


def read_advisor_runs(root: Path, engine: str, result: ImportResult) -> None:
    for launcher in sorted((root / ADVISOR).rglob("launcher.sh")):
        folder = launcher.parent
        run_id = rel(folder, root / "raw/benchmarks/definitive_results")
        _, run, _ = run_from_folder(folder, root, group="advisor/output_length", run_id=run_id)
        if run is None:
            result.exclude("advisor runs with no result")
            continue
        run = dataclasses.replace(run, engine=engine, gpu_blocks=_gpu_blocks(folder, root),
                                  output_len=_output_len(run, launcher, root))
        result.add("serving_run", [run])
        if (folder / METRICS).exists():
            result.add("forward_interval", read_forward_intervals(folder / METRICS, root, run))


def _output_len(run, launcher: Path, root: Path) -> int | None:
    raw = parse_launcher(launcher, root)
    return raw.get_int(raw.client, "--sharegpt-output-len") or run.output_len


def _gpu_blocks(folder: Path, root: Path) -> int | None:
    path = folder / "cache_config.txt"
    if not path.exists():
        return None
    for number, line in enumerate(text_lines(path), start=1):
        match = re.search(r'num_gpu_blocks="([^"]*)"', line)
        if match:
            if not match.group(1).isdigit():
                raise GpuDataError(rel(path, root), number, "num_gpu_blocks", match.group(1),
                                   "an integer expected")
            return int(match.group(1))
    return None


def read_forward_intervals(path: Path, root: Path, run) -> list[ForwardIntervalRecord]:
    """One record per pair of consecutive samples (the first sample starts the first one)."""
    name, out, previous = rel(path, root), [], None
    for line, row in read_csv_rows(path, root, METRIC_COLUMNS):
        cell = Cell(name, line, row)
        now = {c: cell.float(c) for c in METRIC_COLUMNS}
        if previous is not None:
            if now["time [s]"] <= previous["time [s]"]:
                raise GpuDataError(name, line, "time [s]", row["time [s]"],
                                   "times must increase")
            delta = {c: now[c] - previous[c] for c in METRIC_COLUMNS}.__getitem__
            out.append(ForwardIntervalRecord(
                run_id=run.run_id, model=run.model, max_num_seqs=run.max_num_seqs,
                output_len=run.output_len, time_s=now["time [s]"], interval_s=delta("time [s]"),
                forward_s=delta("model_forward_total_time"),
                scheduler_s=delta("scheduler_total_time"),
                num_running=now["num_requests_running"], num_waiting=now["num_requests_waiting"],
                gpu_cache_usage=now["gpu_cache_usage_perc"],
                prompt_tokens=delta("prompt_tokens_total"),
                generation_tokens=delta("generation_tokens_total"),
                preemptions=delta("num_preemptions_total"),
                finished_requests=delta("request_success_total"),
                source_file=name, source_line=line))
        previous = now
    return out


def read_phase_timings(root: Path, result: ImportResult) -> None:
    for log in sorted((root / OFFLINE).rglob("log_*.out")):
        record = _phase_timing(log, root)
        if record is None:
            result.exclude("offline runs with no decode time (failed)")
        else:
            result.add("phase_timing", [record])


def _phase_timing(log: Path, root: Path) -> PhaseTimingRecord | None:
    lines = text_lines(log)
    found = {}
    for number, line in enumerate(lines, start=1):
        for key in ("Prefill", "Decode"):
            match = re.match(rf"{key} elapsed time: ([0-9.eE+-]+) seconds", line)
            if match:
                found[key] = (float(match.group(1)), number)
    if "Decode" not in found or "Prefill" not in found:
        return None
    launch = parse_launcher(log.parent / "launcher.sh", root)
    memory = re.search(r"total_gpu_memory=([0-9.]+)GiB.*kv_cache_size=([0-9.]+)GiB",
                       "\n".join(lines))
    version = re.search(r"Initializing an LLM engine \(v([^)]+)\)", "\n".join(lines))
    client = launch.client
    for flag in ("--batch-size", "--prompt-len", "--output-len"):
        if launch.get_int(client, flag) is None:
            raise GpuDataError(launch.file, launch.line, flag, "", "missing from the command")
    return PhaseTimingRecord(
        experiment=rel(log.parent.parent.parent, root / OFFLINE), model=run_model(launch),
        engine=f"vllm {version.group(1)}" if version else "vllm",
        batch_size=launch.get_int(client, "--batch-size"),
        prompt_len=launch.get_int(client, "--prompt-len"),
        output_len=launch.get_int(client, "--output-len"),
        max_num_seqs=launch.get_int(client, "--max-num-seqs"),
        max_num_batched_tokens=launch.get_int(client, "--max-num-batched-tokens"),
        enforce_eager="--enforce-eager" in client,
        prefill_s=found["Prefill"][0], decode_s=found["Decode"][0],
        num_prefill_lines=sum(line.startswith("PREFILL - ") for line in lines),
        num_decode_lines=sum(line.startswith("DECODE - ") for line in lines),
        total_gpu_memory_gib=float(memory.group(1)) if memory else None,
        kv_cache_gib=float(memory.group(2)) if memory else None,
        source_file=rel(log, root), source_line=found["Decode"][1])

