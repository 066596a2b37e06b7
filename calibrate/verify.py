"""`molcap verify`: check a capacity plan on a real engine before buying it.

For each strategy, the planned deployment's engine (vLLM with exactly the plan's engine
arguments, `calibrate.verify_engine`) serves the scenario's workload as one replica of the
deployment receives it: N requests, open loop at their arrival times (`calibrate.replay`). The
same requests go through the simulator on the KV pool the engine resolved; measured and
predicted latencies and throughput are compared per metric and percentile, and every SLO of the
scenario is checked on the measurements (`calibrate.verify_report` formats the result).

Each strategy's run is a point in the planner's points store (OUT/points): Ctrl-C stops the
engine, keeps the requests that finished (OUT/partial/<key>.json) and a rerun resumes at the
first strategy not finished. No torch or vLLM import at module level.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from calibrate.verify_engine import (
    SUPPORTED_KINDS,
    TINY_MODEL,
    HostSettings,
    VerifyEngineArgs,
    check_engine_installed,
)
from calibrate.verify_plan import (
    PlannedDeployment,
    planned_deployments,
    predict_replay,
    replay_conversations,
    replica_scenario,
    summarize,
)
from planner.scenario import Scenario

METRICS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
           "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "output_tokens_per_s",
           "throughput_tokens_per_s")
"""Compared metrics: latency percentiles and tokens per second (output; prompt + output)."""


@dataclass(frozen=True)
class VerifyOptions:
    """How to run the check (the CLI's options)."""

    engine: str = "vllm"
    device: str | None = None
    """cpu or cuda; None: cpu when the scenario's GPU kind is `cpu`, else cuda."""
    num_requests: int = 32
    """Requests (turns) replayed per strategy."""
    clock: str = "wall"
    """wall (what a client sees) or cpu (the engine thread's CPU time: a shared machine)."""
    model_path: Path | None = None
    """The model's Hugging Face folder; None builds the tiny Llama (vllm-tiny-llama only)."""
    adapters_dir: Path | None = None
    """Folder with one PEFT folder per adapter name; None: random adapters of the scenario's
    ranks, modules and layers."""
    strategies: tuple[str, ...] = ()
    """Strategy labels to verify; empty: every strategy verify supports."""


@dataclass
class VerifyResult:
    """Per strategy: the comparison rows, SLO checks and how the engine ran."""

    scenario: str
    strategies: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """One line per strategy not verified, and why."""

    @property
    def missed_slos(self) -> list[str]:
        """'strategy: metric measured > limit' for each SLO a promised plan missed."""
        return [f"{s['strategy']}: {c['metric']} measured {c['measured']:.4g} s > "
                f"{c['limit']:.4g} s" for s in self.strategies if s["is_promised"]
                for c in s["slo_checks"] if not c["passed"]]


def slo_checks(slo, records: list[dict], measured: dict) -> list[dict]:
    """Each SLO of the scenario on the measurements: the measured percentile against the limit,
    and the attainment (share of requests within the limit) next to the share it needs."""
    first = np.array([r["first_token_s"] - r["arrival_s"] for r in records])
    e2e = np.array([r["finish_s"] - r["arrival_s"] for r in records])
    num_out = np.array([r["num_output_tokens"] for r in records])
    tpot = (e2e - first) / np.maximum(num_out - 1, 1)
    per_request = {"ttft": first, "tpot": tpot, "e2e": e2e}
    out = []
    for metric, limit in slo.model_dump().items():
        if limit is None:
            continue
        family, quantile = metric.split("_")[0], int(metric.split("_p")[1].split("_")[0])
        value = measured.get(metric, math.nan)
        out.append(dict(metric=metric, limit=limit, measured=value,
                        attainment=float(np.mean(per_request[family] <= limit)),
                        needed=quantile / 100, passed=bool(value <= limit)))
    return out


def compare_rows(predicted: dict, measured: dict, plan: dict, slo) -> list[dict]:
    """One row per metric: the plan's value (whole deployment), the prediction of this replay,
    the measurement, the signed error of the prediction, the SLO limit and whether it holds."""
    limits = {k: v for k, v in slo.model_dump().items() if v is not None}
    rows = []
    for metric in METRICS:
        p, m = predicted.get(metric, math.nan), measured.get(metric, math.nan)
        limit = limits.get(metric)
        rows.append(dict(metric=metric, plan=plan.get(metric), predicted=p, measured=m,
                         error=(p - m) / m if m else math.nan, slo=limit,
                         passed=None if limit is None else bool(m <= limit)))
    return rows


def engine_args(scenario: Scenario, index: int, model_path: Path, device: str,
                num_adapters: int) -> VerifyEngineArgs:
    """The vLLM arguments of one replica of the (replica-)scenario: the plan's limits."""
    e, hw = scenario.engine, scenario.hardware
    arch = scenario.strategy_arch(index)
    is_tiny = arch.name == TINY_MODEL
    uses_lora = scenario.strategies[index].kind != "base"
    return VerifyEngineArgs(
        model_path=str(model_path), enable_lora=uses_lora, max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens, max_loras=e.max_loras,
        max_cpu_loras=max(e.max_cpu_loras, num_adapters), max_lora_rank=e.max_lora_rank,
        block_size=e.block_size, tensor_parallel_size=hw.tensor_parallel_size,
        enable_prefix_caching=e.enable_prefix_caching,
        enable_chunked_prefill=e.enable_chunked_prefill,
        gpu_memory_utilization=e.gpu_memory_utilization,
        kv_cache_memory_bytes=None if e.kv_cache_memory_bytes is None
        else int(e.kv_cache_memory_bytes),
        max_model_len=arch.max_context_tokens if is_tiny else None,
        dtype="float32" if is_tiny else "auto", enforce_eager=device == "cpu", seed=scenario.seed)


def host_settings(scenario: Scenario, device: str) -> HostSettings:
    """What the pricing profile recorded about the process it was measured in, applied the same
    way: torch threads and the kept-freed-memory allocator on CPU (a plan priced by assumed
    coefficients gets vLLM's defaults)."""
    from planner.profiles import resolve_pricing

    profile = resolve_pricing(scenario).profile
    settings = profile.engine.settings if profile is not None else {}
    if device != "cpu":
        return HostSettings()
    threads = settings.get("num_threads")
    return HostSettings(num_threads=int(threads) if threads else None,
                        keep_freed_memory="freed memory kept" in str(
                            settings.get("host_allocator", "")))


def measure_strategy(scenario: Scenario, planned: PlannedDeployment, options: VerifyOptions,
                     device: str, work: Path, partial: list[dict]) -> dict:
    """Start the engine, replay the replica's workload, stop the engine; the stored record."""
    from calibrate.replay import replay_open_loop
    from calibrate.verify_engine import VerifySession, build_adapters, build_tiny_model
    from planner.simulation import create_workload

    index = planned.index
    point = replica_scenario(scenario, planned, options.num_requests)
    strategy = point.strategies[index]
    model = options.model_path or build_tiny_model(work)
    adapters = build_adapters(strategy, Path(model), work / "adapters", options.adapters_dir)
    num_domains = max(1, len(getattr(strategy, "adapters", ())))
    workload = create_workload(point, num_domains, np.random.default_rng(point.seed))
    vocab = point.strategy_arch(index).vocab_size
    conversations = replay_conversations(workload, adapters.kind, point.seed, vocab)
    args = engine_args(point, index, Path(model), device, len(adapters.paths))
    host = host_settings(point, device)
    session = VerifySession(args, adapters, host)
    try:
        session.warm_up()
        with session.timed_steps() as timings:
            records = replay_open_loop(session, conversations, clock=options.clock,
                                       records=partial)
        blocks = session.num_kv_blocks
    finally:
        session.close()
    steps = session.step_samples(timings, f"verify:{planned.strategy}", device)
    measured = summarize(records)
    predicted = predict_replay(point, index, workload, blocks)
    return dict(strategy=planned.strategy, index=index, source=planned.source,
                deployment=asdict(planned.deployment), is_feasible=planned.is_feasible,
                engine_args=asdict(args), host=dict(asdict(host),
                                                    allocator=session.host_allocator),
                num_kv_blocks=blocks, clock=options.clock, device=device,
                num_requests=len(records), measured=measured, predicted=predicted,
                records=records, scenario=point.model_dump(mode="json"),
                steps=[x.to_json() for x in steps])


def resolve_device(scenario: Scenario, device: str | None) -> str:
    """--device, or cpu for a plan on the `cpu` GPU kind and cuda otherwise."""
    return device or ("cpu" if scenario.hardware.gpu_spec.name == "cpu" else "cuda")


def _selected(scenario: Scenario, plans: list[PlannedDeployment], options: VerifyOptions,
              model_path) -> tuple[list[PlannedDeployment], list[str]]:
    labels = [s.label for s in scenario.strategies]
    unknown = [s for s in options.strategies if s not in labels]
    if unknown:
        raise ValueError(f"--strategy: {unknown} not in the scenario; allowed: {labels}")
    chosen, skipped = [], []
    for p in plans:
        strategy = scenario.strategies[p.index]
        if options.strategies and p.strategy not in options.strategies:
            continue
        if strategy.kind not in SUPPORTED_KINDS:
            skipped.append(f"{p.strategy}: kind {strategy.kind!r} is not verified on vLLM "
                           f"(verify serves {', '.join(SUPPORTED_KINDS)})")
        elif model_path is None and scenario.strategy_arch(p.index).name != TINY_MODEL:
            raise ValueError(f"--model-path: strategy {p.strategy!r} serves "
                             f"{scenario.strategy_arch(p.index).name!r}; give its Hugging Face "
                             f"folder (molcap builds only {TINY_MODEL} itself)")
        else:
            chosen.append(p)
    return chosen, skipped


def run_verify(scenario_path: Path, plan_path: Path | None, out: Path, options: VerifyOptions,
               on_progress=None) -> VerifyResult:
    """Verify every selected strategy (resuming finished ones from OUT/points); write
    OUT/verify.json and OUT/verify.html; the result (exit status: `missed_slos`)."""
    from planner.loading import load_scenario
    from planner.points import PointStore, PointTask, content_digest, run_points
    from planner.report import file_name, write_atomic

    scenario = load_scenario(scenario_path)
    device = resolve_device(scenario, options.device)
    check_engine_installed(options.engine, device)
    plans = planned_deployments(scenario, Path(scenario_path), plan_path)
    chosen, skipped = _selected(scenario, plans, options, options.model_path)
    out = Path(out)
    # The SLOs are checked on the stored measurement, not part of it: changing one re-checks
    # without starting the engine again.
    measured_part = {k: v for k, v in scenario.model_dump(mode="json").items()
                     if k not in ("slo", "description")}
    tasks = [PointTask(f"verify-{p.index:02d}-{file_name(p.strategy)}-" + content_digest(
        measured_part, asdict(p.deployment), options.num_requests, options.engine, device,
        options.clock, str(options.model_path), str(options.adapters_dir)), dict(index=i))
        for i, p in enumerate(chosen)]
    store = PointStore(out / "points")

    def measure(payload: dict) -> dict:
        planned = chosen[payload["index"]]
        key = tasks[payload["index"]].key
        if on_progress:
            on_progress(planned.strategy)
        partial: list[dict] = []
        try:
            return measure_strategy(scenario, planned, options, device, out / "work", partial)
        except BaseException:
            if partial:
                write_atomic(out / "partial" / f"{key}.json",
                             json.dumps(partial).encode("utf-8"))
            raise

    records = run_points(tasks, measure, store, backend="inline")
    result = VerifyResult(scenario.name, skipped=skipped)
    for task, planned in zip(tasks, chosen, strict=True):
        record = records[task.key]
        if record["status"] != "ok":
            result.skipped.append(f"{planned.strategy}: failed: {record['error']}")
            continue
        result.strategies.append(strategy_summary(record["result"], planned, scenario.slo))
    write_outputs(result, scenario, out)
    return result


def strategy_summary(record: dict, planned: PlannedDeployment, slo) -> dict:
    """The stored measurement as the report's per-strategy entry (records dropped)."""
    rows = compare_rows(record["predicted"], record["measured"], planned.plan_metrics, slo)
    checks = slo_checks(slo, record["records"], record["measured"])
    keep = {k: v for k, v in record.items() if k not in ("records", "steps", "scenario")}
    return dict(keep, rows=rows, slo_checks=checks, is_promised=planned.is_feasible)


def write_outputs(result: VerifyResult, scenario: Scenario, out: Path) -> None:
    """OUT/verify.json (everything but the per-request records) and OUT/verify.html."""
    from calibrate.verify_report import verify_html
    from planner.report import write_atomic

    data = dict(scenario=result.scenario, strategies=result.strategies, skipped=result.skipped,
                missed_slos=result.missed_slos)
    write_atomic(out / "verify.json", json.dumps(data, indent=2, default=str).encode("utf-8"))
    write_atomic(out / "verify.html", verify_html(result, scenario).encode("utf-8"))
