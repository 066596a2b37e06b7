"""Why the held-out serving runs miss (docs/gpu-errors.md): the engine's own counters during
each measured hour set against the replay's, run by run.

    python -m calibrate.gpu_errors [--every 20] [--window-s 180]
    python -m calibrate.gpu_errors --mixed-steps   # measured step vs its price, every run
    python -m calibrate.gpu_errors --work-fit      # the split-K work term on light runs (E)

Measured: `data/gpu/agullo-dt/engine_metrics.csv` (vLLM's Prometheus gauges, polled every 2 s
by the benchmark client for the whole hour; `data/gpu/cut_agullo_engine_metrics.py`): median
running and waiting requests and KV usage over the hour's steady part, and preemptions per
second; generated tokens per second are the client's (completed requests' output tokens over
the hour). Predicted: the same quantities in the replay's scored span (`calibrate.gpu_runs`).
The token interval, running / generated tokens per second, is the mean time between two
tokens of a running sequence: the TPOT a run's batch and rate imply (Little's law).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from calibrate.gpu_runs import WARMUP_S, WINDOW_S, ServingRun, load_serving_runs, replay_run
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY, expected_distinct
from calibrate.gpu_work_fit import (
    ENGINE_METRICS,
    fit_working_mac,
    fitting_rows,
    load_engine_metrics,
    measured_state,
    mixed_step_rows,
)

STATE = ("running", "waiting", "kv_usage", "generated_tokens_per_s", "preemptions_per_s",
         "token_interval_ms")


def replay_state(run: ServingRun, coeffs, *, window_s: float = WINDOW_S,
                 warmup_s: float = WARMUP_S, seed: int = 0, **replay) -> dict[str, float]:
    """The replay's engine state over its scored span, in `STATE`'s terms, plus its TPOT p50
    (`replay`: `calibrate.gpu_runs.replay_run`'s options)."""
    result, scores = replay_run(run, coeffs, window_s=window_s, warmup_s=warmup_s, seed=seed,
                                **replay)
    rate_scale = scores["rate_scale"]
    ts = result.timeseries
    span = ts[(ts["time_s"] > warmup_s) & (ts["time_s"] <= window_s)]
    blocks = result.stats["num_kv_blocks"]
    turns = result.turns
    done = turns[(turns["done_s"] > warmup_s) & (turns["done_s"] <= window_s)]
    tokens = float(done["num_output_tokens"].sum()) / (window_s - warmup_s)
    preempted = span["num_preemptions"].to_numpy()
    running = float(np.median(span["num_running"]))
    return dict(running=running, waiting=float(np.median(span["num_waiting"])),
                kv_usage=float(np.median(span["kv_blocks_used"])) / blocks,
                generated_tokens_per_s=tokens,
                preemptions_per_s=float(preempted[-1] - preempted[0]) / (window_s - warmup_s),
                token_interval_ms=1e3 * running / tokens if tokens else None,
                tpot_p50_ms=1e3 * float(np.median(done["tpot_s"])), rate_scale=rate_scale,
                num_kv_blocks=blocks)


def priced_decode_step_ms(run: ServingRun, coeffs, batch: int) -> float:
    """The profile's price of one decode step of `batch` running sequences of the run, at the
    mean context of a request halfway through its reply, over as many distinct adapters as
    `batch` uniform draws from the run's adapters hit, at most `max_loras`."""
    from sim.cost.cost_model import create_step_batch, predict_step
    from sim.cost.layer_costs import create_layer_costs
    from sim.hardware.catalogue import get_gpu, get_model

    batch = max(1, int(round(batch)))
    arch = get_model(run.model)
    n = len(run.adapter_rates)
    distinct = max(1, min(run.max_loras, round(expected_distinct(n, batch))))
    context = int(run.mean_prompt_tokens + run.mean_output_tokens / 2)
    profile = create_layer_costs(arch, get_gpu("H100-64GB"), adapter_kind="lora",
                                 adapter_rank=run.max_lora_rank, max_loras=run.max_loras)
    step = create_step_batch([1] * batch, [context] * batch, num_layers=arch.num_layers,
                             adapter_ids=[i % distinct for i in range(batch)])
    return 1e3 * predict_step(coeffs, profile, step).total_s


def state_rows(coeffs, every: int, window_s: float, root: Path = DATA_DIR, offset: int = 0,
               **replay) -> list[dict]:
    """Every `every`-th test-set run that has engine counters: measured and replayed state."""
    metrics = load_engine_metrics(root / ENGINE_METRICS)
    runs = [r for r in load_serving_runs(root / RUNS_SUMMARY)
            if r.run_id in metrics][offset::every]
    rows = []
    for run in runs:
        offered = sum(run.adapter_rates)
        rows.append(dict(
            run_id=run.run_id, model=run.model, max_loras=run.max_loras,
            num_adapters=len(run.adapter_rates), offered_rps=offered,
            is_saturated=run.measured["throughput_rps"] < 0.95 * offered,
            measured_tpot_p50_ms=1e3 * run.measured["tpot_p50_s"],
            measured=measured_state(metrics[run.run_id], run),
            priced_step_at_measured_batch_ms=priced_decode_step_ms(
                run, coeffs, metrics[run.run_id]["running_median"]),
            replay=replay_state(run, coeffs, window_s=window_s,
                                warmup_s=min(WARMUP_S, window_s / 3), **replay)))
    return rows


def first_request_rows(validation: dict, root: Path = DATA_DIR) -> list[dict]:
    """Unsaturated runs of the validation JSON: the share of the hour's completed requests that
    were the first of their adapter (each adapter's first request in the server's life), and the
    measured and replayed TTFT."""
    runs = {r.run_id: r for r in load_serving_runs(root / RUNS_SUMMARY)}
    rows = []
    for row in validation["runs"]["rows"]:
        if row["is_saturated"]:
            continue
        run = runs[row["run_id"]]
        completed = run.measured["throughput_rps"] * 3600
        rows.append(dict(run_id=row["run_id"], model=row["model"], max_loras=row["max_loras"],
                         num_adapters=row["num_adapters"],
                         first_request_share=row["num_adapters"] / completed,
                         measured_p99_ms=1e3 * row["measured"]["ttft_p99_s"],
                         predicted_p99_ms=1e3 * row["predicted"]["ttft_p99_s"],
                         measured_p50_ms=1e3 * row["measured"]["ttft_p50_s"],
                         predicted_p50_ms=1e3 * row["predicted"]["ttft_p50_s"]))
    return rows


STEP_TOKEN_BANDS = (0, 128, 256, 384, 512, 768, 1024, 1536, 2048)
"""Bands of the mean measured step's tokens (CUDA graphs are captured up to 512 tokens)."""


def mixed_step_table(rows: list[dict]) -> list[dict]:
    """`mixed_step_rows` by model, saturation and band of step tokens: runs and the median of
    measured interval / priced step."""
    out = []
    for model in sorted({r["model"] for r in rows}):
        for saturated in (False, True):
            for lo, hi in zip(STEP_TOKEN_BANDS, STEP_TOKEN_BANDS[1:], strict=False):
                ratios = [r["measured_interval_ms"] / r["priced_step_ms"] for r in rows
                          if r["model"] == model and r["is_saturated"] == saturated
                          and lo < r["step_tokens"] <= hi]
                if ratios:
                    out.append(dict(model=model, is_saturated=saturated, tokens=f"{lo}-{hi}",
                                    num_runs=len(ratios), median_ratio=float(np.median(ratios))))
    return out


def main(argv=None) -> None:
    from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
    from sim.cost.profile import load_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--lengths", default="sharegpt", choices=("sharegpt", "lognormal"))
    parser.add_argument("--num-backlog", type=int, default=None,
                        help="requests queued ahead of the window (default: as predict_run)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--mixed-steps", action="store_true",
                        help="every run's measured step against its price (no replay)")
    parser.add_argument("--work-fit", action="store_true",
                        help="fit the split-K work term on light runs (calibrate.gpu_work_fit)")
    args = parser.parse_args(argv)
    if args.work_fit:
        print_work_fit()
        return
    coeffs = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").coefficients
    if args.mixed_steps:
        for row in mixed_step_table(mixed_step_rows(coeffs)):
            print(row)
        return
    rows = state_rows(coeffs, args.every, args.window_s, offset=args.offset,
                      lengths=args.lengths, num_backlog=args.num_backlog)
    for r in rows:
        m, p = r["measured"], r["replay"]
        print(f"{r['run_id'].split('test_dataset/')[1]:<70} sat={int(r['is_saturated'])} "
              + " ".join(f"{k}={_num(m[k])}/{_num(p[k])}" for k in STATE)
              + f" tpot50={r['measured_tpot_p50_ms']:.0f}/{p['tpot_p50_ms']:.0f}"
              + f" step@meas={r['priced_step_at_measured_batch_ms']:.0f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def print_work_fit() -> None:
    """Fit `lora_working_mac_s` on top of the shipped step fit and print it (the shipped
    profile keeps the step fit alone: docs/gpu-errors.md E says why)."""
    from calibrate.gpu_fit import step_refit

    refit = step_refit()
    rows = fitting_rows(refit(0.0))
    runs = {r.run_id: r for r in load_serving_runs(DATA_DIR / RUNS_SUMMARY)}
    mac, coeffs, summary = fit_working_mac(refit, rows, runs)
    print({k: round(v, 4) if k != "lora_working_mac_s" else v for k, v in summary.items()})
    print({k: getattr(coeffs, k) for k in ("lora_working_program_s", "lora_working_mac_s",
                                            "lora_idle_shrink_program_s",
                                            "lora_idle_expand_program_s")})


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"


if __name__ == "__main__":
    main()
