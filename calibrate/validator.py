"""Predicted vs measured: replay workloads on the real engine and in the simulator, tabulate errors.

Each `ValidationWorkload` is a list of conversations with exact arrival times. The engine side
replays them open-loop (`calibrate.runner.replay_open_loop`), several times, interleaved with
the other workloads, so the machine's drift spreads over all of them; the simulator runs the same
arrivals, lengths and adapters under the fitted coefficients. `compare` reports, per workload and
metric, the median measurement, the engine's own run-to-run spread, the prediction and the
error. Workloads here are not the fitting probes: those submit uniform batches at t=0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibrate.runner import VOCAB, ReplayConversation, ReplayTurn

METRICS = ("throughput_tokens_per_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s",
           "tpot_p90_s", "tpot_p99_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s")
GOALS = {"throughput": 0.03, "tpot": 0.05, "e2e": 0.05, "ttft": 0.10}
"""Issue 9's goals: median absolute error per metric family."""


@dataclass(frozen=True)
class ValidationWorkload:
    """Conversations to replay, and what they exercise."""

    name: str
    kind: str
    """"base", "lora" or "lora_p"."""
    conversations: tuple[ReplayConversation, ...]
    num_adapters: int = 1


def _tokens(rng, n: int) -> tuple[int, ...]:
    return tuple(rng.integers(3, VOCAB, int(n)).tolist())


def punica_validation_workload(kind: str, popularity: str, num_adapters: int, *,
                               num_requests: int, rate_per_s: float | None, seed: int,
                               num_output_tokens: int = 16) -> ValidationWorkload:
    """Punica's mix (sim.workload.generate.punica_workload) with Poisson arrivals at `rate_per_s`
    (None: every request at t=0, the offline throughput benchmark)."""
    from sim.workload.generate import punica_workload

    rng = np.random.default_rng(seed)
    work = punica_workload(rng, num_requests=num_requests, num_adapters=num_adapters,
                           popularity=popularity, max_prompt_tokens=400,
                           num_output_tokens=num_output_tokens, arrival_rate_per_s=rate_per_s)
    convs = tuple(ReplayConversation(float(a), kind, int(d) if kind != "base" else 0,
                                     (ReplayTurn(_tokens(rng, n), num_output_tokens),))
                  for a, d, n in zip(work.conv_arrival_s, work.turn_domain,
                                     work.turn_user_tokens, strict=True))
    arrivals = "offline" if rate_per_s is None else f"{rate_per_s:g}/s"
    return ValidationWorkload(f"{kind} {popularity} N={num_adapters} {arrivals}", kind, convs,
                              num_adapters)


def trace_validation_workload(kind: str, path, *, num_requests: int, rate_scale: float,
                              length_scale: float, num_adapters: int,
                              seed: int) -> ValidationWorkload:
    """The first rows of a trace (sim.workload.traces), lengths scaled to fit the tiny model's
    context."""
    from sim.workload.traces import trace_workload

    rng = np.random.default_rng(seed)
    work = trace_workload(rng, path, num_domains=num_adapters, fmt="csv",
                          arrival_column="TIMESTAMP", input_column="ContextTokens",
                          output_column="GeneratedTokens", hash_ids_column=None,
                          adapter_column=None, time_unit="datetime", hash_block_tokens=512,
                          rate_scale=rate_scale, length_scale=length_scale,
                          max_requests=num_requests, domain_weights=None)
    prompts = np.clip(work.turn_user_tokens, 1, 400)
    outputs = np.clip(work.turn_reply_tokens, 1, 96)
    convs = tuple(ReplayConversation(float(a), kind, int(d) if kind != "base" else 0,
                                     (ReplayTurn(_tokens(rng, n), int(o)),))
                  for a, d, n, o in zip(work.conv_arrival_s, work.turn_domain, prompts,
                                        outputs, strict=True))
    return ValidationWorkload(f"{kind} azure-conv slice", kind, convs, num_adapters)


def conversation_validation_workload(kind: str, *, num_conversations: int, num_turns: int,
                                     num_adapters: int, rate_per_s: float, think_s: float,
                                     seed: int) -> ValidationWorkload:
    """Multi-turn conversations, one adapter each, prefix-cached history between turns."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate_per_s, num_conversations))
    convs = []
    for i, arrival in enumerate(arrivals):
        turns = tuple(ReplayTurn(_tokens(rng, rng.integers(24, 64)), 16,
                                 0.0 if t == 0 else float(rng.exponential(think_s)))
                      for t in range(num_turns))
        convs.append(ReplayConversation(float(arrival), kind, i % num_adapters, turns))
    return ValidationWorkload(f"{kind} {num_turns}-turn conversations", kind, tuple(convs),
                              num_adapters)


def summarize_turns(records: list[dict]) -> dict[str, float]:
    """Throughput (prompt + output tokens per second) and latency percentiles of turn records
    (TTFT and end-to-end from arrival; TPOT over the tokens after the first)."""
    arrival = np.array([r["arrival_s"] for r in records])
    first = np.array([r["first_token_s"] for r in records])
    finish = np.array([r["finish_s"] for r in records])
    num_out = np.array([r["num_output_tokens"] for r in records])
    tokens = sum(r["num_prompt_tokens"] for r in records) + num_out.sum()
    out = {"throughput_tokens_per_s": float(tokens / (finish.max() - arrival.min()))}
    tpot = (finish - first) / np.maximum(num_out - 1, 1)
    for name, values in (("ttft", first - arrival), ("tpot", tpot), ("e2e", finish - arrival)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = float(np.percentile(values, q))
    return out


def drift_factor(measured_s, predicted_s) -> float:
    """The machine's speed now relative to the profile's: the reference probe's measured step
    seconds over the profile's price of the same steps (2.0: steps take twice the price)."""
    return float(np.sum(measured_s) / np.sum(predicted_s))


def scale_prediction(predicted: dict[str, float], factor: float, *,
                     is_saturated: bool = True) -> dict[str, float]:
    """A summary as if every step took `factor` times the price: latencies multiplied,
    throughput divided where the engine was saturated (offline; open-loop throughput is the
    offered load, kept). Linear on purpose: it ignores that queueing grows faster than the
    step time near saturation (the drift-scaled column is a correction, not a re-simulation)."""
    return {metric: (value / factor if is_saturated else value)
            if metric.startswith("throughput") else value * factor
            for metric, value in predicted.items()}


def compare(workload: str, measured_runs: list[dict], predicted: dict,
            drifts: list[float] | None = None) -> list[dict]:
    """One row per metric: median of the runs, their spread ((max - min) / median), the
    prediction and its signed relative error; with each run's drift factor (`drifts`, in the
    runs' order) also the drift-scaled error: each run against the prediction scaled by its own
    factor (`scale_prediction`), the median over the runs."""
    scaled = [scale_prediction(predicted, f, is_saturated="offline" in workload)
              for f in drifts] if drifts else None
    rows = []
    for metric in METRICS:
        values = np.array([run[metric] for run in measured_runs])
        median = float(np.median(values))
        rows.append(dict(workload=workload, metric=metric, measured_median=median,
                         run_spread=float((values.max() - values.min()) / median),
                         num_runs=len(values), predicted=predicted[metric],
                         error=(predicted[metric] - median) / median,
                         drift_factor=float(np.median(drifts)) if drifts else None,
                         error_drift_scaled=float(np.median(
                             [s[metric] / x - 1 for s, x in zip(scaled, values, strict=True)]))
                         if scaled else None))
    return rows


def goal_summary(rows: list[dict], error_key: str = "error") -> list[dict]:
    """Median absolute error (of `error_key`: "error", or "error_drift_scaled") per metric
    family against issue 9's goals. Throughput counts only offline workloads: below saturation
    an open-loop engine's throughput is the offered load, which any model matches."""
    out = []
    for family, goal in GOALS.items():
        mine = [r for r in rows if r["metric"].startswith(family)
                and (family != "throughput" or "offline" in r["workload"])
                and r.get(error_key) is not None]
        errors = [abs(r[error_key]) for r in mine]
        spreads = [r["run_spread"] for r in mine]
        if errors:
            median = float(np.median(errors))
            out.append(dict(family=family, median_abs_error=median, goal=goal,
                            median_run_spread=float(np.median(spreads)),
                            meets_goal=median <= goal))
    return out


def sim_workload(w: ValidationWorkload):
    """The workload as simulator arrays (prompt = history + user tokens, as the replay sends)."""
    from sim.workload.generate import Workload

    convs = sorted(w.conversations, key=lambda c: c.arrival_s)
    turns = [t for c in convs for t in c.turns]
    counts = np.array([len(c.turns) for c in convs])
    return Workload(
        conv_arrival_s=np.array([c.arrival_s for c in convs]),
        conv_first_turn=np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64),
        conv_num_turns=counts, conv_initial_tokens=np.zeros(len(convs), np.int64),
        turn_domain=np.array([c.adapter for c in convs for _ in c.turns], np.int64),
        turn_user_tokens=np.array([len(t.user_token_ids) for t in turns], np.int64),
        turn_reply_tokens=np.array([t.num_output_tokens for t in turns], np.int64),
        turn_think_s=np.array([t.think_s for t in turns]))


def sim_config(w: ValidationWorkload, coeffs, spec, num_kv_blocks: int, *, num_layers: int = 4,
               targets=("q_proj", "v_proj", "o_proj", "down_proj")):
    """SimConfig of the tiny model on the `cpu` entry under the engine's own limits."""
    from sim.config import AdapterSpec, EngineLimits, SimConfig, StrategySpec
    from sim.hardware.catalogue import get_gpu, get_model
    from sim.strategies.registry import get_strategy, kv_layout

    arch = get_model("vllm-tiny-llama")
    placements = tuple((i, m) for i in range(num_layers) for m in targets)
    per_rank = sum(sum(_shape(arch, m)) for _, m in placements)
    adapters = tuple(AdapterSpec(name=f"a{i}", num_bytes_per_gpu=spec.max_lora_rank * per_rank * 4)
                     for i in range(max(w.num_adapters, 1)))
    kind = {"base": "base", "lora": "multi_lora", "lora_p": "preft"}[w.kind]
    uses_adapters = get_strategy(kind).uses_adapters
    every = [list(placements)] * len(adapters) if uses_adapters else []
    strategy = (StrategySpec(kind=kind, kv_layout=kv_layout(arch, kind, every))
                if not uses_adapters else StrategySpec(
        kind=kind, adapters=adapters, adapter_kind="lora", adapter_rank=spec.max_lora_rank,
        adapter_placements=placements, is_decode_adapted=w.kind == "lora",
        kv_layout=kv_layout(arch, kind, every)))
    engine = EngineLimits(
        max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
        block_size=spec.block_size, enable_prefix_caching=spec.enable_prefix_caching,
        max_loras=spec.max_loras, max_cpu_loras=spec.max_cpu_loras,
        max_lora_rank=spec.max_lora_rank, num_kv_blocks=num_kv_blocks)
    return SimConfig(arch=arch, gpu=get_gpu("cpu"), engine=engine, strategy=strategy,
                     coeffs=coeffs)


def _shape(arch, module):
    from sim.cost.model_shapes import module_shape

    return module_shape(arch, module, 0)


def predict(w: ValidationWorkload, coeffs, spec, num_kv_blocks: int) -> dict[str, float]:
    """The simulator's summary of `w`, in `summarize_turns`' terms."""
    from sim.simulate import simulate

    result = simulate(sim_config(w, coeffs, spec, num_kv_blocks), sim_workload(w))
    turns = result.turns
    records = [dict(arrival_s=a, first_token_s=f, finish_s=d, num_output_tokens=n,
                    num_prompt_tokens=c + u)
               for a, f, d, n, c, u in zip(turns["arrival_s"], turns["first_token_s"],
                                           turns["finish_s"], turns["num_output_tokens"],
                                           turns["num_context_tokens"], turns["num_user_tokens"],
                                           strict=True)]
    return summarize_turns(records)


def _cell(row: dict, error_key: str = "error") -> str:
    if row.get(error_key) is None:
        return "-"
    return f"{row[error_key]:+.1%} <sub>±{row['run_spread'] / 2:.0%}</sub>"


SHOWN = ("throughput_tokens_per_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s",
         "tpot_p99_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s")


def _workload_lines(rows: list[dict], error_key: str) -> list[str]:
    """Per workload: measured and predicted tokens/s, the drift factor, each shown metric's
    signed `error_key` with half the run-to-run spread beside it."""
    lines = ["| workload | measured tok/s | predicted tok/s | drift | " + " | ".join(
                 s.replace("_tokens_per_s", "").replace("_s", "") for s in SHOWN) + " |",
             "|---" * (len(SHOWN) + 4) + "|"]
    by_workload: dict[str, dict] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], {})[row["metric"]] = row
    for name, metrics in by_workload.items():
        t = metrics["throughput_tokens_per_s"]
        drift = f"{t['drift_factor']:.2f}" if t.get("drift_factor") else "-"
        lines.append(f"| {name} | {t['measured_median']:.0f} | {t['predicted']:.0f} | {drift} | "
                     + " | ".join(_cell(metrics[s], error_key) for s in SHOWN) + " |")
    return lines


def _goal_lines(report: dict) -> list[str]:
    """Median absolute error per family, raw and after drift scaling, against the goals."""
    scaled = {g["family"]: g for g in report.get("goals_drift_scaled", [])}
    lines = ["| metric | median abs error | after drift scaling | goal | median run-to-run "
             "spread | meets goal (raw / scaled) |", "|---|---|---|---|---|---|"]
    for g in report["goals"]:
        s = scaled.get(g["family"])
        scaled_error = f"{s['median_abs_error']:.1%}" if s else "-"
        scaled_meets = ("yes" if s["meets_goal"] else "no") if s else "-"
        lines.append(f"| {g['family']} | {g['median_abs_error']:.1%} | {scaled_error} | "
                     f"{g['goal']:.0%} | {g['median_run_spread']:.1%} | "
                     f"{'yes' if g['meets_goal'] else 'no'} / {scaled_meets} |")
    return lines


def _machine_lines(report: dict) -> list[str]:
    """Where the profile was measured, when that is not this machine, and the engine limits."""
    lines = []
    here, there = report["machine"].get("cpu"), report.get("profile_machine", {}).get("cpu")
    if there and there != here:
        lines += [f"The profile was measured on another processor ({there}); this table's "
                  f"engine runs on {here}.", ""]
    if report.get("validation_engine"):
        e = report["validation_engine"]
        lines += [f"Validation engine: max_num_seqs={e['max_num_seqs']}, max_num_batched_tokens="
                  f"{e['max_num_batched_tokens']}, max_loras={e['max_loras']}, max_lora_rank="
                  f"{e['max_lora_rank']}.", ""]
    return lines


def _step_check_lines(checks: dict) -> list[str]:
    """The replays' own steps priced one by one (calibrate.step_check), per workload."""
    if not checks:
        return []
    lines = ["", "## The replays' own engine steps, priced one by one", "",
             "Every step the engine ran in the runs above (step timer on), priced by the cost "
             "model under the profile: median step, median error of a step, error of their "
             "total; host share: the steps' time outside the model runner (scheduling, output "
             "handling, requests added between steps).", "",
             "| workload | decode steps | ms p50 | error p50 | total error | prefill+mixed steps"
             " | ms p50 | error p50 | total error | host share |", "|---" * 10 + "|"]
    for name, check in checks.items():
        by_kind = {r["kind"]: r for r in check["rows"]}
        cells = []
        for kind in ("decode", "prefill+mixed"):
            r = by_kind.get(kind)
            cells += ([str(r["num_steps"]), f"{r['measured_median_s'] * 1e3:.2f}",
                       f"{r['median_error']:+.1%}", f"{r['total_error']:+.1%}"]
                      if r else ["0", "-", "-", "-"])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {check['host_share']:.1%} |")
    return lines


def markdown_table(report: dict) -> str:
    """The validation report as markdown: goals, then per workload the signed error of each
    metric with half the engine's run-to-run spread ((max - min) / median / 2) beside it."""
    m = report["machine"]
    lines = [
        "# Validation: simulator vs real engine", "",
        f"Profile `{report['profile']}`, {report['created_utc']}, clock: {report['clock']} "
        f"({'engine thread CPU seconds, idle gaps skipped' if report['clock'] == 'cpu' else 'wall'}"
        f"), {report['num_repeats']} interleaved runs per workload, {report['num_requests']} "
        f"requests each.", "",
        f"Machine: {m['cpu']}, {m['num_cpus']} CPUs, shared with other jobs; 1-minute load "
        f"average when each engine run finished: min/median/max "
        f"{'/'.join(f'{x:.1f}' for x in report['load_average_1min_during_runs'])}; "
        f"(1/5/15 min) when this table was written "
        f"{'/'.join(f'{x:.1f}' for x in report['load_average_end'])}.", "",
        *_machine_lines(report),
        f"Command: `{report['command']}`", "",
        "## Median absolute error per metric family", "",
        "Throughput: offline workloads only (open-loop throughput is the offered load). Latency: "
        "every percentile of every workload. After drift scaling: each run against the "
        "prediction with its time scaled by that run's drift factor (below; the median over "
        "the runs), a factor measured by a fitting probe, never by the workload itself.", "",
        *_goal_lines(report), "",
        "Drift factor: before each run, on the same engine, the reference probe (one of the "
        "profile's own staggered probes: prompts arriving every two steps while earlier ones "
        "decode) is run from an empty prefix cache and its steps priced by the profile; "
        "measured / priced seconds is how much slower than the profile prices it the machine "
        "ran then (it also carries the profile's own error on that probe). The drift column: "
        "the median of a workload's factors.", "",
        "## Per workload: predicted vs measured (signed error, ± half the spread)", "",
        *_workload_lines(report["rows"], "error")]
    if report.get("goals_drift_scaled"):
        lines += ["", "## Per workload after drift scaling (each run against the "
                  "prediction's time x its factor; median)",
                  "", *_workload_lines(report["rows"], "error_drift_scaled")]
    lines += _step_check_lines(report.get("step_checks", {}))
    if report.get("ced_switch"):
        lines += ["", "## CED engine: switch cost by context (bounded replay vs re-prefill)", "",
                  f"Torch CED engine (`ced-small`), profile `{report['ced_switch'][0]['profile']}`"
                  ", one conversation, engine thread CPU seconds.", "",
                  "| way | context | measured ms | spread | predicted ms | error |",
                  "|---|---|---|---|---|---|"]
        for r in report["ced_switch"]:
            lines.append(f"| {r['way']} | {r['context']} | {r['measured_median_s'] * 1e3:.1f} | "
                         f"{r['run_spread']:.0%} | {r['predicted_s'] * 1e3:.1f} | "
                         f"{r['error']:+.1%} |")
    return "\n".join(lines) + "\n"
