"""molcap's simulator side by side with Vidur on Vidur's own kind of workload.

The same trace in both: 10,000 requests of 512 prompt and 128 output tokens, Poisson arrivals,
Llama-2-70B on two A100-80GB (TP 2, one replica), at most 64 sequences and 512 batched tokens
per step (Vidur's Sarathi scheduler, vLLM-style chunked prefill in molcap), 16-token blocks,
90% of GPU memory. Vidur (PyPI `vidur==0.0.26`) runs in its own virtual environment, created
on first use under .cache/vidur-venv, on the offline profiles of data/vidur_profiles; molcap
runs in this interpreter's environment. Each simulator runs in a fresh process per repeat, the
two interleaved, and the table gives simulated requests per wall-second of each, their ratio
(min/median/max over the repeats) and both simulators' predicted throughput, TTFT and TPOT.
Writes out/bench/vidur.json and appends rows to bench/results/.

    .venv/bin/python bench/bench_vidur.py [--requests 10000] [--repeats 3]

Vidur's first run trains its random-forest predictors (cached afterwards under the run
folder's .vidur_cache); that one-time cost is reported apart and excluded from its speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # sim_configs
sys.path.insert(0, str(ROOT))

from bench.record import append_rows  # noqa: E402

OUT = ROOT / "out" / "bench"
VENV = ROOT / ".cache" / "vidur-venv"
PROFILES = ROOT / "data" / "vidur_profiles" / "profiling_data"
VIDUR = "vidur==0.0.26"
PROMPT, OUTPUT = 512, 128
MAX_NUM_SEQS, MAX_BATCHED_TOKENS = 64, 512


def ensure_vidur_venv() -> Path:
    """Vidur's own virtual environment (no torch: vidur 0.0.26 needs numpy/pandas/sklearn)."""
    python = VENV / "bin" / "python"
    if not (VENV / ".vidur-installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", VIDUR], check=True)
        (VENV / ".vidur-installed").touch()
    return python


def write_trace(path: Path, num_requests: int, rate_per_s: float, seed: int) -> np.ndarray:
    """Poisson arrivals in Vidur's trace-replay format; returns the arrival times."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, num_requests))
    lines = ["Date,Time,PromptTokenCount,CompletionTokenCount"]
    lines += [f"2024-01-01,{float(t)!r},{PROMPT},{OUTPUT}" for t in arrival]
    path.write_text("\n".join(lines) + "\n")
    return arrival


def run_vidur(python: Path, workdir: Path, trace: Path) -> dict:
    """One Vidur run in a fresh process; its own timings plus the process's wall seconds."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="disabled", PYTHONPATH="")
    cmd = [str(python), str(ROOT / "bench" / "vidur_driver.py"), str(trace),
           str(workdir / "simulator_output"), "--tp", "2", "--max-num-seqs", str(MAX_NUM_SEQS),
           "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS),
           "--max-tokens", str(PROMPT + OUTPUT)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"vidur failed ({done.returncode}):\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_wall_s"] = wall
    return row


def molcap_config():
    """The same deployment in molcap: Llama-2-70B geometry, 2x A100-80GB, base model."""
    from sim_configs import strategy_for

    from sim.config import EngineLimits, SimConfig
    from sim.hardware.catalogue import get_gpu, get_model

    arch = get_model("llama-3.1-70b").model_copy(update=dict(
        name="llama-2-70b", vocab_size=32000, max_context_tokens=4096))
    return SimConfig(arch=arch, gpu=get_gpu("A100-80GB"), tensor_parallel_size=2,
                     engine=EngineLimits(max_num_seqs=MAX_NUM_SEQS,
                                         max_num_batched_tokens=MAX_BATCHED_TOKENS,
                                         block_size=16, gpu_memory_utilization=0.9,
                                         enable_prefix_caching=False),
                     strategy=strategy_for("base", "llama-3.1-70b"))


def molcap_case(arrival_path: str) -> None:
    """Child process: simulate the trace, print one JSON line."""
    t0 = time.perf_counter()
    from sim.simulate import simulate
    from sim.workload.generate import single_turn_workload

    imported = time.perf_counter()
    arrival = np.load(arrival_path)
    n = arrival.size
    workload = single_turn_workload(arrival, np.full(n, PROMPT), np.full(n, OUTPUT),
                                    np.zeros(n, dtype=np.int64))
    start = time.perf_counter()
    result = simulate(molcap_config(), workload, timeseries_interval_s=60.0)
    run = time.perf_counter() - start
    s = result.summary
    turns = result.turns
    print(json.dumps(dict(
        import_s=imported - t0, run_s=run, num_requests=int(s["num_turns"]),
        last_completion_s=float(turns["done_s"].max()),
        ttft_p50_s=s["ttft_p50_s"], ttft_p99_s=s["ttft_p99_s"], ttft_mean_s=s["ttft_mean_s"],
        tpot_p50_s=s["tpot_p50_s"], tpot_mean_s=s["tpot_mean_s"], e2e_p50_s=s["e2e_p50_s"],
        num_kv_blocks=result.stats["num_kv_blocks"],
        num_preemptions=s["num_preemptions"])))


def run_molcap(arrival_path: Path) -> dict:
    """One molcap run in a fresh process of this interpreter."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--molcap-case", str(arrival_path)],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"molcap failed ({done.returncode}):\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_wall_s"] = wall
    return row


def _spread(values) -> dict:
    return dict(min=min(values), median=statistics.median(values), max=max(values))


def _predictions(row: dict, first_arrival_s: float) -> dict:
    duration = row["last_completion_s"] - first_arrival_s
    return dict(requests_per_s=row["num_requests"] / duration,
                output_tokens_per_s=row["num_requests"] * OUTPUT / duration,
                ttft_p50_ms=1e3 * row["ttft_p50_s"], ttft_p99_ms=1e3 * row["ttft_p99_s"],
                tpot_p50_ms=1e3 * row["tpot_p50_s"], tpot_mean_ms=1e3 * row["tpot_mean_s"])


def _print_table(report: dict) -> None:
    speed = report["speed"]
    print(f"{report['num_requests']} requests, {PROMPT}/{OUTPUT} tokens, Poisson "
          f"{report['rate_per_s']}/s, Llama-2-70B TP 2 on A100-80GB; "
          f"{report['repeats']} interleaved repeats; load average {report['load_average']}")
    print(f"{'simulated req per wall-s':<34}{'min':>10}{'median':>10}{'max':>10}")
    for name in ("molcap", "vidur", "ratio"):
        v = speed[name]
        print(f"{name:<34}{v['min']:>10.1f}{v['median']:>10.1f}{v['max']:>10.1f}")
    v = speed["ratio_end_to_end"]
    print(f"{'ratio, whole processes':<34}{v['min']:>10.1f}{v['median']:>10.1f}{v['max']:>10.1f}")
    print(f"\n{'prediction':<24}{'molcap':>12}{'vidur':>12}")
    for key in report["predictions"]["molcap"]:
        print(f"{key:<24}{report['predictions']['molcap'][key]:>12.2f}"
              f"{report['predictions']['vidur'][key]:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT / "vidur.json")
    parser.add_argument("--molcap-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.molcap_case:
        return molcap_case(args.molcap_case)
    python = ensure_vidur_venv()
    work = OUT / "vidur"
    cache = work / ".vidur_cache" / "profiling_data"
    if not cache.exists():
        shutil.copytree(PROFILES, cache)
    trace = work / "trace.csv"
    arrival = write_trace(trace, args.requests, args.rate, seed=0)
    np.save(work / "arrival.npy", arrival)
    warm = run_vidur(python, work, trace)  # trains and caches the predictors the first time
    molcap_rows, vidur_rows = [], []
    for _ in range(args.repeats):
        molcap_rows.append(run_molcap(work / "arrival.npy"))
        vidur_rows.append(run_vidur(python, work, trace))
    rate = {name: [r["num_requests"] / r["run_s"] for r in rows]
            for name, rows in (("molcap", molcap_rows), ("vidur", vidur_rows))}
    ratio = [m / v for m, v in zip(rate["molcap"], rate["vidur"], strict=True)]
    ratio_e2e = [v["process_wall_s"] / m["process_wall_s"]
                 for m, v in zip(molcap_rows, vidur_rows, strict=True)]
    report = dict(
        num_requests=args.requests, rate_per_s=args.rate, repeats=args.repeats,
        load_average=[round(x, 2) for x in os.getloadavg()], cpu_count=os.cpu_count(),
        vidur=VIDUR, goal="molcap >= 20x Vidur's simulated requests per wall-second",
        speed=dict(molcap=_spread(rate["molcap"]), vidur=_spread(rate["vidur"]),
                   ratio=_spread(ratio), ratio_end_to_end=_spread(ratio_e2e)),
        predictions=dict(molcap=_predictions(molcap_rows[-1], float(arrival[0])),
                         vidur=_predictions(vidur_rows[-1], float(arrival[0]))),
        vidur_first_run=dict(setup_s=warm["setup_s"], run_s=warm["run_s"]),
        runs=dict(molcap=molcap_rows, vidur=vidur_rows))
    _print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    _append_results(report, "bench/bench_vidur.py " + " ".join(sys.argv[1:]))
    print(f"wrote {args.out}; appended to bench/results/bench_vidur*.json")


def _append_results(report: dict, command: str) -> None:
    """The speed row and the predictions, as rows of bench/results/."""
    def spread(v: dict, fmt: str) -> str:
        return " / ".join(format(v[k], fmt) for k in ("min", "median", "max"))

    speed = report["speed"]
    append_rows("bench_vidur", [dict(
        molcap_req_per_s=spread(speed["molcap"], ",.0f"),
        vidur_req_per_s=spread(speed["vidur"], ",.0f"), ratio=spread(speed["ratio"], ".1f") + "x",
        ratio_whole_process=spread(speed["ratio_end_to_end"], ".1f") + "x",
        note=f"{report['num_requests']} requests at {report['rate_per_s']}/s, "
             f"{report['repeats']} repeats")], source=command)
    labels = dict(requests_per_s="throughput (req/s)", ttft_p50_ms="TTFT p50 (ms)",
                  ttft_p99_ms="TTFT p99 (ms)", tpot_p50_ms="TPOT p50 (ms)")
    append_rows("bench_vidur_predictions", [
        dict(metric=label, molcap=report["predictions"]["molcap"][key],
             vidur=report["predictions"]["vidur"][key]) for key, label in labels.items()],
        source=command)


if __name__ == "__main__":
    main()
