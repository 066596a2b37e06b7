"""An agullo-dt run folder as typed records: its `ServingRunRecord` (configuration from
`launcher.sh`, metrics from the result JSON or the client log) and its `EngineSampleRecord`s."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path, PurePosixPath

import numpy as np

from calibrate.gpu_data.agullo_records import GPU_KIND, EngineSampleRecord, ServingRunRecord
from calibrate.gpu_data.base import GpuDataError, rel, text_lines
from calibrate.gpu_data.bench_run import (
    Launch,
    engine_version,
    parse_launcher,
    read_engine_series,
    read_result,
)


def run_model(launch: Launch) -> str:
    """The served model's name: the last folder of the server's (else the client's) `--model`."""
    path = launch.server.get("--model") or launch.client.get("--model")
    if not path:
        raise GpuDataError(launch.file, launch.line, "--model", "", "a model path expected")
    return PurePosixPath(path.rstrip("/")).name


def run_from_folder(folder: Path, root: Path, *, group: str, run_id: str
                    ) -> tuple[Launch, ServingRunRecord | None, list[EngineSampleRecord]]:
    """The folder's launch, its run record (None when the run printed no result) and its
    engine polls."""
    launch = parse_launcher(folder / "launcher.sh", root)
    found = read_result(folder, root)
    if found is None:
        return launch, None, []
    values, source_file, source_line = found
    series = read_engine_series(folder, root)
    running = (None, None)
    if series is not None and "start_time" in values:
        inside = series["num_running"][(series["time"] >= values["start_time"])
                                       & (series["time"] <= values["end_time"])]
        if inside.size:
            running = (float(inside.mean()), float(inside.max()))
    run = _record(launch, values, group, run_id, running, source_file, source_line)
    counts = _logged_adapters(folder, root, run.adapter_rates)
    if counts is not None:
        run = dataclasses.replace(run, num_adapters=counts[0], adapter_rate_counts=counts[1])
    samples = [] if series is None else _samples(series, run_id, rel(folder, root))
    return launch, run, samples


def _record(launch: Launch, values: dict, group: str, run_id: str, running, source_file: str,
            source_line: int) -> ServingRunRecord:
    client, server = launch.client, launch.server
    version = engine_version(launch)
    ranks = tuple(int(x) for x in _module_ranks(launch))
    dataset = client.get("--dataset-path") or client.get("--use-synthetic-dataset") or ""
    window = client.get("--total-time")
    return ServingRunRecord(
        run_id=run_id, group=group, model=run_model(launch), gpu=GPU_KIND,
        engine=f"vllm {version}" if version else "vllm",
        enable_lora="--enable-lora" in server,
        max_loras=launch.get_int(server, "--max-loras"),
        max_cpu_loras=launch.get_int(server, "--max-cpu-loras"),
        max_lora_rank=launch.get_int(server, "--max-lora-rank"),
        max_num_seqs=launch.get_int(server, "--max-num-seqs"),
        max_num_batched_tokens=launch.get_int(server, "--max-num-batched-tokens"),
        adapter_rates=launch.get_floats(client, "--adapter-rates"), adapter_rate_counts=(),
        lora_module_ranks=ranks, num_adapters=None,
        restrict_loras=launch.get_int(client, "--restrict-loras"),
        dataset=PurePosixPath(dataset).name,
        input_len=launch.get_int(client, "--synthetic-input-length"),
        output_len=launch.get_int(client, "--synthetic-output-length"),
        num_prompts=launch.get_int(client, "--num-prompts"),
        window_s=float(window) if window else None, is_window_result=False,
        completed_requests=int(values["completed"]), duration_s=values["duration"],
        total_input_tokens=int(values["total_input_tokens"]),
        total_output_tokens=int(values["total_output_tokens"]),
        request_throughput=values["request_throughput"],
        input_token_throughput=values["input_throughput"],
        output_token_throughput=values["output_throughput"],
        **{k: values[k] for k in (
            "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
            "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms")},
        gpu_blocks=None, gpu_kv_cache_tokens=None, model_weights_gib=None,
        mean_num_running=running[0], max_num_running=running[1],
        source_file=source_file, source_line=source_line)


def _logged_adapters(folder: Path, root: Path, rates: tuple[float, ...]
                     ) -> tuple[int, tuple[int, ...]] | None:
    """(adapters served, adapters per rate aligned with `rates`) from the client log's
    'Number of adapters: N' and 'Adapter rates. Values: [...]. Counts: [...]' lines."""
    pattern = re.compile(r"Adapter rates\. Values: \[([^\]]*)\]\. Counts: \[([^\]]*)\]")
    for log in sorted(folder.glob("log_*.out"), reverse=True):
        number, by_rate = None, None
        for i, line in enumerate(text_lines(log), start=1):
            if line.startswith("Number of adapters:"):
                number = int(line.split(":")[1])
            match = pattern.match(line)
            if match:
                by_rate = dict(zip(map(float, match.group(1).split()),
                                   map(int, match.group(2).split()), strict=True))
                if set(by_rate) != set(rates):
                    raise GpuDataError(rel(log, root), i, "Adapter rates", match.group(1),
                                       f"the launcher's --adapter-rates {rates} expected")
        if number is not None and by_rate is not None:
            return number, tuple(by_rate[r] for r in rates)
    return None


def _module_ranks(launch: Launch) -> list[str]:
    """Ranks of the `--dummy-lora-modules` / `--lora-modules` paths ('..._dummy_rank_16')."""
    modules = launch.server.get("--dummy-lora-modules", "") or launch.server.get(
        "--lora-modules", "")
    ranks = []
    for path in modules.split():
        tail = path.rstrip("/").rsplit("_rank_", 1)
        if len(tail) != 2 or not tail[1].isdigit():
            raise GpuDataError(launch.file, launch.line, "lora module", path,
                               "a path ending in _rank_<N> expected")
        ranks.append(tail[1])
    return ranks


def _samples(series: dict[str, np.ndarray], run_id: str, folder: str) -> list[EngineSampleRecord]:
    columns = [series[k].tolist() for k in (
        "time", "num_running", "num_waiting", "num_preempted", "gpu_cache_usage_perc",
        "processed_tokens_prompt", "processed_tokens_token", "finished")]
    return [EngineSampleRecord(run_id, i, *values, source_file=f"{folder}/time.npy",
                               source_line=i + 1)
            for i, values in enumerate(zip(*columns, strict=True))]
