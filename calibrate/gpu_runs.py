"""Replay agullo-dt serving runs through the simulator: each run's engine configuration and
workload (per-adapter Poisson rates, ShareGPT-like lengths) priced by a profile's coefficients,
its steady-state metrics compared with the measured ones.

The 990 runs of `ml_modelling/test_dataset` each served one hour. The simulator replays a
`window_s` window from an empty engine, stops at its end (`SimBounds.window_s`: an overloaded
queue is neither drained nor simulated past it) and scores the requests that finished after a
`warmup_s` warm-up. An overloaded run's offered rate is thinned, every adapter by the same
factor, to `RATE_CAP_RPS`: still far above what the engine serves, so it stays saturated with
the same adapter mix, while the requests simulated stay bounded. Its completions after the
warm-up then measure the steady capacity; its TTFT, which grows for as long as the queue does,
is not scored (`is_saturated`).

Why 60 s of warm-up in a 180 s window: a saturated engine fills its KV pool within seconds at
the capped rate, and a request lives about 10-25 s there (192 reply tokens on average at
50-130 ms steps), so after 60 s the running batch has turned over several times and its mix of
lengths and adapters is the steady one; the 120 s scored hold 1,200-4,000 completions at the
measured capacities (10-36 req/s), a sampling error of 2-3% on throughput. Unsaturated runs
reach their steady state within seconds, so the same rule costs them nothing.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.config import AdapterSpec, EngineLimits, SimBounds, SimConfig, StrategySpec
from sim.cost.cost_model import CostCoeffs
from sim.cost.layer_costs import LORA_MODULES
from sim.cost.memory_model import adapter_slot_bytes_per_gpu
from sim.hardware.catalogue import get_gpu, get_model
from sim.simulate import simulate
from sim.workload.generate import single_turn_workload

MODELS = {"llama-3.1-8b-instruct": "llama-3.1-8b", "qwen-2.5-7b-instruct": "qwen2.5-7b"}
PROMPT_SIGMA, OUTPUT_SIGMA = 1.0, 0.9
"""Assumed log-normal spreads of ShareGPT prompt and reply lengths (the runs log only their
means: about 223 prompt and 192 output tokens per request)."""
MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS = 1024, 2048
"""vLLM's benchmark_serving ShareGPT filter."""
RATE_CAP_RPS = 80.0
"""Offered rate a run is thinned to at most: over twice the highest throughput any test-set
run measured (36 req/s), so a thinned run is still overloaded."""
WINDOW_S, WARMUP_S = 180.0, 60.0
"""Simulated window and the warm-up left out of the scores (module docstring: why)."""
METRICS = ("throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


@dataclass(frozen=True)
class ServingRun:
    """One measured run: configuration, workload description and window metrics."""

    run_id: str
    model: str
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    max_num_seqs: int
    adapter_rates: tuple[float, ...]
    """Request rate of each adapter, req/s."""
    adapter_ranks: tuple[int, ...]
    mean_prompt_tokens: float
    mean_output_tokens: float
    measured: dict[str, float]


def _rates_and_ranks(row) -> tuple[tuple[float, ...], tuple[int, ...]]:
    rates_text, counts_text = row["adapter_rate_counts"].split("|")
    rates = [float(x) for x in rates_text.split()]
    counts = [int(x) for x in counts_text.split()]
    per_adapter = [r for r, n in zip(rates, counts, strict=True) for _ in range(n)]
    modules = [int(x) for x in row["lora_module_ranks"].split()]
    # Adapters are copies of the launcher's modules, taken in turn.
    return tuple(per_adapter), tuple(modules[i % len(modules)] for i in range(len(per_adapter)))


def load_serving_runs(path: Path, group: str = "ml_modelling/test_dataset") -> list[ServingRun]:
    """Runs of `group` with a result (rows without TPOT did not finish and are left out), of
    the models in `MODELS` (other groups also hold Llama-2-7B runs, which no profile prices)."""
    runs = []
    with gzip.open(path, "rt", newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if (row["group"] != group or not row["mean_tpot_ms"]
                    or row["model"] not in MODELS):
                continue
            done = float(row["successful_requests"])
            rates, ranks = _rates_and_ranks(row)
            runs.append(ServingRun(
                run_id=row["run_id"], model=MODELS[row["model"]],
                max_loras=int(float(row["max_loras"])),
                max_cpu_loras=int(float(row["max_cpu_loras"])),
                max_lora_rank=int(float(row["max_lora_rank"])),
                max_num_seqs=int(float(row["max_num_seqs"])), adapter_rates=rates,
                adapter_ranks=ranks,
                mean_prompt_tokens=float(row["total_input_tokens"]) / done,
                mean_output_tokens=float(row["total_output_tokens"]) / done,
                measured=dict(throughput_rps=float(row["request_throughput"]),
                              ttft_p50_s=float(row["median_ttft_ms"]) / 1e3,
                              ttft_p99_s=float(row["p99_ttft_ms"]) / 1e3,
                              tpot_p50_s=float(row["median_tpot_ms"]) / 1e3,
                              tpot_p99_s=float(row["p99_tpot_ms"]) / 1e3)))
    return runs


def _lengths(rng, num: int, mean: float, sigma: float, cap: int) -> np.ndarray:
    median = mean / np.exp(sigma**2 / 2)
    return np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(num))), 4, cap)


def run_workload(run: ServingRun, window_s: float, seed: int, rate_scale: float = 1.0):
    """Per-adapter Poisson arrivals over the window (each rate times `rate_scale`),
    ShareGPT-like lengths."""
    rng = np.random.default_rng(seed)
    arrivals, adapters = [], []
    for adapter, rate in enumerate(run.adapter_rates):
        n = rng.poisson(rate * rate_scale * window_s)
        arrivals.append(np.sort(rng.uniform(0, window_s, n)))
        adapters.append(np.full(n, adapter))
    arrival, domain = np.concatenate(arrivals), np.concatenate(adapters)
    prompt = _lengths(rng, arrival.size, run.mean_prompt_tokens, PROMPT_SIGMA, MAX_PROMPT_TOKENS)
    output = _lengths(rng, arrival.size, run.mean_output_tokens, OUTPUT_SIGMA,
                      MAX_TOTAL_TOKENS - MAX_PROMPT_TOKENS)
    return single_turn_workload(arrival, prompt.astype(np.int64), output.astype(np.int64),
                                domain)


def run_config(run: ServingRun, coeffs: CostCoeffs, gpu: str = "H100-64GB",
               window_s: float | None = None, preload_cpu_loras: bool = True) -> SimConfig:
    """The run's engine as the simulator sees it (vLLM 0.8.5 V1 defaults where the launcher
    sets nothing: 2,048 batched tokens, block 16, no prefix caching, utilisation 0.9).
    `preload_cpu_loras=False` prices every adapter's first load as cold, which these runs
    did not do (a what-if)."""
    arch = get_model(run.model)
    adapters = tuple(AdapterSpec(name=f"a{i}", num_bytes_per_gpu=adapter_slot_bytes_per_gpu(
        arch, 1, rank, 1)) for i, rank in enumerate(run.adapter_ranks))
    return SimConfig(
        arch=arch, gpu=get_gpu(gpu),
        # The fork's server registers max_cpu_loras adapters at start-up, each loaded from
        # disk into the host cache (and through a slot) before the client's first request
        # (vllm/entrypoints/openai/serving_models.py, init_static_loras): the runs' loads
        # are host-to-device only.
        engine=EngineLimits(max_num_seqs=run.max_num_seqs, max_num_batched_tokens=2048,
                            enable_prefix_caching=False, max_loras=run.max_loras,
                            max_cpu_loras=run.max_cpu_loras, max_lora_rank=run.max_lora_rank,
                            preload_cpu_loras=preload_cpu_loras),
        strategy=StrategySpec(kind="multi_lora", adapters=adapters, adapter_kind="lora",
                              adapter_rank=run.max_lora_rank,
                              adapter_placements=tuple((i, m) for i in range(arch.num_layers)
                                                       for m in LORA_MODULES)),
        coeffs=coeffs, bounds=SimBounds(window_s=window_s))


def predict_run(run: ServingRun, coeffs: CostCoeffs, *, window_s: float = WINDOW_S,
                warmup_s: float = WARMUP_S, seed: int = 0,
                preload_cpu_loras: bool = True) -> dict[str, float]:
    """Steady-state metrics of the simulated run (requests finished between `warmup_s` and
    `window_s`), plus `is_saturated`: over 1% of the requests that arrived in the window's first
    half had not finished at its end, and `rate_scale`, the thinning applied."""
    if not 0 <= warmup_s < window_s:
        raise ValueError(f"warmup_s={warmup_s} with window_s={window_s}; allowed: "
                         f"0 <= warmup_s < window_s")
    rate_scale = min(1.0, RATE_CAP_RPS / sum(run.adapter_rates))
    workload = run_workload(run, window_s, seed, rate_scale)
    config = run_config(run, coeffs, window_s=window_s, preload_cpu_loras=preload_cpu_loras)
    turns = simulate(config, workload).turns
    done = turns[(turns["done_s"] > warmup_s) & (turns["done_s"] <= window_s)]
    ttft, tpot = done["ttft_s"].to_numpy(), done["tpot_s"].to_numpy()
    arrived_early = int((workload.conv_arrival_s <= 0.5 * window_s).sum())
    finished_early = int((turns["arrival_s"] <= 0.5 * window_s).sum())
    unfinished = 1 - finished_early / arrived_early if arrived_early else 0.0
    # A thinned run the simulator serves in full would report the cap, not its capacity.
    if rate_scale < 1 and unfinished <= 0.01:
        raise ValueError(f"run {run.run_id}: thinned to {RATE_CAP_RPS} req/s and still not "
                         f"saturated in the simulator; raise RATE_CAP_RPS")
    return dict(throughput_rps=len(done) / (window_s - warmup_s),
                ttft_p50_s=float(np.median(ttft)), ttft_p99_s=float(np.percentile(ttft, 99)),
                tpot_p50_s=float(np.median(tpot)), tpot_p99_s=float(np.percentile(tpot, 99)),
                is_saturated=unfinished > 0.01, window_s=window_s, warmup_s=warmup_s,
                rate_scale=rate_scale)
