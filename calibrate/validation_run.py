"""The validation job: every workload on its engine, repeated and interleaved, then the simulator
under the profile, then the table (docs/validation.md and .json when run for the docs).

Each (workload, repeat) run is a point in the planner's points store (OUT/runs), written the
moment it finishes, so Ctrl-C keeps what was measured and a rerun resumes. Repeats are
interleaved: run r of every workload of an engine before run r + 1 of any, so the machine's
drift over minutes spreads over all workloads instead of biasing one.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from calibrate import validator as v
from calibrate.recorder import load_average, machine_fingerprint
from calibrate.runner import VllmEngineSpec, VllmSession, replay_open_loop
from calibrate.step_check import check_steps, replay_steps

KINDS = ("base", "lora", "lora_p")


def validation_workloads(num_requests: int, *, quick: bool = False) -> list[v.ValidationWorkload]:
    """Punica mixes x adapters for LoRA and LoRA_P, base, an Azure conversation-trace slice and
    multi-turn conversations; seeds differ from every fitting probe (those are uniform batches)."""
    from sim.workload.traces import TRACES_DIR

    rate = 12.0
    punica = [("identical", 1), ("uniform", 8), ("skewed", 8), ("distinct", 8),
              ("uniform", 32), ("skewed", 32), ("distinct", 32)]
    if quick:
        return [v.punica_validation_workload("lora", "uniform", 8, num_requests=num_requests,
                                             rate_per_s=rate, seed=11),
                v.punica_validation_workload("lora_p", "uniform", 8, num_requests=num_requests,
                                             rate_per_s=rate, seed=11)]
    # Offline (all requests at t=0, the bench_vllm_lora setup): throughput at saturation.
    out = [v.punica_validation_workload(kind, "uniform", 8, num_requests=2 * num_requests,
                                        rate_per_s=None, seed=40) for kind in KINDS]
    out.append(v.punica_validation_workload("base", "identical", 1, num_requests=num_requests,
                                            rate_per_s=rate, seed=10))
    for kind in ("lora", "lora_p"):
        out += [v.punica_validation_workload(kind, mix, n, num_requests=num_requests,
                                             rate_per_s=rate, seed=10 + i)
                for i, (mix, n) in enumerate(punica)]
    trace = TRACES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    for kind in ("base", "lora"):
        out.append(v.trace_validation_workload(kind, trace, num_requests=num_requests,
                                               rate_scale=3.0, length_scale=0.25,
                                               num_adapters=8, seed=20))
        out.append(v.conversation_validation_workload(
            kind, num_conversations=max(2, num_requests // 4), num_turns=4, num_adapters=4,
            rate_per_s=2.0, think_s=0.5, seed=30))
    return out


VALIDATION_MAX_LORAS = 8
"""Device adapter slots of the validation engine: fewer than the 32-adapter mixes, so slot
contention (a request waits for a free slot) and slot loads are validated too, on an engine the
profile (32 slots) was not measured on."""


def _engine_spec(profile_) -> VllmEngineSpec:
    settings = {k: val for k, val in profile_.engine.settings.items()
                if k in VllmEngineSpec.__dataclass_fields__}
    return replace(VllmEngineSpec(**settings), max_loras=VALIDATION_MAX_LORAS)


def replay_group_profiles(spec: VllmEngineSpec) -> dict:
    """Cost profile of each replay step group ("base", "lora", "lora_p") on the cpu entry."""
    from calibrate.fitter import group_profiles
    from calibrate.runner import TARGETS
    from sim.hardware.catalogue import get_gpu, get_model

    arch = get_model("vllm-tiny-llama")
    return group_profiles(arch, get_gpu(spec.gpu_kind), adapter_rank=spec.max_lora_rank,
                          adapter_placements=[(i, m) for i in range(arch.num_layers)
                                              for m in TARGETS], ranks=())


def reference_probe(kind: str) -> dict:
    """The drift reference run before each workload run: the profile's first staggered probe
    (runner.STAGGERED[0], repeat 0: the same prompts), in the workload's kind. Eight 64-token
    prompts arrive every two steps while the earlier ones decode 24 tokens: about 40 steps of
    prefill+decode and decode at batch 1-8, well under a second."""
    return dict(kind=kind, num_requests=8, prompt_tokens=64, output_tokens=24,
                num_adapters=1 if kind == "base" else 8, stagger=2, repeat=0)


def _reset_prefix_cache(session: VllmSession) -> None:
    if not session.llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache between runs")


def measure_run(session: VllmSession, w: v.ValidationWorkload, clock: str) -> dict:
    """One run of `w` from an empty prefix cache, the step timer on: its summary, the machine's
    load, the replay's own steps (`calibrate.step_check`) and, measured just before on the same
    engine, the reference probe's steps (the drift factor's numerator)."""
    # The machine's speed drifts by tens of percent over minutes; this fitting-type probe,
    # priced by the profile, says how fast it ran for this run.
    _reset_prefix_cache(session)
    reference, _ = session.run_probe(reference_probe(w.kind))
    # Each run replays the same prompts: without a reset, runs after the first found them in
    # the prefix cache (23% fewer tokens computed offline), which the simulator, starting
    # cold, does not.
    _reset_prefix_cache(session)
    session.timer.drain()
    session.timer.enable(True)
    try:
        turns = replay_open_loop(session, list(w.conversations), clock=clock)
    finally:
        session.timer.enable(False)
    steps = replay_steps(session.timer.drain(), group=w.kind,
                         prefill_only_ids=session.prefill_only_ids)
    return dict(summary=v.summarize_turns(turns), load_average=load_average(), steps=steps,
                reference=[r.to_json() for r in reference])


def run_drift_factor(record: dict, coeffs, profiles) -> float | None:
    """A run's drift factor: its reference probe's measured over priced step seconds (None for
    a run stored before the reference probe existed)."""
    from calibrate.fitter import predict_samples
    from calibrate.recorder import StepSample

    samples = [StepSample.from_json(s) for s in record.get("reference", [])]
    if not samples:
        return None
    return v.drift_factor([s.measured_s for s in samples],
                          predict_samples(coeffs, samples, profiles))


def _measure(out: Path, spec: VllmEngineSpec, workloads, num_repeats: int, clock: str,
             hook) -> tuple[dict, int]:
    """Runs of `workloads` on one engine: {(name, repeat): summary}, and its KV blocks."""
    from sim.io.points import PointStore, PointTask, progress_counter, run_points

    tasks = [PointTask(re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{w.name}-r{r}"),
                       dict(workload=i, repeat=r))
             for r in range(num_repeats) for i, w in enumerate(workloads)]
    store = PointStore(out / "runs")
    blocks_file = out / "runs" / f"kv-blocks-{spec.enable_lora}.txt"
    if all((rec := store.load(t.key)) and rec.get("status") == "ok" for t in tasks):
        records = {t.key: store.load(t.key) for t in tasks}
        return records, int(blocks_file.read_text())
    session = VllmSession(out / "work", spec)
    try:
        # Every adapter read into the CPU cache once: runs then only move adapters into slots,
        # the loads the simulator prices (it holds every adapter in host memory).
        session.warm_up(num_adapters=max(w.num_adapters for w in workloads))
        blocks = int(session.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks)
        blocks_file.parent.mkdir(parents=True, exist_ok=True)
        blocks_file.write_text(str(blocks))

        def run(payload: dict) -> dict:
            return measure_run(session, workloads[payload["workload"]], clock)

        records = run_points(tasks, run, store, backend="inline",
                             on_done=progress_counter(len(tasks), hook))
        return records, blocks
    finally:
        session.close()


def run_validation(profile_, out: Path, *, num_repeats: int, num_requests: int, clock: str,
                   quick: bool, on_progress, command: str, load_at_start) -> Path:
    """Measure, predict, compare; write OUT/validation.md and OUT/validation.json."""
    workloads = validation_workloads(num_requests, quick=quick)
    spec = _engine_spec(profile_)
    rows, runs_by_workload, loads, step_checks, drift_by_workload = [], {}, [], {}, {}
    profiles = replay_group_profiles(spec)
    for enable_lora in (False, True):
        mine = [w for w in workloads if (w.kind != "base") == enable_lora]
        if not mine:
            continue
        engine_spec = replace(spec, enable_lora=enable_lora)
        records, blocks = _measure(out, engine_spec, mine, num_repeats, clock,
                                   on_progress(f"engine {'LoRA' if enable_lora else 'base'}"))
        for i, w in enumerate(mine):
            mine_ok = [rec for rec in records.values()
                       if rec["payload"]["workload"] == i and rec.get("status") == "ok"]
            runs = [rec["result"]["summary"] for rec in mine_ok]
            loads += [rec["result"]["load_average"][0] for rec in mine_ok]
            if not runs:
                continue
            runs_by_workload[w.name] = runs
            factors = [run_drift_factor(rec["result"], profile_.coefficients, profiles)
                       for rec in mine_ok]
            drift_by_workload[w.name] = factors
            rows += v.compare(w.name, runs, v.predict(w, profile_.coefficients, engine_spec,
                                                      blocks),
                              factors if None not in factors else None)
            step_runs = [rec["result"]["steps"] for rec in mine_ok if "steps" in rec["result"]]
            if step_runs:
                step_checks[w.name] = check_steps(step_runs, profile_.coefficients, profiles)
    if not rows:
        raise RuntimeError("no validation run finished")
    switch = _ced_switch(out, num_repeats, on_progress) if not quick else []
    report = dict(profile=profile_.name, created_utc=dt.datetime.now(dt.UTC).isoformat(
        timespec="seconds"), clock=clock, num_repeats=num_repeats, num_requests=num_requests,
        machine=machine_fingerprint(), profile_machine=dict(profile_.hardware.fingerprint),
        validation_engine=dict(max_loras=spec.max_loras, max_lora_rank=spec.max_lora_rank,
                               max_num_seqs=spec.max_num_seqs,
                               max_num_batched_tokens=spec.max_num_batched_tokens),
        load_average_start=list(load_at_start),
        load_average_end=list(load_average()), command=command,
        load_average_1min_during_runs=[min(loads), float(np.median(loads)), max(loads)],
        goals=v.goal_summary(rows), goals_drift_scaled=v.goal_summary(rows, "error_drift_scaled"),
        drift_factors=drift_by_workload, rows=rows, runs=runs_by_workload, ced_switch=switch,
        step_checks=step_checks)
    out.mkdir(parents=True, exist_ok=True)
    (out / "validation.json").write_text(json.dumps(report, indent=2))
    (out / f"{profile_.name}.validation.json").write_text(
        json.dumps(profile_validation(report), indent=2))
    md = out / "validation.md"
    md.write_text(v.markdown_table(report))
    return md


PROFILE_VALIDATION_FIELDS = ("workload", "metric", "measured_median", "run_spread", "num_runs",
                             "predicted", "error", "error_drift_scaled")


def profile_validation(report: dict) -> dict:
    """The part of a validation report the planner's intervals read
    (`planner.predict.intervals`): what was validated where, and each row's error. Kept beside the
    profile as `<name>.validation.json` (copy it there from OUT)."""
    keep = ("profile", "created_utc", "clock", "num_repeats", "num_requests", "machine",
            "validation_engine", "command", "load_average_1min_during_runs", "goals")
    return {**{k: report[k] for k in keep if k in report},
            "rows": [{k: r.get(k) for k in PROFILE_VALIDATION_FIELDS} for r in report["rows"]]}


def _ced_switch(out: Path, num_repeats: int, on_progress) -> list[dict]:
    """CED switch by context (replay vs re-prefill): measured medians, spread, and the
    prediction of the shipped CED profile; [] when there is none. Stored like the runs."""
    import numpy as np

    from calibrate.ced_runner import measure_switch, predict_switch
    from sim.cost.profile import PROFILES_DIR, load_profile
    from sim.io.points import PointStore

    path = PROFILES_DIR / "cpu-ced-small.yaml"
    if not path.exists():
        return []
    profile = load_profile(path)
    store = PointStore(out / "runs")
    record = store.load("ced-switch")
    if record is None:
        on_progress("CED switch")(0, 1)
        record = {"status": "ok", "result": measure_switch(num_repeats=num_repeats)}
        store.save("ced-switch", record)
    rows = []
    for way in ("replay", "re-prefill"):
        for context in sorted({r["context"] for r in record["result"]}):
            values = np.array([r["seconds"] for r in record["result"]
                               if r["way"] == way and r["context"] == context])
            median = float(np.median(values))
            predicted = predict_switch(profile.coefficients, way, context,
                                       int(profile.engine.settings.get("num_head_params", 0)))
            rows.append(dict(way=way, context=context, measured_median_s=median,
                             run_spread=float((values.max() - values.min()) / median),
                             predicted_s=predicted, error=predicted / median - 1,
                             profile=profile.name))
    return rows
