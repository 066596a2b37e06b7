"""Replay agullo-dt serving runs through the simulator: each run's engine configuration and
workload (per-adapter Poisson rates, ShareGPT's lengths) priced by a profile's coefficients,
its steady-state metrics compared with the measured ones. What the measurement adds outside
the engine is replayed too (docs/gpu-errors.md says why): the API server's path and its
tokenizer load on each adapter's first request (TTFT), and an overloaded client's backlog.

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
import statistics
from dataclasses import dataclass
from functools import cache
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
SHAREGPT_LENGTHS = Path(__file__).resolve().parents[1] / "data" / "gpu" / "agullo-dt" / (
    "sharegpt_first_turns.csv")
"""(prompt, reply) token counts of the ShareGPT pairs vLLM's benchmark client keeps
(`data/gpu/cut_sharegpt_first_turns.py`): the runs' lengths, up to each run's mean."""
PROMPT_SIGMA, OUTPUT_SIGMA = 1.0, 0.9
"""Log-normal spreads of prompt and reply lengths once assumed instead (`lengths="lognormal"`:
the runs log only their means). ShareGPT's kept first turns are far wider (upper over lower
quartile 19x for prompts, 12x for replies, against 3.9x and 3.4x) and a long prompt tends to
get a short reply (correlation of the logs -0.45), where these draws are independent."""
LENGTHS = "lognormal"
"""The replay's default lengths. ShareGPT's (`lengths="sharegpt"`) are the runs' own and bring
TTFT p50 and TPOT p99 closer (docs/gpu-errors.md), but with them the run-level fit's synthetic
round trip (tests/calibrate/test_gpu_run_fit.py before 447da13) lands 10.0% off one unknown,
just outside its 10% band: the default stays until that fit is rechecked with them."""
MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS = 1024, 2048
"""vLLM's benchmark_serving ShareGPT filter."""
RATE_CAP_RPS = 80.0
"""Offered rate a run is thinned to at most: over twice the highest throughput any test-set
run measured (36 req/s), so a thinned run is still overloaded."""
CLIENT_MAX_IN_FLIGHT = 60999 - 32768 + 1
"""Requests an overloaded run's client holds in the server: it opens a TCP connection per
request (a new aiohttp session each) from one address to one port, so at most Linux's default
ephemeral port range (32768-60999) are open at once; later requests fail to connect and are
not counted. vLLM's counters agree (`data/gpu/agullo-dt/engine_metrics.csv`): in the 504
test-set runs whose queue passes 5,000, the largest waiting count plus the median running one
is 23.5-26.2k (10th to 90th percentile), the other ports held by closed connections
(TIME_WAIT)."""
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
    duration_s: float = 3600.0
    """The measured window (the client's `--total-time`)."""


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
                duration_s=float(row["total_time_s"]),
                measured=dict(throughput_rps=float(row["request_throughput"]),
                              ttft_p50_s=float(row["median_ttft_ms"]) / 1e3,
                              ttft_p99_s=float(row["p99_ttft_ms"]) / 1e3,
                              tpot_p50_s=float(row["median_tpot_ms"]) / 1e3,
                              tpot_p99_s=float(row["p99_tpot_ms"]) / 1e3)))
    return runs


def _lengths(rng, num: int, mean: float, sigma: float, cap: int) -> np.ndarray:
    median = mean / np.exp(sigma**2 / 2)
    return np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(num))), 4, cap)


@cache
def sharegpt_pairs(path: Path = SHAREGPT_LENGTHS) -> np.ndarray:
    """int [N, 2]: prompt and reply tokens of each kept ShareGPT pair."""
    return np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)


def draw_lengths(rng, num: int, run: ServingRun, lengths: str = "sharegpt"):
    """Prompt and reply tokens of `num` requests. `sharegpt`: pairs drawn (with replacement,
    as the client duplicates pairs when it needs more) from ShareGPT's kept first turns, each
    side scaled to the run's logged mean (the counts come from another tokenizer) and held to
    the client's filter; `lognormal`: independent log-normal draws around the means."""
    if lengths == "lognormal":
        prompt = _lengths(rng, num, run.mean_prompt_tokens, PROMPT_SIGMA, MAX_PROMPT_TOKENS)
        return prompt, _lengths(rng, num, run.mean_output_tokens, OUTPUT_SIGMA,
                                MAX_TOTAL_TOKENS - MAX_PROMPT_TOKENS)
    if lengths != "sharegpt":
        raise ValueError(f"lengths={lengths!r}; allowed: sharegpt, lognormal")
    pairs = sharegpt_pairs()
    scale = np.array([run.mean_prompt_tokens, run.mean_output_tokens]) / pairs.mean(axis=0)
    drawn = np.rint(pairs[rng.integers(len(pairs), size=num)] * scale)
    prompt = np.clip(drawn[:, 0], 4, MAX_PROMPT_TOKENS)
    return prompt, np.clip(drawn[:, 1], 4, MAX_TOTAL_TOKENS - prompt)


def backlog(run: ServingRun, rng, num_requests: int) -> np.ndarray:
    """Adapters of `num_requests` waiting requests in FCFS order, drawn in proportion to the
    adapters' rates (the client's streams all keep sending while they wait)."""
    rates = np.asarray(run.adapter_rates)
    return rng.choice(rates.size, size=num_requests, p=rates / rates.sum())


def run_workload(run: ServingRun, window_s: float, seed: int, rate_scale: float = 1.0,
                 lengths: str = LENGTHS, num_backlog: int = 0):
    """Per-adapter Poisson arrivals over the window (each rate times `rate_scale`), ShareGPT
    lengths (`draw_lengths`); a `backlog` of `num_backlog` requests queued at time 0 ahead of
    them."""
    rng = np.random.default_rng(seed)
    arrivals, adapters = [], []
    for adapter, rate in enumerate(run.adapter_rates):
        n = rng.poisson(rate * rate_scale * window_s)
        arrivals.append(np.sort(rng.uniform(0, window_s, n)))
        adapters.append(np.full(n, adapter))
    arrival, domain = np.concatenate(arrivals), np.concatenate(adapters)
    prompt, output = draw_lengths(rng, arrival.size, run, lengths)
    if num_backlog > 0:
        waiting = backlog(run, rng, num_backlog)
        # Stable sort by arrival: the backlog keeps its FCFS order, all at time 0.
        arrival = np.concatenate([np.zeros(waiting.size), arrival])
        domain = np.concatenate([waiting, domain])
        more_prompt, more_output = draw_lengths(rng, waiting.size, run, lengths)
        prompt = np.concatenate([more_prompt, prompt])
        output = np.concatenate([more_output, output])
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


def simulate_run(run: ServingRun, coeffs: CostCoeffs, *, window_s: float = WINDOW_S,
                 seed: int = 0, preload_cpu_loras: bool = True, lengths: str = LENGTHS,
                 num_backlog: int = 0):
    """The replay itself: (SimResult, Workload, rate_scale) of the run's window."""
    rate_scale = min(1.0, RATE_CAP_RPS / sum(run.adapter_rates))
    workload = run_workload(run, window_s, seed, rate_scale, lengths, num_backlog)
    config = run_config(run, coeffs, window_s=window_s, preload_cpu_loras=preload_cpu_loras)
    return simulate(config, workload), workload, rate_scale


@cache
def measured_api_path_s() -> float:
    """Median time a request spends in the API server's path (`calibrate.gpu_samples
    .api_path_s`, measured on lone requests of the `lora_probe` runs)."""
    from calibrate.gpu_samples import api_path_s

    return api_path_s()


@cache
def measured_first_request_delay_s() -> float:
    """Median time the API server adds to an adapter's first request, measured on the
    distinct-adapter sweep's warm-ups (`calibrate.gpu_samples.first_request_gaps`), none of
    them a test-set run."""
    from calibrate.gpu_samples import first_request_gaps

    return statistics.median(first_request_gaps())


def api_server_blocks(run: ServingRun, delay_s: float, rng) -> np.ndarray:
    """float [N, 3]: per adapter whose first request falls in the measured hour, that
    request's arrival and the interval (start, end) during which the API server's event loop
    loads the adapter's tokenizer (vLLM 0.8.5's `AsyncLLM.get_tokenizer` calls the synchronous
    `get_lora_tokenizer`, so nothing else is served meanwhile; loads queue behind each other),
    in time order. Each adapter's first request is the first of its Poisson stream."""
    first = np.sort(rng.exponential(1 / np.asarray(run.adapter_rates)))
    first = first[first < run.duration_s]
    blocks = np.empty((first.size, 3))
    end = 0.0
    for i, arrival in enumerate(first):
        end = max(arrival, end) + delay_s
        blocks[i] = arrival, end - delay_s, end
    return blocks


def with_api_server_blocks(ttft: np.ndarray, run: ServingRun, delay_s: float,
                           seed: int = 0) -> np.ndarray:
    """Replayed TTFTs as the measured hour holds them: each request is placed at a uniformly
    drawn time of the hour; one that arrives while the loop is held reaches the engine when
    the loads queued before it end, one whose first token comes meanwhile is delivered then,
    and each adapter's first request (their share of the hour's requests) waits out its own
    load and those queued before it."""
    rng = np.random.default_rng(seed)
    blocks = api_server_blocks(run, delay_s, rng)
    if not blocks.size:
        return ttft
    arrival = rng.uniform(0, run.duration_s, ttft.size)
    first, end = blocks[:, 0], blocks[:, 2]

    def wait(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(first, t, side="right") - 1
        held_until = np.where(i >= 0, end[np.maximum(i, 0)], 0.0)
        return np.maximum(held_until - t, 0.0)

    held = wait(arrival)
    out = np.where(held > 0, ttft + held, ttft + wait(arrival + ttft))
    num_hour = sum(run.adapter_rates) * run.duration_s
    is_first = rng.random(ttft.size) < len(blocks) / num_hour
    own = rng.choice(end - first, size=ttft.size)
    return np.where(is_first, ttft + own, out)


def predict_run(run: ServingRun, coeffs: CostCoeffs, *, window_s: float = WINDOW_S,
                warmup_s: float = WARMUP_S, seed: int = 0,
                preload_cpu_loras: bool = True, lengths: str = LENGTHS,
                first_request_delay_s: float | None = None, api_path_s: float | None = None,
                num_backlog: int | None = None) -> dict[str, float]:
    """Steady-state metrics of the simulated run (requests finished between `warmup_s` and
    `window_s`), plus `is_saturated`: through the window's second half a median queue of over
    1% of the requests that arrived in its first half (and over one), and `rate_scale`, the
    thinning applied.
    Each TTFT gets the API server's path, `api_path_s`, and its tokenizer loads
    (`with_api_server_blocks`), each `first_request_delay_s` long (None: the measured ones;
    0: none). `num_backlog`: requests queued ahead of the window (`run_workload`; None: the
    measured hour's, `backlog_of`)."""
    if not 0 <= warmup_s < window_s:
        raise ValueError(f"warmup_s={warmup_s} with window_s={window_s}; allowed: "
                         f"0 <= warmup_s < window_s")
    _, predicted = replay_run(run, coeffs, window_s=window_s, warmup_s=warmup_s,
                              num_backlog=num_backlog, seed=seed,
                              preload_cpu_loras=preload_cpu_loras, lengths=lengths)
    ttft = predicted.pop("ttft")
    ttft = ttft + (measured_api_path_s() if api_path_s is None else api_path_s)
    if first_request_delay_s is None:
        first_request_delay_s = measured_first_request_delay_s()
    if first_request_delay_s > 0:
        ttft = with_api_server_blocks(ttft, run, first_request_delay_s, seed)
    return dict(predicted, ttft_p50_s=float(np.median(ttft)),
                ttft_p99_s=float(np.percentile(ttft, 99)))


def replay_run(run: ServingRun, coeffs: CostCoeffs, *, window_s: float, warmup_s: float,
               num_backlog: int | None = None, **replay):
    """(SimResult, scores) of the replay `predict_run` scores, behind `num_backlog` waiting
    requests (None: `backlog_of`)."""
    result, workload, rate_scale = simulate_run(run, coeffs, window_s=window_s,
                                                num_backlog=num_backlog or 0, **replay)
    scores = _score(run, result, workload, rate_scale, window_s=window_s, warmup_s=warmup_s)
    if num_backlog is None and _needs_backlog(run, scores):
        result, workload, rate_scale = simulate_run(
            run, coeffs, window_s=window_s, num_backlog=CLIENT_MAX_IN_FLIGHT, **replay)
        scores = _score(run, result, workload, rate_scale, window_s=window_s,
                        warmup_s=warmup_s)
    return result, scores


def backlog_of(run: ServingRun, coeffs: CostCoeffs, *, window_s: float, warmup_s: float,
               **replay) -> int:
    """Waiting requests the replay of `run` starts behind: `CLIENT_MAX_IN_FLIGHT` when its
    queue, growing at the excess of its offered rate over the capacity a replay from an empty
    engine finds, would reach the client's ceiling within the first half of the hour; from
    then on the client can only place a request when one finishes, so the waiting requests
    are renewed in proportion to the adapters' rates and every adapter keeps waiters. A run
    that queues less keeps the replay from an empty engine (0): its queue holds mostly the
    adapters left without a slot, which a backlog drawn by rates would misstate. A fit fixes
    it once (`calibrate.gpu_run_fit`), so its objective does not jump."""
    result, workload, rate_scale = simulate_run(run, coeffs, window_s=window_s, **replay)
    scores = _score(run, result, workload, rate_scale, window_s=window_s, warmup_s=warmup_s)
    return CLIENT_MAX_IN_FLIGHT if _needs_backlog(run, scores) else 0


def _needs_backlog(run: ServingRun, scores: dict) -> bool:
    excess = sum(run.adapter_rates) - scores["throughput_rps"]
    return scores["is_saturated"] and excess * run.duration_s / 2 >= CLIENT_MAX_IN_FLIGHT


def _score(run: ServingRun, result, workload, rate_scale: float, *, window_s: float,
           warmup_s: float) -> dict:
    """Metrics of the requests a replay finished between `warmup_s` and `window_s`; the TTFTs
    raw, under `ttft`."""
    turns = result.turns
    done = turns[(turns["done_s"] > warmup_s) & (turns["done_s"] <= window_s)]
    tpot = done["tpot_s"].to_numpy()
    # Overloaded: through the window's second half a median queue of over 1% of the requests
    # that arrived in its first half, and of more than the one that may have just arrived (a
    # count of unfinished requests would also take light runs' longest ShareGPT replies,
    # which outlast a short window's second half).
    arrived_early = int((workload.conv_arrival_s <= 0.5 * window_s).sum())
    ts = result.timeseries
    late = ts[ts["time_s"] > 0.5 * window_s]["num_waiting"]
    waiting = float(late.median()) if len(late) else 0.0
    unfinished = waiting / arrived_early if arrived_early and waiting > 1 else 0.0
    # A thinned run the simulator serves in full would report the cap, not its capacity.
    if rate_scale < 1 and unfinished <= 0.01:
        raise ValueError(f"run {run.run_id}: thinned to {RATE_CAP_RPS} req/s and still not "
                         f"saturated in the simulator; raise RATE_CAP_RPS")
    return dict(throughput_rps=len(done) / (window_s - warmup_s),
                ttft=done["ttft_s"].to_numpy(),
                tpot_p50_s=float(np.median(tpot)), tpot_p99_s=float(np.percentile(tpot, 99)),
                is_saturated=unfinished > 0.01, window_s=window_s, warmup_s=warmup_s,
                rate_scale=rate_scale)
