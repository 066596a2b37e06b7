"""The main job for one scenario file: plan capacity, simulate and compare every strategy."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from planner.jobs.strategy_points import (
    all_turns,
    point_function,
    scenario_tasks,
    turns_cut_note,
)
from planner.outputs import sim_figures
from planner.outputs.interval_columns import plan_intervals, summary_intervals
from planner.outputs.people_columns import ANALYTICAL_NOTE, people_table
from planner.outputs.plan_figures import (
    COMPARISON_FIGURES,
    pareto_figure,
    plan_latency_figure,
    sim_latency_figure,
)
from planner.outputs.plan_table import people_plan_table, people_summary_table, pricing_table
from planner.outputs.report import ReportSection, render_html, timestamp, write_table
from planner.predict.analysis import run_comparisons, tidy
from planner.predict.intervals import DEFAULT_CONFIDENCE, pricing_errors
from planner.scenario.accuracy_notes import accuracy_notes
from planner.scenario.loading import load_resolved
from planner.scenario.resolved import ResolvedScenario
from planner.scenario.schema import Scenario
from planner.scenario.workloads import OFFLINE_NOTE, is_offline
from sim.io.files import file_name, write_atomic
from sim.io.points import PointStore, progress_counter, run_points

_EXPLAIN = {
    "memory_summary": (
        "Memory of one replica, per GPU",
        "How each strategy's model splits one GPU's memory as vLLM would resolve it: weights "
        "sharded over tensor parallelism, preallocated LoRA slots, the activation reserve, and "
        "the paged KV pool that is left."),
    "kv_per_conversation": (
        "KV memory per conversation",
        "KV one conversation holds as its context grows and it visits more adapters. Where KV "
        "depends on the adapter (a decoder-only model, or CED adapters that break the placement "
        "rule) the prefix cache keeps one copy per adapter visited, as multi-agent keeps one per "
        "model; adapters on the decoder side of a CED model share one global KV plus one "
        "W-token window, whatever the strategy."),
    "switch_cost": (
        "Cost of one domain switch",
        "One switch at a given context, priced alone on one replica: under per-adapter KV a "
        "re-prefill under the new adapter (MoL's handoff, plus its summary hop), the handover "
        "prefill by the next model (multi-agent), and under shared KV (decoder-side adapters on a "
        "CED model, any strategy) a bounded replay of W tokens through the decoder."),
    "routing_vs_reply_length": (
        "Routing overhead vs reply length",
        "Share of a turn spent deciding the adapter, one decision per turn, as replies grow."),
    "routing_vs_decision_frequency": (
        "Routing overhead vs decision frequency",
        "A decision (and a switch) every k decoded tokens, as agent tool calls do: the share of "
        "time spent routing and switching rather than decoding."),
    "decode_step_vs_adapters": (
        "Decode step time vs adapter mix",
        "One decode step of the analysis batch, with its sequences spread over more distinct "
        "adapters. PreFT decode tokens run base weights, so their step does not change."),
}


@dataclass(frozen=True)
class RunResult:
    """What one run wrote."""

    scenario: Scenario
    report_path: Path
    table_paths: list[Path]
    comparisons: dict[str, pd.DataFrame]
    plans: pd.DataFrame
    errors: dict[str, str]
    num_points: int
    notes: tuple[str, ...] = ()
    """One line each on what the run did not do and why (an offline scenario is not planned)."""
    resolved: ResolvedScenario | None = None
    """The scenario as the run resolved it (what priced its points)."""


ACCURACY_NOTE = ("The share of routed turns sent to the right adapter, as the simulation "
                 "samples misroutes (the mean over seeds where a router card measured it; "
                 "the spread over seeds beside it) and where the figure comes from.")
PRICING_NOTE = ("Which coefficients priced every step time below: a fitted profile (molcap "
                "calibrate; its measured error is in the profile file and docs/validation.md) or "
                "the assumed defaults of the GPU kind.")


def _sections(comparisons: dict[str, pd.DataFrame]) -> list[ReportSection]:
    sections = []
    for name, df in comparisons.items():
        title, text = _EXPLAIN[name]
        figures = [COMPARISON_FIGURES[name](df)] if name in COMPARISON_FIGURES else []
        sections.append(ReportSection(title, f"{text} {ANALYTICAL_NOTE}", figures,
                                      [people_table(df)]))
    return sections


def _accuracy_sections(scenario: Scenario) -> list[ReportSection]:
    """The router accuracy each routed strategy runs on: its seed spread and its source."""
    notes = accuracy_notes(scenario)
    if not notes:
        return []
    table = pd.DataFrame([{"strategy": k, "router accuracy": v} for k, v in notes.items()])
    return [ReportSection("Router accuracy", ACCURACY_NOTE, [], [table])]


def _charted(table: pd.DataFrame, intervals: Callable, resolved: ResolvedScenario) -> pd.DataFrame:
    """`table` with its interval columns: as `_with_intervals` already gave them in a run (not
    computed a second time for the figures), else computed here."""
    return table if "interval_confidence" in table else intervals(table, resolved)


def _plan_sections(plans: pd.DataFrame, trials: pd.DataFrame,
                   resolved: ResolvedScenario) -> list[ReportSection]:
    if plans.empty:
        return []
    scenario = resolved.scenario
    confidence = scenario.search.confidence or DEFAULT_CONFIDENCE
    text = ("The cheapest deployment per strategy that serves the workload's arrival rate within "
            "the SLOs: per-replica capacity by bisection on the rate with the simulator, then "
            "scale-out, verified at the target rate. Each value is the mean over seeds with its "
            f"{confidence:.0%} interval: the seeds' spread widened by the measured held-out "
            "error of the profile that priced it (docs/verify.md). Every column of every "
            "candidate is in the table files (CSV, parquet).")
    if scenario.search.confidence is not None:
        text += (f" Planned at confidence {confidence:.0%}: each latency SLO holds at the "
                 "upper end of its interval.")
    errors = {gpu: pricing_errors(resolved, gpu) for gpu in plans.get("gpu", pd.Series())
              .dropna().unique()}
    runner_ups = trials[trials["kind"] == "runner_up"] if not trials.empty else trials
    at_target = trials[trials["kind"] == "trial"] if not trials.empty else trials
    feasible = plans["is_feasible"].astype(bool).any()
    figures = [plan_latency_figure(_charted(plans, plan_intervals, resolved))] if feasible else []
    figures += ([pareto_figure(_charted(at_target, plan_intervals, resolved))]
                if not at_target.empty else [])
    table = people_plan_table(plans, errors, confidence)
    return [ReportSection("Capacity plan", text, figures, [table]),
            ReportSection("Runner-ups", "Other verified deployments, cheapest first."
                          if not runner_ups.empty else "No other candidate was verified.", [],
                          [people_plan_table(runner_ups.assign(is_feasible=True), errors,
                                             confidence)] if not runner_ups.empty else [])]


def _verify_sections(path: Path, name: str) -> list[ReportSection]:
    """The section `molcap verify` wrote for this scenario (its default folder), if any: the
    plan checked on a real engine, as the verify run recorded it."""
    if not path.exists():
        return []
    from planner.outputs.verify_report import verify_section
    from planner.verify.checks import VerifyResult

    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("scenario") != name:
        return []
    return [verify_section(VerifyResult(name, data["strategies"], data.get("skipped", []),
                                        data.get("failed", [])))]


def _sim_sections(summary: pd.DataFrame, turns: pd.DataFrame, timeseries: pd.DataFrame,
                  resolved: ResolvedScenario) -> list[ReportSection]:
    if summary.empty:
        return []
    text = ("Every strategy simulated on the scenario's own hardware and workload: throughput, "
            "latency percentiles, goodput under the SLOs, preemptions and switch recomputation, "
            "routing quality (routed turns, misroutes, misroute rate) and routing GPU-seconds "
            "(the routers' passes, wherever they run, as a share of the GPU time served).")
    if "window_s" in summary and summary["window_s"].notna().any():
        text += (f" The runs stopped at simulation.window_s = {summary['window_s'].max():g} s: "
                 f"every number covers the turns finished inside the window, rates are over the "
                 f"window, and num_turns_unfinished_in_window counts the others (under overload "
                 f"the slowest turns are among them).")
    charted = _charted(summary, summary_intervals, resolved)
    figures = [sim_latency_figure(charted), sim_figures.throughput_figure(charted)]
    if not turns.empty:
        figures += [sim_figures.latency_cdf_figure(turns, "ttft_s"),
                    sim_figures.hop_breakdown_figure(turns),
                    sim_figures.gpu_time_figure(turns),
                    sim_figures.switch_cost_figure(turns)]
    if not timeseries.empty:
        figures.append(sim_figures.timeseries_figure(timeseries, "kv_blocks_used"))
    text += (" Each value with its interval where the profile that priced it has a measured "
             "error (a value alone where it has none: no measured error); every column is in "
             "the table files (CSV, parquet).")
    return [ReportSection("Simulation", text, figures, [people_summary_table(charted)])]


def _collect(records: dict[str, dict]) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    plans, trials, summary, turns, series, errors = [], [], [], [], [], {}
    for key, record in records.items():
        if record["status"] != "ok":
            errors[key] = record["error"]
            continue
        r = record["result"]
        if key.startswith("plan-"):
            chosen = r["chosen"] or {"strategy": r["strategy"]}
            plans.append(dict(chosen, is_feasible=r["is_feasible"], reason=r["reason"],
                              pruned="; ".join(r.get("pruned", []))))
            trials += [dict(t, kind="runner_up") for t in r["runner_ups"]]
            trials += [dict(t, kind="trial") for t in r["trials"]]
        else:
            summary.append({"strategy": r["strategy"], **r["summary"]})
            turns += [dict(t, strategy=r["strategy"]) for t in r["turns"]]
            series += [dict(t, strategy=r["strategy"]) for t in r["timeseries"]]
    frames = dict(plans=plans, plan_trials=trials, sim_summary=summary, sim_turns=turns,
                  sim_timeseries=series)
    return {k: pd.DataFrame(v) for k, v in frames.items()}, errors


def _with_intervals(frames: dict[str, pd.DataFrame], resolved: ResolvedScenario) -> dict:
    """The plan, trial and summary tables with their interval columns, so the table files
    (and a saved run read back) carry the interval every printed value has."""
    out = dict(frames)
    for name in ("plans", "plan_trials"):
        if not out[name].empty and "gpu" in out[name]:
            out[name] = plan_intervals(out[name], resolved)
    if not out["sim_summary"].empty:
        out["sim_summary"] = summary_intervals(out["sim_summary"], resolved)
    return out


def run_scenario_file(
    path: str | Path, out_root: str | Path = "out", *, backend: str = "local",
    num_workers: int | None = None, ray_address: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Compare, simulate and plan every strategy of a scenario; write report and tables.

    Simulations and plans are points stored under out/<name>/points as they finish, so an
    interrupted run resumes without recomputing them.
    """
    path = Path(path)
    resolved = load_resolved(path)  # the one resolution: every point reads it
    scenario = resolved.scenario
    out_dir = Path(out_root) / file_name(scenario.name)
    comparisons = run_comparisons(resolved)
    offline = is_offline(scenario.workload)
    notes = (OFFLINE_NOTE,) if offline else ()
    tasks = scenario_tasks(resolved, "sim") + ([] if offline else scenario_tasks(resolved, "plan"))
    records = run_points(tasks, point_function(resolved), PointStore(out_dir / "points"),
                         backend=backend, num_workers=num_workers, ray_address=ray_address,
                         on_done=progress_counter(len(tasks), on_progress))
    frames, errors = _collect(records)
    frames = _with_intervals(frames, resolved)
    sims = [r["result"] for k, r in records.items() if k.startswith("sim-") and r["status"] == "ok"]
    cut = turns_cut_note(sims)
    notes += (cut,) if cut else ()
    if not offline:  # the plan `molcap verify --plan` checks on a real engine
        plans = [r for k, r in records.items() if k.startswith("plan-")]
        write_atomic(out_dir / "plan.json", json.dumps(
            {"scenario": scenario.name, "plans": plans}, default=str).encode("utf-8"))
    tables = write_table(tidy(comparisons), out_dir / "comparisons")
    # When cut, the parquet table holds every turn; the CSV keeps the rows the report shows.
    full = {"sim_turns": pd.concat([all_turns(r) for r in sims], ignore_index=True)} if cut else {}
    for name, df in {**comparisons, **frames}.items():
        if not df.empty:
            tables += write_table(df, out_dir / "tables" / name, full.get(name))
    pricing = pricing_table(resolved, frames["plans"])
    sections = ([ReportSection("Capacity plan" if note == OFFLINE_NOTE else "Turn table", note)
                 for note in notes]
                + [ReportSection("Cost profile", PRICING_NOTE, [], [pricing])]
                + _accuracy_sections(scenario)
                + _plan_sections(frames["plans"], frames["plan_trials"], resolved)
                + _verify_sections(out_dir / "verify" / "verify.json", scenario.name)
                + _sim_sections(frames["sim_summary"], frames["sim_turns"],
                                frames["sim_timeseries"], resolved)
                + _sections(comparisons))
    if errors:
        failed = pd.DataFrame([{"point": k, "error": v} for k, v in errors.items()])
        sections.append(ReportSection("Failed points", "These points raised; rerun to retry.",
                                      [], [failed]))
    subtitle = f"{scenario.description.strip()} Generated {timestamp()} from {path}."
    page = render_html(f"molcap: {scenario.name}", subtitle, sections,
                       path.read_text(encoding="utf-8"))
    report = out_dir / "report.html"
    write_atomic(report, page.encode("utf-8"))
    return RunResult(scenario, report, tables, comparisons, frames["plans"], errors, len(tasks),
                     notes, resolved)
