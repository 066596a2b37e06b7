"""Importer of agullo-dt (FerranAgulloLopez/GPULLMAdapterOptimization): multi-LoRA vLLM serving on
an H100 64 GB. Reads the derived run table and step trace, and the raw estimator experiments
(run folders with `launcher.sh`, client log, result JSON and engine polls).

    result = import_agullo(Path("shared/data/gpu/agullo-dt"))
    result.records["serving_run"]     # ServingRunRecord, one per real run with a result
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from calibrate.gpu_data.agullo_loads import read_load_times
from calibrate.gpu_data.agullo_records import (
    GPU_KIND,
    AdapterLoadRecord,
    MemoryProbeRecord,
    SchedulerStepRecord,
    ServingRunRecord,
)
from calibrate.gpu_data.agullo_runs import run_from_folder
from calibrate.gpu_data.base import (
    Cell,
    DatasetMissingError,
    GpuDataError,
    ImportResult,
    read_csv_rows,
    rel,
    text_lines,
)

DATASET = "agullo-dt"
RUNS_SUMMARY = "derived/runs_summary.csv"
STEP_TRACE = "derived/per_step_scheduler_trace.csv.gz"
ESTIMATORS = "raw/digital_twin_dynamic/estimators"
SWEEPS = ("predictor_default_latency", "predictor_latency_overhead", "predictor_loading")
TEST_DATASET = "raw/benchmarks/lora/definitive_results/ml_modelling/test_dataset"
MEMORY = "find_available_gpu_memory_depending_on_loaded_adapters"
PARTS = (RUNS_SUMMARY, STEP_TRACE, TEST_DATASET) + tuple(f"{ESTIMATORS}/{x}" for x in SWEEPS)
TRACE_COLUMNS = ("run_id", "step_idx", "timestamp_s", "interval_since_prev_step_ms",
                 "scheduler_time_ms", "unique_adapters_in_batch")
SUMMARY_COLUMNS = (
    "run_id", "group", "kind", "model", "engine_image", "enable_lora", "lora_module_ranks",
    "max_loras", "max_cpu_loras", "max_lora_rank", "max_num_seqs", "max_num_batched_tokens",
    "dataset", "num_prompts", "total_time_s", "adapter_rates", "restrict_loras",
    "synthetic_input_len", "synthetic_output_len", "num_adapters_logged", "adapter_rate_counts",
    "gpu_kv_cache_tokens", "gpu_blocks", "model_weights_gib", "result_source",
    "intermediate_window_result", "successful_requests", "benchmark_duration_s",
    "total_input_tokens", "total_output_tokens", "request_throughput", "input_token_throughput",
    "output_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
    "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms")
ENGINES = {"vllm_0.8.5.sif": "vllm 0.8.5", "vllm-benchmark.sif": "vllm 0.5.0"}
METRICS = ("request_throughput", "input_token_throughput", "output_token_throughput",
           "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
           "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms")


def import_agullo(root: Path) -> ImportResult:
    """Every record of the parts present under `root` (a slice holds fewer parts; the result
    lists the absent ones). DatasetMissingError when the folder or all of its parts are absent."""
    if not root.is_dir():
        raise DatasetMissingError(f"{DATASET}: dataset folder {root} does not exist")
    present = [p for p in PARTS if _part(root, p) is not None]
    if not present:
        raise DatasetMissingError(f"{DATASET}: {root} is incomplete: none of {', '.join(PARTS)}")
    result = ImportResult(DATASET, absent_parts=[p for p in PARTS if p not in present])
    if _part(root, RUNS_SUMMARY) is not None:
        read_runs_summary(root, result)
    if _part(root, STEP_TRACE) is not None:
        result.add("scheduler_step", read_step_trace(root))
    if (root / TEST_DATASET).exists():
        read_test_runs(root, result)
    for sweep in SWEEPS:
        if (root / ESTIMATORS / sweep).exists():
            read_sweep_runs(root, sweep, result)
    if (root / ESTIMATORS / "predictor_loading").exists():
        result.add("adapter_load", read_adapter_loads(root))
        result.add("adapter_load_time", read_load_times(root))
    return result


def read_runs_summary(root: Path, result: ImportResult) -> None:
    """`serving_run` records of derived/runs_summary.csv (every group, estimator runs included:
    filter on `group`), and a `memory_probe` record per row of the memory experiment. Rows
    with no result metrics (the run failed or never finished) are counted in
    `result.excluded`, except memory probes, where a missing result is the measurement."""
    path = _part(root, RUNS_SUMMARY)
    for line, row in read_csv_rows(path, root, SUMMARY_COLUMNS):
        cell = Cell(rel(path, root), line, row)
        cell.str("kind", allowed=("real",))
        has_result = cell.str("successful_requests") != ""
        if cell.str("group") == MEMORY:
            result.add("memory_probe", [_memory_probe(cell, has_result)])
        elif has_result:
            result.add("serving_run", [_summary_run(cell)])
        else:
            result.exclude("runs_summary rows with no result (run failed or unfinished)")


def _memory_probe(cell: Cell, has_result: bool) -> MemoryProbeRecord:
    return MemoryProbeRecord(
        model=cell.str("model"), max_loras=cell.int("max_loras"),
        max_lora_rank=cell.int("max_lora_rank"),
        max_num_seqs=cell.int("max_num_seqs", optional=True), has_result=has_result,
        gpu_kv_cache_tokens=cell.int("gpu_kv_cache_tokens", optional=True),
        model_weights_gib=cell.float("model_weights_gib", optional=True),
        source_file=cell.file, source_line=cell.line)


def _part(root: Path, name: str) -> Path | None:
    """`root/name`, or its gzip copy (the repository's slices are compressed), or None."""
    for path in (root / name, root / f"{name}.gz"):
        if path.exists():
            return path
    return None


def _summary_run(cell: Cell) -> ServingRunRecord:
    rates = cell.floats("adapter_rates")
    engine = ENGINES.get(cell.str("engine_image", allowed=tuple(ENGINES)))
    window = cell.float("intermediate_window_result", optional=True)
    metrics = {k: cell.float(k) for k in METRICS}
    return ServingRunRecord(
        run_id=cell.str("run_id"), group=cell.str("group"), model=cell.str("model"),
        gpu=GPU_KIND, engine=engine, enable_lora=cell.str("enable_lora", allowed=("0", "1")) == "1",
        max_loras=cell.int("max_loras", optional=True),
        max_cpu_loras=cell.int("max_cpu_loras", optional=True),
        max_lora_rank=cell.int("max_lora_rank", optional=True),
        max_num_seqs=cell.int("max_num_seqs", optional=True),
        max_num_batched_tokens=cell.int("max_num_batched_tokens", optional=True),
        adapter_rates=rates, adapter_rate_counts=_rate_counts(cell, rates),
        lora_module_ranks=tuple(int(x) for x in cell.floats("lora_module_ranks")),
        num_adapters=cell.int("num_adapters_logged", optional=True),
        restrict_loras=cell.int("restrict_loras", optional=True), dataset=cell.str("dataset"),
        input_len=cell.int("synthetic_input_len", optional=True),
        output_len=cell.int("synthetic_output_len", optional=True),
        num_prompts=cell.int("num_prompts", optional=True),
        window_s=cell.float("total_time_s", optional=True), is_window_result=window == 1.0,
        completed_requests=cell.int("successful_requests"),
        duration_s=cell.float("benchmark_duration_s"),
        total_input_tokens=cell.int("total_input_tokens"),
        total_output_tokens=cell.int("total_output_tokens"), **metrics,
        gpu_blocks=cell.int("gpu_blocks", optional=True),
        gpu_kv_cache_tokens=cell.int("gpu_kv_cache_tokens", optional=True),
        model_weights_gib=cell.float("model_weights_gib", optional=True),
        mean_num_running=None, max_num_running=None,
        source_file=cell.file, source_line=cell.line)


def _rate_counts(cell: Cell, rates: tuple[float, ...]) -> tuple[int, ...]:
    """Adapters per rate, aligned with `rates` ('0.003125 0.0125 0.05 | 42 43 43' lists the
    distinct rates sorted, then their counts)."""
    raw = cell.row["adapter_rate_counts"].strip()
    if not raw:
        return ()
    values, bar, counts = raw.partition("|")
    try:
        by_rate = dict(zip((float(x) for x in values.split()),
                           (int(x) for x in counts.split()), strict=True))
    except ValueError:
        raise GpuDataError(cell.file, cell.line, "adapter_rate_counts", raw,
                           "'RATE ... | COUNT ...' with as many counts as rates") from None
    if not bar or set(by_rate) != set(rates):
        raise GpuDataError(cell.file, cell.line, "adapter_rate_counts", raw,
                           f"one count per rate of adapter_rates {rates}")
    return tuple(by_rate[r] for r in rates)


def read_step_trace(root: Path) -> list[SchedulerStepRecord]:
    """`scheduler_step` records of the per-step trace, in file order."""
    out = []
    for line, row in read_csv_rows(root / STEP_TRACE, root, TRACE_COLUMNS):
        cell = Cell(STEP_TRACE, line, row)
        out.append(SchedulerStepRecord(
            run_id=cell.str("run_id"), step_idx=cell.int("step_idx"),
            timestamp_s=cell.float("timestamp_s"),
            interval_ms=cell.float("interval_since_prev_step_ms", optional=True),
            scheduler_time_ms=cell.float("scheduler_time_ms"),
            unique_adapters=cell.int("unique_adapters_in_batch"),
            source_file=STEP_TRACE, source_line=line))
    return out


def _run_folders(base: Path) -> list[Path]:
    return sorted(p.parent for p in base.rglob("launcher.sh"))


def read_sweep_runs(root: Path, sweep: str, result: ImportResult) -> None:
    """`sweep_run` (ServingRunRecord) and `engine_sample` records of one estimator experiment;
    runs that printed no result are counted in `result.excluded`."""
    for folder in _run_folders(root / ESTIMATORS / sweep):
        _, run, samples = run_from_folder(folder, root, group=f"estimators/{sweep}",
                                       run_id="est/" + rel(folder, root / ESTIMATORS))
        if run is None:
            result.exclude(f"{sweep} runs with no result")
            continue
        result.add("sweep_run", [run])
        result.add("engine_sample", samples)


def read_test_runs(root: Path, result: ImportResult) -> None:
    """`test_run` (ServingRunRecord) records of the raw ml_modelling/test_dataset folders,
    parsed from each run's launcher.sh and client log: the same runs as the test-set rows of
    runs_summary.csv (same `run_id`), read from the upstream files themselves."""
    for folder in _run_folders(root / TEST_DATASET):
        run_id = "br/" + rel(folder, root / "raw/benchmarks/lora/definitive_results")
        _, run, _ = run_from_folder(folder, root, group="ml_modelling/test_dataset",
                                    run_id=run_id)
        if run is None:
            result.exclude("test_dataset runs with no result")
            continue
        result.add("test_run", [run])


def read_adapter_loads(root: Path) -> list[AdapterLoadRecord]:
    """`adapter_load` records of every `<model>_constants.json` of predictor_loading: upstream's
    mean activation time in ms, by max_lora_rank then adapter rank."""
    out = []
    for path in sorted((root / ESTIMATORS / "predictor_loading").glob("*_constants.json")):
        name, model = rel(path, root), path.name.removesuffix("_constants.json")
        lines = text_lines(path)
        try:
            table = json.loads("\n".join(lines))
        except json.JSONDecodeError as err:
            raise GpuDataError(name, err.lineno, "json", err.msg, "valid JSON expected") from None
        outer = None
        for number, text in enumerate(lines, start=1):
            match = re.match(r'\s*"(\w+)"\s*:\s*(\{|[-0-9.eE+]+)', text)
            if match is None:
                continue
            key, value = match.groups()
            if value == "{":
                outer = key
                continue
            try:
                ms = float(table[outer][key])
                record = AdapterLoadRecord(model, int(outer), int(key), ms, name, number)
            except (KeyError, TypeError, ValueError):
                raise GpuDataError(name, number, f"{outer}.{key}", value,
                                   "{max_lora_rank: {adapter_rank: ms}} expected") from None
            out.append(record)
    return out
