"""The numba prototype of the decode-run evaluation (`bench/numba_decode_run.py`) against the
pure-Python path it mirrors, side by side on the same inputs, with equal results checked.

Inputs are captured from a real simulation: a bench_multilora configuration (Llama-3.1-8B on
an H100, ShareGPT lengths, one Poisson process per adapter) run on the fast path, recording
every decode run the pricer builds (start, non-attention terms, contexts, attention tables,
steps) and every decode run's block bound (`Engine.max_decode_run_steps`: each decode's outputs
left, computed tokens, blocks held, the free blocks). Then, for each recorded run, both paths
compute: the run's end, where an arrival at 10, 37, 50, 93 and 100% of the run would cut it
(`steps_to_reach`, each on a fresh run as the simulator does), and the block bound. Every
float must be equal bit for bit and every step count equal; the script exits 1 otherwise.
The pure-Python path prices a short run whole in plain floats and a longer one in numpy chunks,
as far as it is asked; the kernel prices them all.

Timing: each path over all recorded runs, best of --repeat, numba's compile time apart. The
machine must be quiet for the seconds to mean anything; `--tiny` only proves it runs.

    .venv/bin/python bench/bench_numba.py --tiny
    .venv/bin/python bench/bench_numba.py --config 64/16 --requests 20000 --rate 9 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TARGETS = (0.1, 0.37, 0.5, 0.93, 1.0)
"""Arrival times at which a run is cut, as shares of the run's seconds."""


def capture(config_name: str, num_requests: int, rate_per_s: float):
    """(decode runs, block bounds) recorded while simulating the configuration."""
    from bench import bench_multilora as bm
    from sim.engine.scheduler import Engine
    from sim.engine.step_pricer import StepPricer
    from sim.simulate import simulate

    adapters, slots = (int(x) for x in config_name.split("/"))
    chosen = bm.select(bm.load_run_configs(bm.data_file(bm.RUNS_CSV)), [(adapters, slots)])
    if not chosen:
        sys.stderr.write(f"error: --config {config_name}: no such configuration in the data\n")
        raise SystemExit(2)
    lengths = bm.sharegpt_lengths(bm.data_file(bm.SHAREGPT_CSV))
    runs, bounds = [], []
    decode_run, max_steps = StepPricer.decode_run, Engine.max_decode_run_steps

    def recording_run(self, plan, start_s, num_steps):
        run = decode_run(self, plan, start_s, num_steps)
        terms = self._cached_terms(plan)
        contexts = self.decode_contexts(plan).copy()
        last = int(contexts.max()) + self.adv * num_steps
        tables = self._decode_table(last)[None, :last + 1].copy()  # one kind: the item totals
        runs.append((start_s, terms, tables, contexts, self.adv, num_steps))
        return run

    def recording_bound(self, plan):
        rows = self.group.rows() if plan.num_group_decodes else [
            (s.num_output_tokens - s.num_generated_tokens, s.num_computed_tokens, s.num_blocks)
            for s in plan.decodes]
        steps = max_steps(self, plan)
        remaining, computed, held = (np.ascontiguousarray(a, dtype=np.int64)
                                     for a in np.array(rows, dtype=np.int64).T)
        bounds.append((remaining, computed, held, self.num_tokens_per_decode_step,
                       self.block_size, self.kv.num_free, steps))
        return steps

    StepPricer.decode_run, Engine.max_decode_run_steps = recording_run, recording_bound
    try:
        cfg = chosen[0]
        simulate(bm.sim_config(cfg, 8192), bm.workload(cfg, lengths, rate_per_s, num_requests,
                                                       seed=1))
    finally:
        StepPricer.decode_run, Engine.max_decode_run_steps = decode_run, max_steps
    return runs, bounds


def _targets(start_s: float, end_s: float) -> list[float]:
    return [start_s + share * (end_s - start_s) for share in TARGETS]


_TABLE_LISTS: dict[int, list[float]] = {}
"""A recorded table as a list, by the id of its (kept) recording: the simulator keeps both."""


def _python_run(start_s, terms, tables, contexts, adv, num_steps):
    """A fresh run of the recorded run, as the simulator builds it: a short one priced whole
    in plain floats (`ListedDecodeRun`), a longer one in numpy chunks (`DecodeRun`)."""
    from functools import partial

    from sim.engine.decode_run import DecodeRun, ListedDecodeRun
    from sim.engine.run_pricing import price_decode_steps, price_run_ends
    from sim.engine.step_pricer import LISTED_RUN_STEP_ITEMS, MAX_LISTED_RUN_VALUES

    table = tables[0]
    if num_steps * (contexts.size + LISTED_RUN_STEP_ITEMS) <= MAX_LISTED_RUN_VALUES:
        listed = _TABLE_LISTS.get(id(tables))
        if listed is None:
            listed = _TABLE_LISTS[id(tables)] = table.tolist()
        return ListedDecodeRun(price_run_ends(terms, listed, contexts.tolist(), adv, start_s,
                                              num_steps))
    return DecodeRun(start_s, num_steps, partial(price_decode_steps, terms, lambda _: table,
                                                 contexts, adv), num_items=contexts.size)


def python_path(runs, bounds) -> list:
    """The simulator's own code on every recorded input."""
    out = []
    for run in runs:
        start_s, num_steps = run[0], run[-1]
        end = _python_run(*run).end_s(num_steps)
        cuts = [_python_run(*run).steps_to_reach(t, num_steps)
                for t in _targets(start_s, end)]
        out.append((end, cuts))
    out.append([steps for *_, steps in bounds])  # the simulator's own bound, recorded
    return out


def numba_path(runs, bounds) -> list:
    """The prototype's kernels on the same inputs."""
    from bench import numba_decode_run as nb
    out = []
    scratch = np.empty(max((len(r[3]) for r in runs), default=1))
    for start_s, terms, tables, contexts, adv, num_steps in runs:
        before, after = terms.before_s, np.array(terms.after_s, dtype=float)
        ends = nb.run_ends(start_s, before, after, tables, contexts, adv, num_steps, scratch)
        end = float(ends[num_steps])
        cuts = [int(nb.steps_to_reach(ends, t, num_steps)) for t in _targets(start_s, end)]
        out.append((end, cuts))
    out.append([nb.max_run_steps(remaining, computed, held, adv, bs, free)
                for remaining, computed, held, adv, bs, free, _ in bounds])
    return out


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="64/16", help="ADAPTERS/SLOTS of bench_multilora")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=9.0,
                        help="requests per second (64/16 serves about 6/s: 9 is 150%%)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="16/16, 200 requests, one repeat")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    parser.add_argument("--record", action="store_true",
                        help="append the row to bench/results/bench_numba.json")
    args = parser.parse_args()
    if args.tiny:
        args.config, args.requests, args.repeat = "16/16", 200, 1
    runs, bounds = capture(args.config, args.requests, args.rate)
    start = time.perf_counter()
    numba_path(runs[:1], bounds[:1])  # compiles every kernel
    compile_s = time.perf_counter() - start
    expected, got = python_path(runs, bounds), numba_path(runs, bounds)
    mismatches = sum(a != b for a, b in zip(expected, got, strict=True))
    python_s = best_of(lambda: python_path(runs, bounds), args.repeat)
    numba_s = best_of(lambda: numba_path(runs, bounds), args.repeat)
    batch = [len(r[3]) for r in runs]
    result = dict(config=args.config, requests=args.requests, rate_per_s=args.rate,
                  decode_runs=len(runs), block_bounds=len(bounds),
                  mean_batch=float(np.mean(batch)) if batch else 0.0,
                  cuts_per_run=len(TARGETS), mismatches=int(mismatches),
                  python_s=python_s, numba_s=numba_s, numba_compile_s=compile_s,
                  speedup=python_s / numba_s if numba_s else float("nan"))
    print(f"{args.config}, {args.requests} requests at {args.rate}/s: {len(runs)} decode runs "
          f"(mean batch {result['mean_batch']:.0f}), {len(bounds)} block bounds")
    print(f"  python {python_s * 1e3:9.2f} ms   numba {numba_s * 1e3:9.2f} ms   "
          f"x{result['speedup']:.1f}   (numba compile {compile_s:.1f} s, best of {args.repeat})")
    print(f"  results equal: {'yes' if not mismatches else f'NO, {mismatches} differ'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    if args.record:
        from bench.record import append_rows

        append_rows("bench_numba", [result],
                    source="python bench/bench_numba.py " + " ".join(sys.argv[1:]))
    raise SystemExit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
