"""Simulator speed in the multi-LoRA regime: many adapters over few slots, saturated queues.

The configurations are real serving runs: the `ml_modelling/test_dataset` group of the agullo
measurements (`gpu/agullo-dt/derived/runs_summary.csv`: Llama-3.1-8B on one H100, vLLM 0.8.5,
16-384 adapters in three rate tiers, `max_loras` 16-192, `max_cpu_loras`, `max_num_seqs`
2048, prefix caching off). Each is replayed with ShareGPT prompt and output lengths
(`traces/length_distributions`), one Poisson process per adapter at its tier's rate, the rates
scaled together to 50, 100 and 150% of the configuration's capacity, at 20k and 100k requests.

Capacity is the simulator's own: a closed batch of requests of the same mix, all submitted at
once, and the finishing rate between its 25th and 75th percentile finishes (the start and the
drain left out). Above 100% the queue grows for the whole arrival span: that is the case the
benchmark exists for.

Each case runs in a fresh process, so that its peak RSS is its own. Reported per case:
simulated requests per CPU-second (process time of `simulate` alone) and per wall-second,
peak RSS, engine steps and events, mean and largest waiting queue. A least-squares fit of
log(CPU microseconds per request) on log(adapters), log(slots) and log(1 + mean queue) says how
cost grows with each. Writes a markdown table and a JSON file with the machine, the load
average and the date.

Data: $MOLCAP_DATA_DIR (a copy of shared/data: gpu/agullo-dt/..., traces/length_distributions/...)
or the repository's data/ slices of the same files.

    .venv/bin/python bench/bench_multilora.py --quick          # seconds: proves it runs
    .venv/bin/python bench/bench_multilora.py                  # every configuration, 20k, 100k
    .venv/bin/python bench/bench_multilora.py --sizes 20000 --loads 1.5
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's sim/, not an installed copy's

from bench.multilora_analysis import cost_growth, growth_row, profile  # noqa: E402

OUT_DIR = REPO / "out" / "bench"
RUNS_CSV = Path("gpu") / "agullo-dt" / "derived" / "runs_summary.csv"
SHAREGPT_CSV = (Path("traces") / "length_distributions"
                / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
GROUP, MODEL = "ml_modelling/test_dataset", "llama-3.1-8b-instruct"
GRID = ((16, 16), (64, 16), (64, 64), (128, 32), (192, 192), (320, 16), (384, 32), (384, 192))
"""(adapters, max_loras) of the default configurations: few to many adapters, few to many
slots, and many adapters over few slots."""
QUICK_GRID = ((16, 16), (320, 16))
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
"""Modules the adapters are taken to wrap (the runs' dummy adapters do not say): only their
load time depends on it."""


@dataclass(frozen=True)
class RunConfig:
    """One real run's serving configuration."""

    run_id: str
    num_adapters: int
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    max_num_seqs: int
    tier_rates: tuple[float, ...]
    """Requests per second of one adapter of each tier."""
    tier_counts: tuple[int, ...]
    """Adapters in each tier."""
    tier_ranks: tuple[int, ...]
    """LoRA rank of each tier's adapters."""

    @property
    def name(self) -> str:
        return f"{self.num_adapters}a/{self.max_loras}s"


def data_file(relative: Path) -> Path:
    """`relative` (or its gzipped copy) under $MOLCAP_DATA_DIR, else under the repository's
    data/; exits 2 naming the places looked in when none has it."""
    places = [Path(os.environ["MOLCAP_DATA_DIR"])] if os.environ.get("MOLCAP_DATA_DIR") else []
    places.append(REPO / "data")
    for base in places:
        for path in (base / relative, base / f"{relative}.gz"):
            if path.is_file():
                return path
    sys.stderr.write(f"error: {relative} (or .gz) not found under "
                     f"{' or '.join(map(str, places))}; set MOLCAP_DATA_DIR to a copy of the "
                     f"shared data folder\n")
    raise SystemExit(2)


def read_csv_rows(path: Path) -> list[dict]:
    """Rows of a CSV file, gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def _run_config(row: dict) -> RunConfig | None:
    rates_counts = row["adapter_rate_counts"]
    if "|" not in rates_counts:
        return None
    rates, counts = (part.split() for part in rates_counts.split("|"))
    ranks = row["lora_module_ranks"].split()
    # runs_summary lists the tier rates in ascending order, the ranks in the launcher's order
    # (descending rates): pair them back up.
    order = np.argsort([float(r) for r in rates])[::-1]
    return RunConfig(
        run_id=row["run_id"], num_adapters=sum(int(c) for c in counts),
        max_loras=int(float(row["max_loras"])), max_cpu_loras=int(float(row["max_cpu_loras"])),
        max_lora_rank=int(float(row["max_lora_rank"])),
        max_num_seqs=int(float(row["max_num_seqs"])),
        tier_rates=tuple(float(rates[i]) for i in order),
        tier_counts=tuple(int(counts[i]) for i in order),
        tier_ranks=tuple(int(r) for r in ranks))


def load_run_configs(path: Path) -> list[RunConfig]:
    """The test-set runs of Llama-3.1-8B whose adapter tiers are known."""
    rows = [r for r in read_csv_rows(path) if r["group"] == GROUP and r["model"] == MODEL]
    return [c for c in map(_run_config, rows) if c is not None]


def select(configs: list[RunConfig], grid) -> list[RunConfig]:
    """The first run (by run id) of each (adapters, max_loras) of `grid` present in the data."""
    chosen = []
    for adapters, slots in grid:
        match = sorted((c for c in configs if (c.num_adapters, c.max_loras) == (adapters, slots)),
                       key=lambda c: c.run_id)
        if match:
            chosen.append(match[0])
    return chosen


def sharegpt_lengths(path: Path) -> np.ndarray:
    """[N, 2] prompt and output tokens of the ShareGPT conversations."""
    rows = read_csv_rows(path)
    return np.array([(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in rows],
                    dtype=np.int64)


def adapter_rates(cfg: RunConfig) -> np.ndarray:
    """Each adapter's request rate in the real run (tiers in order)."""
    return np.repeat(cfg.tier_rates, cfg.tier_counts)


def workload(cfg: RunConfig, lengths: np.ndarray, total_rate: float | None, num_requests: int,
             seed: int = 0):
    """`num_requests` requests, one Poisson process per adapter with the run's relative rates
    summing to `total_rate` (all at 0 when None), ShareGPT lengths drawn per request."""
    from sim.workload.generate import single_turn_workload

    rng = np.random.default_rng(seed)
    rates = adapter_rates(cfg)
    # Superposed Poisson processes: one process at the total rate, each arrival's adapter
    # drawn in proportion to its rate.
    adapters = rng.choice(rates.size, size=num_requests, p=rates / rates.sum())
    arrival = (np.zeros(num_requests) if total_rate is None
               else np.cumsum(rng.exponential(1.0 / total_rate, size=num_requests)))
    picked = lengths[rng.integers(0, len(lengths), size=num_requests)]
    return single_turn_workload(arrival, picked[:, 0], picked[:, 1], adapters)


def sim_config(cfg: RunConfig, max_num_batched_tokens: int):
    """Llama-3.1-8B on one H100 with the run's engine limits; prefix caching off as in the
    runs; one adapter per (tier, copy) with its tier's rank."""
    from sim.config import AdapterSpec, EngineLimits, SimConfig, StrategySpec
    from sim.cost.memory_model import LORA_DTYPE_BYTES
    from sim.cost.model_shapes import lora_weights_per_rank
    from sim.hardware.catalogue import get_gpu, get_model
    from sim.strategies.placement import adapter_placements

    arch = get_model("llama-3.1-8b")
    placements = adapter_placements(arch, None, ATTENTION_MODULES)
    per_rank = lora_weights_per_rank(arch, placements)
    ranks = np.repeat(cfg.tier_ranks, cfg.tier_counts)
    adapters = tuple(AdapterSpec(name=f"a{i}", num_bytes_per_gpu=int(r) * per_rank
                                 * LORA_DTYPE_BYTES) for i, r in enumerate(ranks))
    strategy = StrategySpec(kind="multi_lora", label=cfg.name, adapters=adapters,
                            adapter_kind="lora", adapter_rank=int(max(ranks)),
                            adapter_placements=tuple(placements))
    engine = EngineLimits(max_num_seqs=cfg.max_num_seqs,
                          max_num_batched_tokens=max(max_num_batched_tokens, cfg.max_num_seqs),
                          enable_prefix_caching=False, max_loras=cfg.max_loras,
                          max_cpu_loras=cfg.max_cpu_loras, max_lora_rank=cfg.max_lora_rank)
    return SimConfig(arch=arch, gpu=get_gpu("H100-SXM"), engine=engine, strategy=strategy)


def _capacity(cfg: RunConfig, lengths: np.ndarray, num_requests: int, tokens: int) -> float:
    from sim.simulate import simulate

    result = simulate(sim_config(cfg, tokens), workload(cfg, lengths, None, num_requests),
                      timeseries_interval_s=60.0)
    done = np.sort(result.requests["finish_s"].to_numpy())
    lo, hi = done[len(done) // 4], done[3 * len(done) // 4]
    return (3 * len(done) // 4 - len(done) // 4) / (hi - lo)


def _case(cfg: RunConfig, load: float, capacity: float, num_requests: int, tokens: int,
          lengths: np.ndarray, queue) -> None:
    from sim.simulate import simulate

    wl = workload(cfg, lengths, load * capacity, num_requests, seed=1)
    config = sim_config(cfg, tokens)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(config, wl, timeseries_interval_s=10.0)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    waiting = result.timeseries["num_waiting"]
    n = len(result.requests)
    queue.put(dict(config=cfg.name, run_id=cfg.run_id, num_adapters=cfg.num_adapters,
                   max_loras=cfg.max_loras, max_cpu_loras=cfg.max_cpu_loras, load=load,
                   capacity_per_s=capacity, num_requests=n, cpu_s=cpu, wall_s=wall,
                   requests_per_cpu_s=n / cpu, requests_per_wall_s=n / wall,
                   peak_rss_gib=peak / 2**30, engine_steps=result.stats["num_engine_steps"],
                   engine_events=result.stats["num_engine_events"],
                   mean_waiting=float(waiting.mean()), max_waiting=int(waiting.max()),
                   num_adapter_loads=int(result.timeseries["num_adapter_loads"].max()),
                   simulated_s=float(result.summary["duration_s"]),
                   load_1m=os.getloadavg()[0]))


def _in_process(target, args) -> dict:
    """Run `target(*args, queue)` in a fresh process; what it put on the queue."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    while queue.empty():  # a case that raised would leave the queue empty for ever
        if not proc.is_alive() and queue.empty():
            raise RuntimeError(f"{target.__name__}{args[:3]}: the process died (exit code "
                               f"{proc.exitcode}; its traceback is above)")
        time.sleep(0.2)
    row = queue.get()
    proc.join()
    return row


def _capacity_case(cfg, lengths, num_requests, tokens, queue) -> None:
    queue.put(_capacity(cfg, lengths, num_requests, tokens))


COLUMNS = (("config", "configuration", "{}"), ("load", "load", "{:.0%}"),
           ("num_requests", "requests", "{:,}"), ("requests_per_cpu_s", "req/CPU-s", "{:,.0f}"),
           ("requests_per_wall_s", "req/wall-s", "{:,.0f}"), ("peak_rss_gib", "peak GiB",
                                                              "{:.2f}"),
           ("mean_waiting", "mean queue", "{:,.0f}"), ("max_waiting", "max queue", "{:,}"),
           ("engine_events", "events", "{:,}"), ("load_1m", "load avg", "{:.1f}"))


def markdown(rows: list[dict], growth: dict | None, meta: dict) -> str:
    """The table (and the cost fit) as markdown."""
    lines = [f"Multi-LoRA simulator speed, {meta['date']}, {meta['machine']}, python "
             f"{meta['python']}, load average at start {meta['load_average'][0]:.1f}", "",
             "| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + " |"
              for r in rows]
    if growth:
        lines += ["", f"CPU time per request ~ adapters^{growth['adapters_exponent']:.2f} x "
                      f"slots^{growth['slots_exponent']:.2f} x (1 + mean queue)^"
                      f"{growth['queue_exponent']:.2f} (least squares over the cases above; "
                      f"largest residual {growth['max_log_residual']:.2f} in log)"]
    return "\n".join(lines) + "\n"


def record(rows: list[dict]) -> None:
    """Append the rows to bench/results/bench_multilora.json, with the load average range."""
    from bench.record import append_rows

    loads = [r["load_1m"] for r in rows]
    keys = [key for key, _, _ in COLUMNS if key != "load_1m"]  # each row is stamped with it
    values = [{key: r[key] for key in keys} for r in rows]
    source = "python bench/bench_multilora.py " + " ".join(sys.argv[1:])
    load_average = f"{min(loads):.1f}-{max(loads):.1f}"
    append_rows("bench_multilora", values, source=source, load_average=load_average)
    growth = growth_row(values)
    if growth is not None:
        append_rows("bench_multilora_growth", [growth], source=source,
                    load_average=load_average)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="two configurations, 2,000 requests, 50 and 150%% load")
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--loads", type=float, nargs="+", default=[0.5, 1.0, 1.5],
                        help="offered load as a share of the capacity")
    parser.add_argument("--capacity-requests", type=int, default=4000,
                        help="requests of the closed batch that measures capacity")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192,
                        help="token budget per step (the runs' launchers leave it unset)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the first configuration at the first load and size, in "
                             "this process, and print each function's share (no table); with "
                             "--record, append its row to bench_sim_profile.json")
    parser.add_argument("--configs", nargs="+", metavar="ADAPTERS/SLOTS",
                        help="configurations to run, e.g. 64/16 320/16 (default: the grid)")
    parser.add_argument("--record", action="store_true",
                        help="also append the rows to bench/results/bench_multilora.json "
                             "(rendered into docs/benchmarks.md by bench/tables.py)")
    parser.add_argument("--out", type=Path, default=OUT_DIR / "multilora.json")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.loads, args.capacity_requests = [2000], [0.5, 1.5], 1000
    grid = QUICK_GRID if args.quick else GRID
    if args.configs:
        grid = [tuple(int(x) for x in c.split("/")) for c in args.configs]
    configs = select(load_run_configs(data_file(RUNS_CSV)), grid)
    lengths = sharegpt_lengths(data_file(SHAREGPT_CSV))
    if args.profile:
        cfg, tokens = configs[0], args.max_num_batched_tokens
        capacity = _capacity(cfg, lengths, args.capacity_requests, tokens)
        wl = workload(cfg, lengths, args.loads[0] * capacity, args.sizes[0], seed=1)
        text, row = profile(f"{cfg.name} at {args.loads[0]:.0%} of capacity", sim_config(
            cfg, tokens), wl)
        print(text)
        if args.record:
            from bench.record import append_rows

            append_rows("bench_sim_profile", [row], source="python bench/bench_multilora.py "
                        + " ".join(sys.argv[1:]))
        return
    from bench.record import machine_description

    meta = dict(date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                machine=machine_description(), python=platform.python_version(),
                load_average=os.getloadavg(), max_num_batched_tokens=args.max_num_batched_tokens,
                capacity_requests=args.capacity_requests)
    rows, capacities = [], {}
    for cfg in configs:
        capacities[cfg.name] = _in_process(
            _capacity_case, (cfg, lengths, args.capacity_requests, args.max_num_batched_tokens))
        print(f"{cfg.name} ({cfg.run_id}): capacity {capacities[cfg.name]:.2f} requests/s",
              flush=True)
        for size in args.sizes:
            for load in args.loads:
                row = _in_process(_case, (cfg, load, capacities[cfg.name], size,
                                          args.max_num_batched_tokens, lengths))
                rows.append(row)
                print(f"  {load:.0%} {size:>7} requests: {row['requests_per_cpu_s']:>8,.0f} "
                      f"req/CPU-s, {row['peak_rss_gib']:.2f} GiB, mean queue "
                      f"{row['mean_waiting']:,.0f}", flush=True)
    growth = cost_growth(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(**meta, configs=[asdict(c) for c in configs],
                                        rows=rows, cost_growth=growth), indent=2))
    if args.record:
        record(rows)
    table = markdown(rows, growth, meta)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
