"""The work term of the GPU LoRA kernels' computing programs (`lora_working_mac_s`), fitted
where it shows: the steps of light serving runs.

vLLM 0.8.5 splits the shrink's K 64 ways under 128 tokens and 8 ways above, so a computing
shrink program of a light step does an eighth of the work of one at 220 tokens. The step fit
(`calibrate.gpu_fit`) cannot tell a program's fixed cost from its work: its LoRA steps hold
220-250 tokens (split 8) with an adapter's one or two tokens, and its batch-1 probes run one
adapter beside the idle programs of 8-384 slots; its error moves by under 0.1 point over the
whole range of this term. The serving runs can: vLLM's counters give each run's running
requests and, with the client's throughput, the mean step's composition (decodes and the
prompts admitted per step) and its duration (the token interval, Little's law). The term is
chosen so that the light runs' steps are priced without bias (median log of measured over
priced 0), the step fit redone at each value; the runs are the test set's that the validation
never scores (every 4th from the first is its held-out table, so these are the others).

Runs whose mean step holds under `MAX_FIT_TOKENS` tokens count as light: larger steps carry
the unexplained miss of mixed steps (docs/gpu-errors.md), which this term is not.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np

from calibrate.gpu_runs import ServingRun, load_serving_runs
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY, expected_distinct
from sim.cost.cost_model import CostCoeffs, create_step_batch, predict_step
from sim.cost.layer_costs import create_layer_costs
from sim.hardware.catalogue import get_gpu, get_model

ENGINE_METRICS = "engine_metrics.csv"
MAX_STEP_TOKENS = 2048
"""vLLM 0.8.5 V1's token budget per step (`max_num_batched_tokens`) in these runs."""
MAX_FIT_TOKENS = 256
HELD_OUT_EVERY = 4
"""The validation's held-out table is every 4th test-set run from the first: never fitted."""
MAX_MAC_S = 3e-13
"""Upper end of the search: the whole working-program cost of a 220-token step's adapter."""
FIT_RULE = (f"test-set runs not in the validation's table (index % {HELD_OUT_EVERY} != 0) "
            f"whose mean measured step holds under {MAX_FIT_TOKENS} tokens")


def load_engine_metrics(path: Path) -> dict[str, dict[str, float]]:
    """Run id -> its measured engine-state row (floats)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return {row.pop("run_id"): {k: float(v) for k, v in row.items()}
                for row in csv.DictReader(fh)}


def measured_state(row: dict[str, float], run: ServingRun) -> dict[str, float]:
    """The measured row of `run`: running, waiting, KV use, generated tokens per second,
    preemptions per second and the token interval (running / generated tokens per second)."""
    tokens = run.measured["throughput_rps"] * run.mean_output_tokens
    return dict(running=row["running_median"], waiting=row["waiting_median"],
                kv_usage=row["kv_usage_median"], generated_tokens_per_s=tokens,
                preemptions_per_s=row["preemptions_per_s"],
                token_interval_ms=1e3 * row["running_median"] / tokens if tokens else None)


def priced_mixed_step_ms(run: ServingRun, coeffs, running: float,
                         num_prompts: float) -> tuple[float, float]:
    """(price ms, tokens) of the mean step at a measured composition: `running` decodes at the
    mean context halfway through a reply, plus `num_prompts` prompts of the run's mean length
    per step (a fraction: that share of steps holds one more), cut to vLLM's 2,048-token
    budget; distinct adapters as in `priced_decode_step_ms`. Preemptions' recomputed prompts
    are left out."""
    decodes = max(1, int(round(running)))
    arch = get_model(run.model)
    distinct = max(1, min(run.max_loras, round(expected_distinct(len(run.adapter_rates),
                                                                  decodes))))
    context = int(run.mean_prompt_tokens + run.mean_output_tokens / 2)
    profile = create_layer_costs(arch, get_gpu("H100-64GB"), adapter_kind="lora",
                                 adapter_rank=run.max_lora_rank, max_loras=run.max_loras)

    def step(count: int) -> tuple[float, int]:
        left = max(0, MAX_STEP_TOKENS - decodes)
        chunks, prompt = [], max(1, int(round(run.mean_prompt_tokens)))
        for _ in range(count):
            if left <= 0:
                break
            chunks.append(min(prompt, left))
            left -= chunks[-1]
        new = [1] * decodes + chunks
        batch = create_step_batch(new, [context] * decodes + [0] * len(chunks),
                                  num_layers=arch.num_layers,
                                  adapter_ids=[i % distinct for i in range(len(new))])
        return 1e3 * predict_step(coeffs, profile, batch).total_s, sum(new)

    whole, share = int(num_prompts), num_prompts - int(num_prompts)
    (low_ms, low_tokens), (high_ms, high_tokens) = step(whole), step(whole + 1)
    return (low_ms * (1 - share) + high_ms * share,
            float(low_tokens * (1 - share) + high_tokens * share))


def mixed_step_rows(coeffs, root: Path = DATA_DIR) -> list[dict]:
    """Every test-set run with engine counters: the measured token interval against the
    profile's price of a step at the measured composition (running decodes plus the prompts
    the measured throughput admits per interval): no replay, so what is left is the price."""
    metrics = load_engine_metrics(root / ENGINE_METRICS)
    rows = []
    for run in load_serving_runs(root / RUNS_SUMMARY):
        if run.run_id not in metrics:
            continue
        m = measured_state(metrics[run.run_id], run)
        if not m["token_interval_ms"]:
            continue
        prompts = run.measured["throughput_rps"] * m["token_interval_ms"] / 1e3
        price, tokens = priced_mixed_step_ms(run, coeffs, m["running"], prompts)
        rows.append(dict(run_id=run.run_id, model=run.model, max_loras=run.max_loras,
                         is_saturated=run.measured["throughput_rps"]
                         < 0.95 * sum(run.adapter_rates), running=m["running"],
                         num_prompts=prompts, step_tokens=tokens,
                         measured_interval_ms=m["token_interval_ms"],
                         priced_step_ms=price))
    return rows


def light_ratios(coeffs: CostCoeffs, rows: list[dict], runs: dict[str, ServingRun]) -> np.ndarray:
    """log(measured interval / priced step) of the light `rows` of `mixed_step_rows`."""
    out = []
    for row in rows:
        run = runs[row["run_id"]]
        price, _ = priced_mixed_step_ms(run, coeffs, row["running"], row["num_prompts"])
        out.append(np.log(row["measured_interval_ms"] / price))
    return np.array(out)


def fitting_rows(coeffs: CostCoeffs, root: Path = DATA_DIR) -> list[dict]:
    """`mixed_step_rows` of the light runs the validation never scores (`FIT_RULE`)."""
    held = {r.run_id for r in load_serving_runs(root / RUNS_SUMMARY)[::HELD_OUT_EVERY]}
    return [r for r in mixed_step_rows(coeffs, root)
            if r["run_id"] not in held and r["step_tokens"] < MAX_FIT_TOKENS]


def fit_working_mac(refit: Callable[[float], CostCoeffs], rows: list[dict],
                    runs: dict[str, ServingRun], num_halvings: int = 10,
                    ) -> tuple[float, CostCoeffs, dict]:
    """(lora_working_mac_s, the step fit at it, summary): bisection on the median log error of
    `rows` (`fitting_rows`; `runs` by id); `refit(mac)` is the step fit with the term held at
    `mac`. A price that falls as the term grows (the per-program cost refitted lower) makes
    the median error rise with it."""

    def bias(mac: float) -> tuple[float, CostCoeffs]:
        coeffs = refit(mac)
        return float(np.median(light_ratios(coeffs, rows, runs))), coeffs

    lo, hi = 0.0, MAX_MAC_S
    start_bias, coeffs = bias(lo)
    mac = 0.0
    if start_bias < 0:  # light steps priced dearer than measured
        for _ in range(num_halvings):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if bias(mid)[0] < 0 else (lo, mid)
        mac = (lo + hi) / 2
        coeffs = refit(mac)
    final = light_ratios(coeffs, rows, runs)
    return mac, coeffs, dict(lora_working_mac_s=mac, num_runs=float(len(rows)),
                             median_log_error_at_zero=start_bias,
                             median_abs_error=float(np.median(np.abs(np.expm1(final)))))
