"""Held-out validation of the fitted GPU profile: docs/validation-gpu.md and its JSON.

    python -m calibrate.gpu_validate [--every 4] [--window-s 180]
    (or: molcap calibrate validate-gpu)

Four checks, none on data the fit saw:
1. steps: the fit's held-out samples (Llama's distinct-adapter runs at 64/96/160/192
   adapters, the batch-1 warm-ups, every Qwen2.5-7B sample), error per model and kind;
2. curve: the distinct-adapter sweep's mean TPOT (220 sequences, rank 8, max_loras 300, 1-300
   adapters in use) against the steady-state step the profile prices, the distinct adapters
   per step taken as the expectation for uniformly drawn adapters;
3. runs: every `--every`-th serving run of `ml_modelling/test_dataset`, less every run the
   profile records as run-fitted on (`fit.run_fit`, `calibrate.gpu_run_fit`) (ShareGPT lengths,
   per-adapter Poisson rates, max_loras 8-384, ranks 8-32) replayed for `--window-s` seconds
   and scored after a warm-up (`calibrate.gpu_runs`: why these lengths; overloaded runs
   thinned to a rate still above capacity), median |error| of throughput, TTFT and TPOT
   p50/p99 per model, by max_loras and by adapter ranks. TTFT of runs whose measured
   throughput falls short of the offered rate (a queue that grows for the whole hour) is left
   out: it depends on how long the queue has grown;
4. splitwise: the vidur-fitted A100-80GB and H100-SXM profiles (`calibrate.gpu_vidur_fit`) on
   Splitwise's whole Llama-2-70B prompt and token steps at TP 2/4/8, median |error| per
   machine, TP and phase (`calibrate.gpu_splitwise`): their latency per GPU of each
   all-reduce was fitted on the TP 2 and 4 token steps, so only TP 8 is held out there; and
   the alternative all-reduce bases fitted on TP 2 and 4, checked on TP 8.

The runs' errors are also written beside the profile as `<profile>.validation.json`, which
the planner's intervals read. The profiles scaled from this fit (`calibrate.gpu_scaled`) get
none on purpose: scaling by peak FLOP/s and bandwidth adds an error nobody measured, and
lending them the source's band would print it as measured; their plans say "no measured
error".
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from calibrate.gpu_data.base import DatasetMissingError
from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR, group_profiles, split_samples
from calibrate.gpu_runs import (
    METRICS,
    RATE_CAP_RPS,
    WARMUP_S,
    WINDOW_S,
    load_serving_runs,
    predict_run,
)
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY, expected_distinct, load_agullo_samples
from sim.cost.cost_model import create_step_batch, predict_step
from sim.cost.layer_costs import create_layer_costs
from sim.hardware.catalogue import get_gpu, get_model

DOCS = Path(__file__).resolve().parents[1] / "docs"
GOALS = dict(throughput_rps=0.05, tpot_p50_s=0.10, tpot_p99_s=0.10, ttft_p50_s=0.20,
             ttft_p99_s=0.20)


def curve_rows(coeffs, root: Path = DATA_DIR) -> list[dict]:
    """Mean TPOT of the distinct-adapter sweep (Llama, 220 sequences) against the priced step."""
    import csv
    import gzip

    arch, gpu = get_model("llama-3.1-8b"), get_gpu("H100-64GB")
    rows = []
    with gzip.open(root / RUNS_SUMMARY, "rt", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if (not row["group"].startswith("predictor_latency_overhead/")
                    or "llama" not in row["model"] or row["max_num_seqs"] != "220.0"
                    or not row["mean_tpot_ms"]):
                continue
            lora = row["enable_lora"] == "1"
            n = int(float(row["restrict_loras"])) if lora else 0
            out_len = int(float(row["synthetic_output_len"]))
            d = round(expected_distinct(n, 220)) if lora else 0
            profile = create_layer_costs(arch, gpu, adapter_kind="lora" if lora else "none",
                                          adapter_rank=8, max_loras=300 if lora else 0)
            batch = create_step_batch([1] * 220, [out_len // 2] * 220,
                                      num_layers=arch.num_layers,
                                      adapter_ids=[i % d for i in range(220)] if d else None)
            predicted = predict_step(coeffs, profile, batch).total_s * 1e3
            measured = float(row["mean_tpot_ms"])
            rows.append(dict(num_adapters=n, output_len=out_len, distinct_per_step=d,
                             measured_tpot_ms=measured, predicted_tpot_ms=predicted,
                             error=predicted / measured - 1))
    return sorted(rows, key=lambda r: (r["output_len"], r["num_adapters"]))


def step_rows(coeffs, root: Path = DATA_DIR) -> list[dict]:
    """Held-out step samples: error per model and kind."""
    from calibrate.gpu_fit import error_rows

    samples = load_agullo_samples(root)
    _, test = split_samples(samples)
    profiles = group_profiles({s.group for s in test}, get_gpu("H100-64GB"))
    return error_rows(coeffs, test, "test", profiles)


def held_out_runs(runs: list, every: int, profile) -> list:
    """Every `every`-th run, less every run `profile` was run-fitted on (its `fit.run_fit`
    record): a run a fit saw is never scored as held out."""
    record = profile.fit.run_fit
    fitted = set(record.run_ids) if record is not None else set()
    return [run for run in runs[::every] if run.run_id not in fitted]


def _replay(task) -> dict:
    run, coeffs, window_s = task
    return predict_run(run, coeffs, window_s=window_s, warmup_s=min(WARMUP_S, window_s / 3))


def run_rows(coeffs, runs: list, window_s: float, workers: int = 1) -> list[dict]:
    """`runs` simulated (by `workers` processes side by side) and compared."""
    tasks = [(run, coeffs, window_s) for run in runs]
    with ProcessPoolExecutor(workers) as pool:
        replays = list(pool.map(_replay, tasks) if workers > 1 else map(_replay, tasks))
    rows = []
    for run, predicted in zip(runs, replays, strict=True):
        offered = sum(run.adapter_rates)
        rows.append(dict(
            run_id=run.run_id, model=run.model, max_loras=run.max_loras,
            num_adapters=len(run.adapter_rates), ranks=" ".join(map(str, sorted(set(
                run.adapter_ranks)))), max_lora_rank=run.max_lora_rank,
            offered_rps=offered, is_saturated=run.measured["throughput_rps"] < 0.95 * offered,
            predicted_saturated=predicted.pop("is_saturated"),
            window_s=predicted.pop("window_s"), warmup_s=predicted.pop("warmup_s"),
            rate_scale=predicted.pop("rate_scale"),
            measured=run.measured, predicted=predicted,
            error={m: None if predicted[m] is None else predicted[m] / run.measured[m] - 1
                   for m in METRICS}))
    return rows


def _median_abs(rows, metric) -> float | None:
    errors = [abs(r["error"][metric]) for r in rows if r["error"][metric] is not None
              and not (metric.startswith("ttft") and r["is_saturated"])]
    return float(np.median(errors)) if errors else None


def summarize_runs(rows: list[dict]) -> list[dict]:
    """Median |error| per metric for each slice (all, model, max_loras band, ranks)."""
    def band(m):
        return "8-32" if m <= 32 else "64-128" if m <= 128 else "160-384"

    slices = {"all": rows}
    for key, label in (("model", lambda r: r["model"]),
                       ("max_loras", lambda r: band(r["max_loras"])),
                       ("ranks", lambda r: r["ranks"]),
                       ("saturated", lambda r: str(r["is_saturated"]))):
        for r in rows:
            slices.setdefault(f"{key}={label(r)}", []).append(r)
    return [dict(slice=name, num_runs=len(part),
                 **{m: _median_abs(part, m) for m in METRICS}) for name, part in slices.items()]


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def render_markdown(result: dict) -> str:
    """docs/validation-gpu.md from the JSON (tables for people; the JSON keeps every run)."""
    run_fit = result["runs"].get("run_fit")
    fitted_on = "Llama-3.1-8B steps of agullo-dt; see `calibrate/gpu_fit.py`"
    if run_fit:
        fitted_on += (f", then {len(run_fit['unknowns'])} terms on {run_fit['num_runs']} "
                      "serving runs, `calibrate/gpu_run_fit.py`")
    lines = [
        "# Held-out validation of the GPU profile",
        "",
        f"Profile `{result['profile']}` (vLLM 0.8.5 V1 on the 64 GB H100, fitted on "
        f"{fitted_on}). Regenerate with `{result['command']}`. Nothing below was fitted on.",
        "",
        "## Steps held out of the fit",
        "",
        "| model:kind | steps | MAPE | median APE |", "|---|---:|---:|---:|"]
    lines += [f"| {r['group']} | {r['num_samples']} | {_pct(r['mape'])} | "
              f"{_pct(r['median_ape'])} |" for r in result["steps"]]
    lines += ["", "## Decode step vs distinct adapters (Llama-3.1-8B, 220 sequences, rank 8, "
              "max_loras 300)", "",
              "Measured: the runs' mean TPOT. Predicted: the profile's price of a decode step "
              "with the expected distinct adapters per step. Runs at 1, 32 and 128 adapters "
              "(the step medians) were in the fit; the others were not.", "",
              "| adapters in use | output tokens | distinct per step | measured ms | "
              "predicted ms | error |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['num_adapters']} | {r['output_len']} | {r['distinct_per_step']} | "
              f"{r['measured_tpot_ms']:.1f} | {r['predicted_tpot_ms']:.1f} | "
              f"{r['error']:+.1%} |" for r in result["curve"]]
    runs = result["runs"]
    lines += ["", f"## Serving runs (ml_modelling/test_dataset: {runs['num_runs']} of "
              f"{runs['num_available']} runs, every {runs['every']}th)", "",
              f"Each run simulated for {runs['window_s']:.0f} s and scored on the requests "
              f"finished after a {min(WARMUP_S, runs['window_s'] / 3):.0f} s warm-up; "
              f"overloaded runs thinned to {RATE_CAP_RPS:.0f} req/s, still above capacity "
              "(`calibrate/gpu_runs.py` says why these lengths). Median |error|; TTFT left "
              "out on runs whose measured throughput is below 95% of the offered rate "
              "(saturated: their queue grows for the whole hour, so their TTFT depends on "
              "how long it has grown). Goals: throughput 5%, TPOT 10%, TTFT 20%.", "",
              "| slice | runs | throughput | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['slice']} | {r['num_runs']} | " + " | ".join(
        _pct(r[m]) for m in METRICS) + " |" for r in runs["summary"]]
    lines += ["", *_run_fit_lines(run_fit, runs)]
    lines += ["", result["notes"]]
    if "splitwise" in result:
        from calibrate.gpu_splitwise import render_section

        lines += render_section(result["splitwise"])
    return "\n".join(lines + [""])


def _run_fit_lines(run_fit: dict | None, runs: dict) -> list[str]:
    """Which serving runs the profile was fitted on and which are held out."""
    held = (f"Held out: every {runs['every']}th run from the first, less any run the profile "
            "was fitted on")
    if not run_fit:
        return [f"{held}. The profile was fitted on steps only: no serving run was fitted on."]
    unknowns = "; ".join(f"`{n}` {a:.4g} -> {b:.4g}" for n, (a, b) in run_fit["unknowns"].items())
    return [f"Fitted on (run-level fit, `calibrate/gpu_run_fit.py`): {run_fit['num_runs']} "
            f"runs of {run_fit['group']}, {run_fit['rule']}, each simulated for "
            f"{run_fit['window_s']:.0f} s; residuals: {run_fit['targets']}; unknowns (step "
            f"fit -> run fit): {unknowns}. Their ids: JSON `runs.run_fit.run_ids`. {held}: "
            f"{run_fit['num_left_out']} left out for that reason."]


NOTES = """## What the errors say

* Steps: the LoRA mechanism carries across models (Qwen2.5-7B's max_loras x rank probes and
  its distinct-adapter sweep, never fitted, within 2-4%), and the curve follows from it at the
  adapter counts the fit never saw. The miss is Qwen's base decode (about 19% slow at batches
  200-800): the base roofline fitted on Llama leaves out a per-sequence cost that is larger on
  Qwen (its 152k vocabulary's sampling is one candidate, not modelled).
* The base step without LoRA at 220 sequences comes out 12-13% fast, while the fitted Llama
  base decode steps carry 6% MAPE: one weight-and-KV bandwidth efficiency and one fixed step
  cost do not bend with the batch as these steps do; the LoRA terms ride on top of it, so the
  LoRA steps' errors above include it.
* Serving runs: each run is simulated for a window shorter than its hour and scored after a
  warm-up, when the running batch has turned over and its mix is the steady one. Prompt and
  reply lengths are drawn log-normal around each run's logged mean lengths (sigma 1.0 and
  0.9, assumed; the runs log only the means) under vLLM's ShareGPT filter, so the p99s depend
  on that assumption.
* TPOT p50 of light runs scatters around a small slow bias (signed errors in the JSON). Part
  of it is the split-K shrink: vLLM 0.8.5 splits its K 64 ways under 128 tokens, 8 above, so
  a light step's computing shrink programs each do an eighth of the work, yet are priced as
  any other: at their measured composition (`python -m calibrate.gpu_errors --mixed-steps`,
  no replay) the steps of runs under 128 tokens come out 7-9% dear. The cost
  model now has the mechanism (`lora_working_mac_s`), but the step fit cannot separate it from
  the per-program cost (fitted steps 3.51% -> 3.52% MAPE, held-out 6.36% -> 6.39% over
  0-1.4e-13 s), so the shipped profile leaves it at 0. Fitted on the measured steps of 167
  light runs outside this table (`calibrate.gpu_work_fit`: 6.8e-14 s), every 20th run's
  TPOT p50 goes 23.3% -> 16.8% (unsaturated 18.4% -> 8.4%), TPOT p99 46.9% -> 43.9%, but
  throughput 8.9% -> 9.7%, TTFT p50 17.0% -> 18.7%, TTFT p99 23.3% -> 30.3%: worse on three
  of five, so not shipped (`docs/gpu-errors.md`, E).
* Why the serving runs miss, with the evidence: `docs/gpu-errors.md`. In short, the replay now
  copies what the runs' measurement adds outside the engine: vLLM 0.8.5's API server loads a
  tokenizer from an adapter's folder on that adapter's first request, on its event loop, and
  the client's pre-loading was off, so every first request of the hour waits for it (the
  engine idles 0.28-0.32 s before each in the sweep's warm-ups); a 7 ms API path; and an
  overloaded client's backlog (one connection per request: vLLM's counters show 450-900
  running requests with the KV pool full), which the replay now starts from instead of a
  thinned rate from an empty engine. TTFT p99's miss was this load (every 20th run: 77% ->
  32% median |error|, signed -77% -> -1%); saturated TPOT's third-fast miss was the smaller
  simulated batch (37% -> 28%). The step fit alone prices the steps of runs with a queue
  1.2-1.5x too cheap, those without one within 0-5% (`docs/gpu-errors.md`, F): a cost of the
  queue, 54 us per sequence of a step while requests wait, fitted on 615 runs outside this
  table (`calibrate.gpu_queue_fit`), now in the profile: every 20th run's TPOT p50 23.3% ->
  9.8%, p99 46.9% -> 36.1%, the rest equal. ShareGPT's real first turns (`lengths="sharegpt"` in
  `calibrate.gpu_runs`) bring TTFT p50 25% -> 17% and TPOT p99 48% -> 35% on every 20th
  run, but are not the default: with them the run-level fit's synthetic round trip does not
  recover its coefficients (it stays at its start).
* The run-level fit (`calibrate/gpu_run_fit.py`, simulation in the loop) was tried and is not
  shipped: it improves the serving runs but breaks the steps. Fitted on 14 other runs of the
  test set (every 60th from index 2, none of the table's), TPOT p50 of unsaturated runs and
  capacity of saturated ones, 90 s windows: bandwidth efficiency 0.675 -> 0.721, working LoRA
  program 24.9 -> 20.9 ns, idle expand program 1.13 -> 1.74 ns (310 s, 196 runs simulated). Held
  out, with this table's command before the replay's API and backlog terms: throughput 7.3% ->
  6.6%, TPOT p50 25.8% -> 20.9% (unsaturated 19.4% -> 10.8%), TPOT p99 48.1% -> 47.3%, TTFT p99
  76.1% -> 74.4%, but TTFT p50 25.7% -> 28.5%, the held-out steps 6.4% -> 10.2% MAPE and the
  curve at 1 and 32 adapters +0.5% / -1.9% -> +23% / +12%: light decode steps (split-K 64)
  wanted a cheaper working program than the 220-sequence steps measured (the work term)."""


VALIDATED = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
"""Run metrics the profile's validation carries for the planner's intervals. Throughput is
left out: an unsaturated open-loop run's throughput is its offered rate, which any model
matches, and a saturated run's capacity is scored in requests/s, while the planner's
throughput interval is on tokens/s of offline workloads (`planner.predict.intervals`)."""


def profile_validation(result: dict) -> dict:
    """`<profile>.validation.json` (read by `planner.predict.intervals`): one row per held-out
    serving run and metric with the signed error, and per metric the median and quantiles of
    the errors. TTFT of saturated runs is left out, as in the run table."""
    rows = []
    for run in result["runs"]["rows"]:
        workload = (f"{run['model']} max_loras {run['max_loras']} adapters "
                    f"{run['num_adapters']} ranks {run['ranks']} "
                    f"{run['offered_rps']:.3g} req/s open loop")
        for metric in VALIDATED:
            error = run["error"][metric]
            if error is None or (metric.startswith("ttft") and run["is_saturated"]):
                continue
            rows.append(dict(workload=workload, run_id=run["run_id"], metric=metric,
                             measured_median=run["measured"][metric],
                             predicted=run["predicted"][metric], error=error))
    summary = []
    for metric in VALIDATED:
        errors = np.asarray([r["error"] for r in rows if r["metric"] == metric], dtype=float)
        if errors.size:
            q05, q50, q95 = np.quantile(errors, [0.05, 0.5, 0.95])
            summary.append(dict(metric=metric, num_rows=int(errors.size),
                                median_error=float(q50), q05_error=float(q05),
                                q95_error=float(q95),
                                median_abs_error=float(np.median(np.abs(errors)))))
    return dict(profile=result["profile"], command=result["command"],
                source="docs/validation-gpu.json (section runs)",
                window_s=result["runs"]["window_s"],
                left_out="throughput (see VALIDATED in calibrate/gpu_validate.py); TTFT of "
                         "saturated runs (their queue grows for the whole run)",
                summary=summary, rows=rows)


REQUIRED = (RUNS_SUMMARY, "overhead_steps.csv")
"""Files of the agullo-dt slice the validation reads."""


def _splitwise(root: Path | None) -> dict:
    """Section 4: the vidur-fitted A100-80GB and H100-SXM profiles on Splitwise's steps."""
    from calibrate.gpu_splitwise import SPLITWISE_DIR, splitwise_section
    from calibrate.gpu_vidur_fit import PROFILE_NAMES
    from sim.cost.profile import load_profile

    coeffs = {gpu: load_profile(PROFILES_DIR / f"{name}.yaml").coefficients
              for gpu, name in PROFILE_NAMES.items()}
    return splitwise_section(coeffs, PROFILE_NAMES, root or SPLITWISE_DIR)


def _run_fit_section(profile, available: list, every: int) -> dict | None:
    """What the profile was run-fitted on, and how many of the every-th runs that removed."""
    record = profile.fit.run_fit
    if record is None:
        return None
    fitted = set(record.run_ids)
    return dict(group=record.group, rule=record.rule, num_runs=len(record.run_ids),
                run_ids=list(record.run_ids), unknowns={
                    n: [record.start[n], record.fitted[n]] for n in record.fitted},
                targets=record.targets, window_s=record.window_s,
                num_left_out=sum(r.run_id in fitted for r in available[::every]))


def validate(root: Path = DATA_DIR, every: int = 4, window_s: float = WINDOW_S,
             docs_dir: Path = DOCS, profiles_dir: Path = PROFILES_DIR,
             splitwise_root: Path | None = None, workers: int = 1) -> dict:
    """Run the three checks on the slice under `root`; write DOCS/validation-gpu.md and .json
    and PROFILES/<profile>.validation.json. DatasetMissingError (one line) if a file is
    missing."""
    from sim.cost.profile import load_profile

    missing = [name for name in REQUIRED if not (Path(root) / name).exists()]
    if missing:
        raise DatasetMissingError(f"{root}: agullo-dt slice lacks {', '.join(missing)}")
    profile = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml")
    coeffs = profile.coefficients
    available = load_serving_runs(Path(root) / RUNS_SUMMARY)
    runs = held_out_runs(available, every, profile)
    rows = run_rows(coeffs, runs, window_s, workers)
    result = dict(
        profile=PROFILE_NAME,
        command=f"python -m calibrate.gpu_validate --every {every} --window-s {window_s:.0f}",
        steps=step_rows(coeffs, Path(root)), curve=curve_rows(coeffs, Path(root)),
        runs=dict(every=every, window_s=window_s, num_runs=len(rows),
                  num_available=len(available), summary=summarize_runs(rows), rows=rows,
                  run_fit=_run_fit_section(profile, available, every)),
        notes=NOTES, splitwise=_splitwise(splitwise_root))
    Path(docs_dir).mkdir(parents=True, exist_ok=True)
    (Path(docs_dir) / "validation-gpu.json").write_text(json.dumps(result, indent=1) + "\n",
                                                        encoding="utf-8")
    (Path(docs_dir) / "validation-gpu.md").write_text(render_markdown(result), encoding="utf-8")
    Path(profiles_dir).mkdir(parents=True, exist_ok=True)
    (Path(profiles_dir) / f"{PROFILE_NAME}.validation.json").write_text(
        json.dumps(profile_validation(result), indent=1) + "\n", encoding="utf-8")
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    parser.add_argument("--workers", type=int, default=1,
                        help="processes replaying runs side by side (same results)")
    args = parser.parse_args(argv)
    result = validate(every=args.every, window_s=args.window_s, workers=args.workers)
    for r in result["runs"]["summary"][:1]:
        print("runs:", {m: _pct(r[m]) for m in METRICS})


if __name__ == "__main__":
    main()
