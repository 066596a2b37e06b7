"""One benchmark-client run folder of the agullo-dt repositories: `launcher.sh` (the exact client
and vLLM server arguments), the client log (`log_*.out`, with the printed result block), the
result JSON (`openai-*.json`) and the ~1 s engine metrics (`*.npy`) when they were saved.

The same client (`benchmarks/lora/benchmark_serving*.py`, a fork of vLLM's) wrote every run of
the estimators and of the serving-run test set, so one parser reads them all.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrate.gpu_data.base import GpuDataError, rel, text_lines

RESULT_FIELDS = {
    # log label -> JSON key (the client prints the JSON's numbers rounded to 2 decimals)
    "Successful requests": "completed",
    "Benchmark duration (s)": "duration",
    "Total input tokens": "total_input_tokens",
    "Total generated tokens": "total_output_tokens",
    "Request throughput (req/s)": "request_throughput",
    "Input token throughput (tok/s)": "input_throughput",
    "Output token throughput (tok/s)": "output_throughput",
    "Mean TTFT (ms)": "mean_ttft_ms", "Median TTFT (ms)": "median_ttft_ms",
    "P99 TTFT (ms)": "p99_ttft_ms", "Mean TPOT (ms)": "mean_tpot_ms",
    "Median TPOT (ms)": "median_tpot_ms", "P99 TPOT (ms)": "p99_tpot_ms",
    "Mean ITL (ms)": "mean_itl_ms", "Median ITL (ms)": "median_itl_ms",
    "P99 ITL (ms)": "p99_itl_ms",
}
ENGINE_SERIES = ("time", "num_running", "num_waiting", "num_preempted", "gpu_cache_usage_perc",
                 "processed_tokens_prompt", "processed_tokens_token", "finished")
_ENGINE_IMAGE = re.compile(r"vllm[_-]([0-9][0-9.]*[0-9])\.sif|vllm-benchmark\.sif")


@dataclass(frozen=True)
class Launch:
    """The client and server arguments of a run, parsed from its `launcher.sh`."""

    file: str
    line: int
    script: str
    engine_image: str
    client: dict[str, str]
    """Client flags (`--num-prompts` -> '4096'; flags without a value -> '')."""
    server: dict[str, str]
    """vLLM server flags from `--server-args`."""

    def get_int(self, args: dict[str, str], flag: str) -> int | None:
        raw = args.get(flag)
        if raw is None:
            return None
        try:
            return int(float(raw))
        except ValueError:
            raise GpuDataError(self.file, self.line, flag, raw, "an integer expected") from None

    def get_floats(self, args: dict[str, str], flag: str) -> tuple[float, ...]:
        raw = args.get(flag, "")
        try:
            return tuple(float(x) for x in raw.split())
        except ValueError:
            raise GpuDataError(self.file, self.line, flag, raw,
                               "space-separated numbers expected") from None


def _flags(tokens: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            key, eq, value = tok.partition("=")
            if not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                value, i = tokens[i + 1], i + 1
            out[key] = value
        i += 1
    return out


def parse_launcher(path: Path, root: Path) -> Launch:
    """The run's arguments. Shell quoting is resolved as bash would (`shlex`): the upstream
    scripts nest quotes inside `--server-args='...'`, which bash concatenates."""
    name = rel(path, root)
    for number, line in enumerate(text_lines(path), start=1):
        match = re.search(r"\bpython3\s+(\S+\.py)\b", line)
        if not match:
            continue
        try:
            tokens = shlex.split(line[match.start():])
            server = shlex.split(_flags(tokens[2:]).get("--server-args", ""))
        except ValueError as err:
            raise GpuDataError(name, number, "command", line[:80], f"unparsable: {err}") from None
        image = _ENGINE_IMAGE.search(line[:match.start()])
        return Launch(name, number, match.group(1), image.group(0) if image else "",
                      _flags(tokens[2:]), _flags(server))
    raise GpuDataError(name, 1, "command", "", "no `python3 <script>.py` line in the launcher")


def engine_version(launch: Launch) -> str:
    """vLLM version of the container image ('0.8.5' from vllm_0.8.5.sif; the older
    vllm-benchmark.sif image held vLLM 0.5.0, as the dataset's README says)."""
    match = _ENGINE_IMAGE.fullmatch(launch.engine_image)
    if match is None:
        return ""
    return match.group(1) or "0.5.0"


def read_result(folder: Path, root: Path) -> tuple[dict[str, float], str, int] | None:
    """The run's result numbers with their file and line: the result JSON when present (full
    precision), else the result block the client printed in its log; None when the run printed
    no result (it failed)."""
    found = sorted(p for p in folder.glob("openai-*.json") if "intermediate" not in p.name)
    if len(found) > 1:
        raise GpuDataError(rel(found[1], root), 1, "file", found[1].name,
                           "one result JSON per run expected")
    if found:
        path = found[0]
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise GpuDataError(rel(path, root), err.lineno, "json", err.msg,
                               "valid JSON expected") from None
        values = {}
        _derive_input_throughput(raw)
        for key in RESULT_FIELDS.values():
            value = raw.get(key)
            if not isinstance(value, int | float):
                raise GpuDataError(rel(path, root), 1, key, value, "a number expected")
            values[key] = float(value)
        for key in ("start_time", "end_time"):
            if isinstance(raw.get(key), int | float):
                values[key] = float(raw[key])
        return values, rel(path, root), 1
    return _result_from_log(folder, root)


def _result_from_log(folder: Path, root: Path) -> tuple[dict[str, float], str, int] | None:
    for log in sorted(folder.glob("log_*.out"), reverse=True):  # the latest job's log first
        lines = text_lines(log)
        starts = [i for i, line in enumerate(lines)
                  if "Serving Benchmark" in line and "====" in line]
        if not starts:
            continue
        start = starts[-1]
        values: dict[str, float] = {}
        for i in range(start + 1, min(start + 30, len(lines))):
            label, colon, value = lines[i].partition(":")
            if colon and label.strip() in RESULT_FIELDS:
                try:
                    values[RESULT_FIELDS[label.strip()]] = float(value)
                except ValueError:
                    raise GpuDataError(rel(log, root), i + 1, label.strip(), value.strip(),
                                       "a number expected") from None
        _derive_input_throughput(values)
        missing = [k for k in RESULT_FIELDS if RESULT_FIELDS[k] not in values]
        if missing:
            raise GpuDataError(rel(log, root), start + 1, "result block", lines[start].strip(),
                               f"incomplete: no {', '.join(missing)}")
        return values, rel(log, root), start + 1
    return None


def _derive_input_throughput(values: dict) -> None:
    """Older clients (memory-gap's) print total token throughput instead of input token
    throughput; the client computes the latter as input tokens over the duration."""
    if "input_throughput" not in values and isinstance(values.get("duration"), int | float):
        tokens = values.get("total_input_tokens")
        if isinstance(tokens, int | float) and values["duration"] > 0:
            values["input_throughput"] = tokens / values["duration"]


def read_engine_series(folder: Path, root: Path) -> dict[str, np.ndarray] | None:
    """The client's ~1 s polls of the engine's metrics (None when the run saved none); all
    series must have the same length."""
    if not (folder / "time.npy").exists():
        return None
    series = {}
    for name in ENGINE_SERIES:
        path = folder / f"{name}.npy"
        if not path.exists():
            raise GpuDataError(rel(path, root), 1, "file", path.name,
                               "missing beside time.npy")
        series[name] = np.load(path, allow_pickle=False).astype(float)
        if series[name].shape != series["time"].shape:
            raise GpuDataError(rel(path, root), 1, "length", series[name].shape[0],
                               f"{series['time'].shape[0]} values expected (time.npy)")
    return series
