"""Typed records of the agullo-dt dataset (multi-LoRA vLLM on an H100 64 GB, MareNostrum 5).

Run-level numbers (`ServingRunRecord`) are what simulation-in-the-loop fitting compares with;
step-level numbers (`SchedulerStepRecord`, `EngineSampleRecord`) and the controlled sweeps map
onto `calibrate.recorder.StepSample` through `calibrate.gpu_data.agullo.decode_step_samples`.
Every record names its source file (relative to the dataset folder) and line.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_KIND = "H100-64GB"
"""The agullo and memory-gap runs used MareNostrum 5's 64 GB H100, not the catalogue's 80 GB
SXM part (the dataset README: inferred from the logs' memory arithmetic)."""


@dataclass(frozen=True)
class ServingRunRecord:
    """One benchmark run: the engine's configuration and the client's measured metrics."""

    run_id: str
    """Upstream run folder ('br/...' serving runs, 'est/...' estimator runs, as in the
    per-step trace)."""
    group: str
    """Experiment ('ml_modelling/test_dataset', 'estimators/predictor_latency_overhead', ...)."""
    model: str
    gpu: str
    engine: str
    """'vllm 0.8.5' (V1 engine fork) or 'vllm 0.5.0'."""
    enable_lora: bool
    max_loras: int | None
    max_cpu_loras: int | None
    max_lora_rank: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    """None: the engine's default (not set in the launcher)."""
    adapter_rates: tuple[float, ...]
    """Per-adapter Poisson rate classes, req/s, in the launcher's order (() when not
    rate-driven)."""
    adapter_rate_counts: tuple[int, ...]
    """Adapters at each rate of `adapter_rates` (() when not logged)."""
    lora_module_ranks: tuple[int, ...]
    """Ranks of the LoRA modules the adapters are copies of (launcher's module list). With as
    many modules as rates, module i serves the adapters at `adapter_rates[i]` (upstream's run
    folders are named rate_<r1-r2-r3>_size_<s1-s2-s3>): see `adapter_classes`."""
    num_adapters: int | None
    """Distinct adapters served (None when not logged)."""
    restrict_loras: int | None
    """Distinct adapters the client sent requests to (controlled sweeps)."""
    dataset: str
    """Prompt source: ShareGPT, synthetic fixed lengths, ..."""
    input_len: int | None
    """Synthetic prompt length the client asked for, in words of its dictionary prompt (None:
    a dataset's lengths); tokens per prompt: total_input_tokens / completed_requests."""
    output_len: int | None
    """Synthetic output tokens per request (None: a dataset's lengths)."""
    num_prompts: int | None
    window_s: float | None
    """Fixed benchmark window (None: run until `num_prompts` finish)."""
    is_window_result: bool
    """Metrics cover requests finished inside `window_s`, not every request sent."""
    completed_requests: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_token_throughput: float
    output_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p99_itl_ms: float
    gpu_blocks: int | None
    """KV blocks vLLM allocated (when the server log was kept)."""
    gpu_kv_cache_tokens: int | None
    model_weights_gib: float | None
    mean_num_running: float | None
    """Mean running requests over the engine polls inside the benchmark (controlled sweeps)."""
    max_num_running: float | None
    source_file: str
    source_line: int


def adapter_classes(run: ServingRunRecord) -> list[tuple[float, int, int]]:
    """(rate req/s per adapter, rank, adapters) per adapter class of a rate-driven run, pairing
    rates, module ranks and counts by position; [] when the run does not log all three."""
    n = len(run.adapter_rates)
    if n == 0 or len(run.lora_module_ranks) != n or len(run.adapter_rate_counts) != n:
        return []
    return list(zip(run.adapter_rates, run.lora_module_ranks, run.adapter_rate_counts,
                    strict=True))


@dataclass(frozen=True)
class SchedulerStepRecord:
    """One engine step of an estimator run (derived/per_step_scheduler_trace.csv.gz). Batch size
    is not logged per step: join `run_id` with the run's `ServingRunRecord`."""

    run_id: str
    step_idx: int
    timestamp_s: float
    interval_ms: float | None
    """Time since the previous step's start (None for a run's first step)."""
    scheduler_time_ms: float
    unique_adapters: int
    """Distinct adapters in the step's batch."""
    source_file: str
    source_line: int


@dataclass(frozen=True)
class EngineSampleRecord:
    """One ~1 s poll of the engine's metrics by the benchmark client (`*.npy` of a run)."""

    run_id: str
    index: int
    time_s: float
    num_running: float
    num_waiting: float
    num_preempted: float
    gpu_cache_usage: float
    """KV cache in use, fraction of the pool."""
    processed_prompt_tokens: float
    """Cumulative prompt tokens computed."""
    processed_output_tokens: float
    finished: float
    source_file: str
    source_line: int


@dataclass(frozen=True)
class AdapterLoadRecord:
    """Mean time to activate one adapter from host memory into a GPU slot (predictor_loading:
    upstream's mean over a run's loads, read from its `<model>_constants.json`)."""

    model: str
    max_lora_rank: int
    adapter_rank: int
    mean_load_ms: float
    source_file: str
    source_line: int


@dataclass(frozen=True)
class MemoryProbeRecord:
    """What memory vLLM left for the KV cache with `max_loras` slots of `max_lora_rank` (the
    find_available_gpu_memory experiment, one row of derived/runs_summary.csv, whose memory
    columns come from server logs not kept in raw/)."""

    model: str
    max_loras: int
    max_lora_rank: int
    max_num_seqs: int | None
    has_result: bool
    """The server started and served the probe request (False: it did not fit, or failed)."""
    gpu_kv_cache_tokens: int | None
    """KV cache tokens vLLM reported (None when not logged)."""
    model_weights_gib: float | None
    """GiB vLLM reported for loading the model; grows with max_loras x rank, so it holds the
    LoRA slot buffers as well as the weights."""
    source_file: str
    source_line: int


@dataclass(frozen=True)
class AdapterLoadTimeRecord:
    """One adapter load timed by the fork's worker manager (predictor_loading server logs): from
    disk into the host cache (`source` 'disk'), or from host memory into a GPU slot ('host')."""

    model: str
    max_lora_rank: int
    adapter_rank: int
    source: str
    """'disk' (file into the host cache: read, parse, register) or 'host' (into a slot)."""
    phase: str
    """'startup' (the server registering its adapters, before any request) or 'benchmark'."""
    load_index: int
    """1-based count of this source's loads in the run."""
    seconds: float
    """This load alone: the difference of the log's cumulative totals."""
    source_file: str
    source_line: int
