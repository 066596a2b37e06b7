"""Simulator speed: simulated requests per wall-second and peak memory, fast path vs reference.

Runs a Punica-style workload (1,000-request benchmark scaled up: lognormal prompts, 128 output
tokens, uniform mix over 8 adapters, all submitted at once, max batch 32), a multi-turn
conversation workload (5-turn conversations with prefix caching, 4 domains, switches) and the
Mooncake trace slice with its prefix-block hash ids (`mooncake_workload`) at 10k, 100k and 1M
requests, each case in a fresh process so that its peak RSS is its own. Prints a table and
writes out/bench/sim.json; its rows are appended to bench/results/bench_sim.json.

Wall seconds depend on what else the machine runs; CPU seconds (process time of the one core the
case runs on) are the steadier measure on a shared machine, and the table gives both.

    .venv/bin/python bench/bench_sim.py                 # 10k and 100k, fast path
    .venv/bin/python bench/bench_sim.py --sizes 1000000 # the 1M case
    .venv/bin/python bench/bench_sim.py --reference     # also the step-by-step reference (10k)
    .venv/bin/python bench/bench_sim.py --workloads conversations --sizes 100000 300000 1000000

With two sizes or more of a workload it also fits peak RSS as a line in the request count (the
residuals show whether memory is linear) and gives the fit at 1M requests, marked measured or
extrapolated. Each row also records the 1-minute load average when its case ended.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "out" / "bench" / "sim.json"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # sim_configs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import append_rows  # noqa: E402

MOONCAKE_RATE_SCALE = 0.1
"""The Mooncake slice's arrivals slowed tenfold (0.3 requests/s): one H100 replica serves
about 0.4/s of its 13.7k-token prompts, so at the trace's own rate the queue only grows."""


def mooncake_workload(num_requests: int):
    """The Mooncake conversation trace (the repository's 1,000-row slice, or the full trace
    under $MOLCAP_DATA_DIR) with its prefix-block hash ids, repeated end to end up to
    `num_requests`: each copy is shifted in time and gets its own hash ids, so a copy shares
    prefixes as the trace does, never with another copy."""
    from dataclasses import replace

    from sim.workload.generate import HashIds
    from sim.workload.traces import TRACES_DIR, trace_workload

    base = trace_workload(np.random.default_rng(0),
                          TRACES_DIR / "mooncake_fast25" / "conversation_trace.jsonl",
                          num_domains=8, fmt="jsonl", hash_ids_column="hash_ids",
                          time_unit="ms", rate_scale=MOONCAKE_RATE_SCALE)
    n = base.num_turns
    copies = -(-num_requests // n)
    span = float(base.conv_arrival_s[-1]) * (1 + 1 / n)
    ids = base.turn_hash_ids
    id_stride = 1 + int(ids.ids.max())
    # Copy k's ids shifted by k strides, as flat arrays (tuples of ints would be the peak).
    starts = (ids.starts[:-1][None, :] + ids.ids.size * np.arange(copies)[:, None]).ravel()
    all_ids = HashIds((ids.ids[None, :] + id_stride * np.arange(copies)[:, None]).ravel(),
                      np.append(starts, copies * ids.ids.size))
    keep = slice(0, num_requests)
    tile = lambda a: np.tile(a, copies)[keep]  # noqa: E731
    return replace(
        base, conv_arrival_s=(base.conv_arrival_s[None, :]
                              + span * np.arange(copies)[:, None]).ravel()[keep],
        conv_first_turn=np.arange(num_requests), conv_num_turns=tile(base.conv_num_turns),
        conv_initial_tokens=tile(base.conv_initial_tokens), turn_domain=tile(base.turn_domain),
        turn_user_tokens=tile(base.turn_user_tokens),
        turn_reply_tokens=tile(base.turn_reply_tokens), turn_think_s=tile(base.turn_think_s),
        turn_hash_ids=all_ids.take(np.arange(num_requests)))


def _workload(kind: str, num_requests: int):
    from sim.workload.generate import conversation_workload, punica_workload

    rng = np.random.default_rng(0)
    if kind == "mooncake":
        return mooncake_workload(num_requests)
    if kind == "punica":
        return punica_workload(rng, num_requests=num_requests, num_adapters=8,
                               popularity="uniform", num_output_tokens=128)
    num_turns = 5
    return conversation_workload(
        rng, num_conversations=num_requests // num_turns, num_turns=num_turns, num_domains=4,
        switch_probability=0.3, num_initial_context_tokens=1024, num_user_tokens=128,
        num_reply_tokens=128, think_time_s=5.0, arrival_rate_per_s=2.0)


def _case(kind: str, num_requests: int, mode: str, queue) -> None:
    from sim_configs import small_config

    from sim.simulate import simulate

    workload = _workload(kind, num_requests)
    config = small_config("multi_lora", mode=mode, max_num_seqs=32, max_loras=8,
                          num_adapters=8).model_copy(update={"check_invariants": False})
    # A million Mooncake requests arrive over 38 days, past the default 30-day bound.
    bounds = config.bounds.model_copy(update={"max_simulated_time_s": max(
        config.bounds.max_simulated_time_s, 2 * float(workload.conv_arrival_s.max()))})
    config = config.model_copy(update={"bounds": bounds})
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(config, workload, timeseries_interval_s=10.0)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put(dict(workload=kind, mode=mode, num_requests=len(result.requests), wall_s=wall,
                   requests_per_wall_s=len(result.requests) / wall, cpu_s=cpu,
                   requests_per_cpu_s=len(result.requests) / cpu,
                   engine_steps=result.stats["num_engine_steps"],
                   engine_events=result.stats["num_engine_events"],
                   peak_rss_gib=peak / 2**30, load_1m=os.getloadavg()[0],
                   simulated_s=float(result.turns["done_s"].max())))


def run_case(kind: str, num_requests: int, mode: str) -> dict:
    """One benchmark case in its own process."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_case, args=(kind, num_requests, mode, queue))
    proc.start()
    while queue.empty():  # a case that raised would leave the queue empty for ever
        if not proc.is_alive() and queue.empty():
            raise RuntimeError(f"{kind} {num_requests} {mode}: the case's process died "
                               f"(exit code {proc.exitcode}; its traceback is above)")
        time.sleep(0.5)
    row = queue.get()
    proc.join()
    return row


def memory_fits(rows: list[dict]) -> list[dict]:
    """Per workload with two sizes or more (fast path): peak RSS as a line in the request count,
    so that linearity shows in the residuals and a size not run is an explicit extrapolation."""
    fits = []
    for kind in dict.fromkeys(r["workload"] for r in rows):
        points = sorted((r["num_requests"], r["peak_rss_gib"]) for r in rows
                        if r["workload"] == kind and r["mode"] == "fast")
        if len({n for n, _ in points}) < 2:
            continue
        sizes, gib = np.array(points, dtype=float).T
        slope, base = np.polyfit(sizes, gib, 1)
        fits.append(dict(workload=kind, sizes=[int(n) for n in sizes], base_gib=float(base),
                         gib_per_million=float(slope * 1e6),
                         max_residual_gib=float(np.abs(base + slope * sizes - gib).max()),
                         at_1m_gib=float(base + slope * 1e6)))
    return fits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--workloads", nargs="+",
                        default=["punica", "conversations", "mooncake"])
    parser.add_argument("--out", type=Path, default=OUT, help="JSON file to write")
    parser.add_argument("--reference", action="store_true",
                        help="also time the step-by-step reference at the smallest size")
    args = parser.parse_args()
    header = f"{'workload':<14}{'mode':<10}{'requests':>10}{'wall s':>9}{'req/s':>10}" \
             f"{'cpu s':>9}{'req/cpu-s':>10}{'steps':>11}{'events':>9}{'peak GiB':>10}"
    print(header, flush=True)
    rows = []
    for kind in args.workloads:
        cases = [(size, "fast") for size in args.sizes]
        if args.reference:
            cases.append((min(args.sizes), "reference"))
        for size, mode in cases:
            r = run_case(kind, size, mode)
            rows.append(r)
            print(f"{r['workload']:<14}{r['mode']:<10}{r['num_requests']:>10}{r['wall_s']:>9.2f}"
                  f"{r['requests_per_wall_s']:>10.0f}{r['cpu_s']:>9.2f}"
                  f"{r['requests_per_cpu_s']:>10.0f}{r['engine_steps']:>11}"
                  f"{r['engine_events']:>9}{r['peak_rss_gib']:>10.2f}", flush=True)
    fits = memory_fits(rows)
    for fit in fits:
        print(f"{fit['workload']}: peak RSS = {fit['base_gib']:.3f} GiB + "
              f"{fit['gib_per_million']:.3f} GiB per million requests (least squares over "
              f"{fit['sizes']}, largest residual {fit['max_residual_gib']:.3f} GiB); at 1M "
              f"requests {fit['at_1m_gib']:.2f} GiB"
              f"{' (measured)' if 1_000_000 in fit['sizes'] else ' (extrapolated)'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(python=platform.python_version(),
                                        machine=platform.machine(), load_average=os.getloadavg(),
                                        cpu_count=os.cpu_count(), rows=rows,
                                        memory_fits=fits), indent=2))
    command = "bench/bench_sim.py " + " ".join(sys.argv[1:])
    for r in rows:  # one call per case: each carries the load average when it ended
        keys = ("workload", "num_requests", "mode", "requests_per_cpu_s", "requests_per_wall_s",
                "cpu_s", "peak_rss_gib")
        append_rows("bench_sim", [{k: r[k] for k in keys} | {"note": "fresh process per case"}],
                    source=command, load_average=round(r["load_1m"], 2))
    print(f"wrote {args.out}; appended to bench/results/bench_sim.json")


if __name__ == "__main__":
    main()
