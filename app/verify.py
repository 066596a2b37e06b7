"""`molcap verify`: check a capacity plan on a real engine before buying it.

Composes the two halves that never import each other: the planner resolves each strategy's
planned deployment into one replica's scenario, vLLM arguments and workload
(`planner.verify.prepare`), the engine side starts vLLM and replays that workload open loop
(`calibrate.verify_engine`), and the planner predicts the same requests on the KV pool the
engine resolved and checks every SLO on the measurements (`planner.verify.checks`).

Each strategy's run is a point in the points store (OUT/points): Ctrl-C stops the engine, keeps
the requests that finished (OUT/partial/<key>.json) and a rerun resumes at the first strategy
not finished. The SLOs are checked on the stored measurement, not part of it: changing one
re-checks without starting the engine again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from planner.verify.checks import VerifyResult, default_clock, strategy_entry, summarize
from planner.verify.prepare import (
    TINY_MODEL,
    PlannedDeployment,
    adapter_specs,
    engine_kwargs,
    host_settings,
    layer_costs_json,
    planned_deployments,
    predict_replay,
    refusal,
    replica_scenario,
    router_spec,
)


class NothingToVerify(ValueError):
    """Every strategy asked for is one the engine cannot run (the message says what is
    missing for each): bad input, exit 2."""


@dataclass(frozen=True)
class VerifyOptions:
    """How to run the check (the CLI's options)."""

    engine: str = "vllm"
    device: str | None = None
    """cpu or cuda; None: cpu when the scenario's GPU kind is `cpu`, else cuda."""
    num_requests: int = 32
    """Requests (turns) replayed per strategy."""
    clock: str | None = None
    """wall (what a client sees) or cpu (the engine thread's CPU time: a shared machine); None:
    the clock of the pricing profile's validation, the one its interval holds on
    (`planner.verify.checks.default_clock`)."""
    model_path: Path | None = None
    """The model's Hugging Face folder; None builds the tiny Llama (vllm-tiny-llama only)."""
    adapters_dir: Path | None = None
    """One PEFT folder per adapter name; None: random adapters of the scenario's ranks,
    modules and layers."""
    strategies: tuple[str, ...] = ()
    """Strategy labels to verify; empty: every strategy verify supports."""


def resolve_device(scenario, device: str | None) -> str:
    """--device, or cpu for a plan on the `cpu` GPU kind and cuda otherwise."""
    return device or ("cpu" if scenario.hardware.gpu_spec.name == "cpu" else "cuda")


def resolve_clock(options: VerifyOptions, errors, device: str) -> VerifyOptions:
    """The options with the clock settled: --clock, else the pricing profile's (see
    `default_clock`). A GPU's kernels are not the host thread's CPU time: the CPU clock is
    refused on cuda."""
    clock = options.clock or default_clock(errors, device)
    if clock == "cpu" and device != "cpu":
        raise ValueError(f"--clock cpu: the engine thread's CPU seconds miss the kernels of "
                         f"--device {device}; use --clock wall there")
    return replace(options, clock=clock)


def selected(scenario, plans: list[PlannedDeployment],
             options: VerifyOptions) -> tuple[list[PlannedDeployment], list[str]]:
    """The strategies to verify, and a line for each one skipped (what the engine lacks for
    it). NothingToVerify when none is left."""
    labels = [s.label for s in scenario.strategies]
    unknown = [s for s in options.strategies if s not in labels]
    if unknown:
        raise ValueError(f"--strategy: {unknown} not in the scenario; allowed: {labels}")
    chosen, skipped = [], []
    for p in plans:
        arch = scenario.strategy_arch(p.index).name
        if options.strategies and p.strategy not in options.strategies:
            continue
        why = refusal(scenario, p.index)
        if why is not None:
            skipped.append(why)
        elif options.model_path is None and arch != TINY_MODEL:
            raise ValueError(f"--model-path: strategy {p.strategy!r} serves {arch!r}; give its "
                             f"Hugging Face folder (molcap builds only {TINY_MODEL} itself)")
        else:
            chosen.append(p)
    if not chosen:
        raise NothingToVerify("nothing to verify: " + "; ".join(skipped))
    return chosen, skipped


def measure_strategy(scenario, planned: PlannedDeployment, options: VerifyOptions,
                     device: str, work: Path, on_record) -> dict:
    """One strategy on its engine: the stored record (requests, steps, measured and predicted
    summaries, what ran)."""
    from calibrate.verify_engine import (
        build_adapters,
        build_tiny_model,
        measure,
        replay_conversations,
    )
    from calibrate.verify_routing import build_router
    from planner.predict.simulation import create_workload
    from sim.io.files import file_name

    index = planned.index
    point = replica_scenario(scenario, planned, options.num_requests)
    kind, specs = adapter_specs(point, index)
    model = Path(options.model_path or build_tiny_model(work))
    adapters = build_adapters(kind, specs, model, work / "adapters", options.adapters_dir)
    workload = create_workload(point, max(1, len(specs)), np.random.default_rng(point.seed))
    conversations = replay_conversations(workload, kind, point.seed,
                                         point.strategy_arch(index).vocab_size)
    kwargs = engine_kwargs(point, index, str(model), device)
    host = host_settings(point, device)
    spec = router_spec(point, index)
    router = None if spec is None else build_router(
        [s["name"] for s in specs], adapters, spec["route_layer"], model,
        work / "router" / file_name(planned.strategy), spec["seed"])
    ran = measure(kwargs, kind, adapters, host, conversations, clock=options.clock,
                  device=device, group=f"verify:{planned.strategy}", on_record=on_record,
                  router=router)
    routing = {} if spec is None else dict(routing=dict(ran["routing"], planned=spec))
    return dict(**routing, strategy=planned.strategy, index=index, source=planned.source,
                deployment=asdict(planned.deployment), is_feasible=planned.is_feasible,
                engine_kwargs=kwargs, host=dict(host, allocator=ran["allocator"]),
                num_kv_blocks=ran["num_kv_blocks"], clock=options.clock, device=device,
                num_requests=len(ran["records"]), measured=summarize(ran["records"]),
                predicted=predict_replay(point, index, workload, ran["num_kv_blocks"]),
                records=ran["records"], steps=ran["steps"], runner_s=ran["runner_s"],
                runner_wall_s=ran["runner_wall_s"],
                scenario=point.model_dump(mode="json"),
                layer_costs=layer_costs_json(point, index))


def run_verify(scenario_path: Path, plan_path: Path | None, out: Path, options: VerifyOptions,
               on_progress=None) -> VerifyResult:
    """Verify every selected strategy (resuming finished ones from OUT/points); write
    OUT/verify.json and OUT/verify.html; the result (exit status: `missed_slos`).
    `on_progress(strategy, finished requests, requests)`: 0 when its engine starts."""
    from calibrate.verify_engine import check_engine_installed
    from planner.predict.intervals import pricing_errors
    from planner.scenario.loading import load_scenario
    from sim.io.files import file_name, write_atomic
    from sim.io.points import PointStore, PointTask, content_digest, run_points

    scenario = load_scenario(scenario_path)
    device = resolve_device(scenario, options.device)
    check_engine_installed(options.engine, device)
    plans = planned_deployments(scenario, Path(scenario_path), plan_path)
    chosen, skipped = selected(scenario, plans, options)
    errors = {p.index: pricing_errors(scenario, p.deployment.gpu) for p in chosen}
    options = resolve_clock(options, errors[chosen[0].index], device)
    out = Path(out)
    measured_part = {k: v for k, v in scenario.model_dump(mode="json").items()
                     if k not in ("slo", "description")}
    tasks = [PointTask(f"verify-{p.index:02d}-{file_name(p.strategy)}-" + content_digest(
        measured_part, asdict(p.deployment), options.num_requests, options.engine, device,
        options.clock, str(options.model_path), str(options.adapters_dir)), dict(index=i))
        for i, p in enumerate(chosen)]

    def run(payload: dict) -> dict:
        planned, key = chosen[payload["index"]], tasks[payload["index"]].key
        partial: list[dict] = []

        def on_record(record: dict) -> None:
            partial.append(record)
            if on_progress:
                on_progress(planned.strategy, len(partial), options.num_requests)

        if on_progress:
            on_progress(planned.strategy, 0, options.num_requests)
        try:
            return measure_strategy(scenario, planned, options, device, out / "work",
                                    on_record)
        except BaseException:
            if partial:  # Ctrl-C or a failure: what finished is kept
                write_atomic(out / "partial" / f"{key}.json", json.dumps(partial).encode())
            raise

    records = run_points(tasks, run, PointStore(out / "points"), backend="inline")
    result = VerifyResult(scenario.name, skipped=skipped)
    for task, planned in zip(tasks, chosen, strict=True):
        record = records[task.key]
        if record["status"] != "ok":
            result.failed.append(f"{planned.strategy}: {record['error']}")
            continue
        entry = strategy_entry(record["result"], planned.plan_metrics, planned.is_feasible,
                               scenario.slo, errors[planned.index])
        entry["step_check"] = price_steps(record["result"], scenario, planned.deployment.gpu)
        result.strategies.append(entry)
    write_outputs(result, scenario, out)
    return result


def price_steps(record: dict, scenario, gpu_name: str) -> dict:
    """The engine steps a run timed, priced one by one on the coefficients that priced its
    prediction (`calibrate.step_check.check_steps`): per kind of step the median error, the
    host share of the engine loop, and the runner's wall seconds over its seconds on the
    samples' clock (above 1: the engine thread waited while others held the cores). A latency
    miss with steps priced right is the scheduling; mispriced steps are the cost profile. {} for
    a run stored without its runner times."""
    from calibrate.step_check import check_steps
    from calibrate.verify_samples import layer_costs_from_json
    from planner.scenario.resolved import as_resolved

    if not record.get("runner_s") or not record.get("steps"):
        return {}
    profiles = {record["steps"][0]["group"]: layer_costs_from_json(record["layer_costs"])}
    checked = check_steps([dict(samples=record["steps"], runner_s=record["runner_s"])],
                          as_resolved(scenario).coeffs(gpu_name), profiles)
    return dict(checked, runner_wall_over_clock=sum(record["runner_wall_s"])
                / max(sum(record["runner_s"]), 1e-12))


def write_outputs(result: VerifyResult, scenario, out: Path) -> None:
    """OUT/verify.json (everything but the per-request records and steps) and verify.html."""
    from planner.outputs.verify_report import verify_html
    from sim.io.files import write_atomic

    data = dict(scenario=result.scenario, strategies=result.strategies, skipped=result.skipped,
                failed=result.failed, missed_slos=result.missed_slos)
    write_atomic(out / "verify.json", json.dumps(data, indent=2, default=str).encode("utf-8"))
    write_atomic(out / "verify.html", verify_html(result, scenario).encode("utf-8"))
