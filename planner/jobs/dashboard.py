"""What the what-if dashboard asks of the planner, as plain functions (no streamlit here).

* `whatif_cut` keeps a scenario's load and shapes but simulates a modest number of turns, so a
  knob change answers in seconds; `select_strategies` narrows the strategies compared.
* `simulate_scenario` and `plan_scenario` run the same per-strategy points as `molcap run`
  (`planner.jobs.strategy_points`) through the same resumable store under `out/<name>/points`, so
  what either of them finished is reused by the other.
* `PlanJob` runs the capacity search in a child process that can be cancelled; finished
  strategies stay in the store.
* `recommendation` says in a few lines what the numbers recommend.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from planner.jobs.strategy_points import plan_point, scenario_tasks, simulate_point
from planner.outputs.interval_columns import plan_intervals, summary_intervals
from planner.outputs.plan_table import interval_phrase
from planner.scenario.resolved import ResolvedScenario, as_resolved
from planner.scenario.schema import Scenario
from planner.scenario.workloads import ConversationWorkload, PunicaWorkload
from planner.search.slo import slo_violations
from sim.io.files import file_name
from sim.io.points import PointStore, progress_counter, run_points
from sim.strategies.registry import get_strategy

WHATIF_MAX_TURNS = 300
"""Turns the dashboard's default what-if simulates per strategy (the workload is cut)."""


def whatif_cut(scenario: Scenario, max_turns: int = WHATIF_MAX_TURNS) -> Scenario:
    """The scenario with its workload cut to about `max_turns` turns, at the same rate."""
    w = scenario.workload
    if isinstance(w, ConversationWorkload):
        count = max(1, min(w.num_conversations, math.ceil(max_turns / w.num_turns)))
        new = w.model_copy(update=dict(num_conversations=count))
    elif isinstance(w, PunicaWorkload):
        new = w.model_copy(update=dict(num_requests=min(w.num_requests, max_turns)))
    else:
        new = w.model_copy(update=dict(max_requests=min(w.max_requests or max_turns, max_turns)))
    return scenario.model_copy(update=dict(workload=new))


def select_strategies(scenario: Scenario, labels: list[str]) -> Scenario:
    """The scenario comparing only the strategies labelled `labels` (in the scenario's order)."""
    kept = tuple(s for s in scenario.strategies if s.label in labels)
    if not kept:
        raise ValueError(f"strategies: none of {labels} is in the scenario; known: "
                         f"{[s.label for s in scenario.strategies]}")
    return scenario.model_copy(update=dict(strategies=kept))


def points_dir(scenario: Scenario | ResolvedScenario, out_root: str | Path) -> Path:
    """Where `molcap run` keeps the scenario's finished points."""
    if isinstance(scenario, ResolvedScenario):
        scenario = scenario.scenario
    return Path(out_root) / file_name(scenario.name) / "points"


@dataclass(frozen=True)
class SimTables:
    """Every strategy simulated: tables with a `strategy` column, and failed strategies."""

    summary: pd.DataFrame
    turns: pd.DataFrame
    timeseries: pd.DataFrame
    kv_by_namespace: pd.DataFrame
    errors: dict[str, str] = field(default_factory=dict)


def sim_tables(records: dict[str, dict]) -> SimTables:
    """Simulation point records (as `run_points` returns them) as tables."""
    summary, turns, series, kv, errors = [], [], [], [], {}
    for record in records.values():
        label = record["payload"]["scenario"]["strategies"][record["payload"]["index"]]
        label = label.get("name") or label["kind"]
        if record["status"] != "ok":
            errors[label] = record["error"]
            continue
        r = record["result"]
        summary.append({"strategy": r["strategy"], **r["summary"]})
        turns += [dict(t, strategy=r["strategy"]) for t in r["turns"]]
        series += [dict(t, strategy=r["strategy"]) for t in r["timeseries"]]
        kv += [dict(t, strategy=r["strategy"]) for t in r.get("kv_by_namespace", [])]
    return SimTables(pd.DataFrame(summary), pd.DataFrame(turns), pd.DataFrame(series),
                     pd.DataFrame(kv, columns=["time_s", "replica", "namespace", "blocks",
                                               "strategy"]), errors)


def simulate_scenario(scenario: Scenario | ResolvedScenario, out_root: str | Path,
                      on_progress: Callable[[int, int], None] | None = None,
                      num_workers: int = 1) -> SimTables:
    """Simulate every strategy on the scenario's hardware (finished points are reused), on
    `num_workers` local processes (1: in this process)."""
    resolved = as_resolved(scenario)
    tasks = scenario_tasks(resolved, "sim")
    backend = "local" if num_workers > 1 and len(tasks) > 1 else "inline"
    records = run_points(tasks, functools.partial(simulate_point, resolved),
                         PointStore(points_dir(resolved, out_root)),
                         backend=backend, num_workers=num_workers,
                         on_done=progress_counter(len(tasks), on_progress))
    return sim_tables(records)


def is_simulated(scenario: Scenario, out_root: str | Path) -> bool:
    """Whether every strategy's simulation point is already in the store."""
    store = PointStore(points_dir(scenario, out_root))
    return all(store.path(t.key).exists() for t in scenario_tasks(scenario, "sim"))


@dataclass(frozen=True)
class PlanTables:
    """The capacity plan: one row per strategy, runner-ups, every trial, and failures."""

    plans: pd.DataFrame
    runner_ups: pd.DataFrame
    trials: pd.DataFrame
    """Every deployment tried at the target rate (the Pareto chart's points)."""
    errors: dict[str, str] = field(default_factory=dict)
    num_missing: int = 0
    """Strategies whose plan is not in the store yet."""


def _plan_tables(records: dict[str, dict], num_missing: int = 0) -> PlanTables:
    plans, runner_ups, trials, errors = [], [], [], {}
    for key, record in records.items():
        if record["status"] != "ok":
            errors[key] = record["error"]
            continue
        r = record["result"]
        chosen = r["chosen"] or {"strategy": r["strategy"]}
        reasons = [] if r["is_feasible"] else r["reason"].removeprefix(
            "no deployment meets the SLOs: ").split("; ")
        plans.append(dict(chosen, is_feasible=r["is_feasible"], reason=r["reason"],
                          candidate_reasons=reasons + list(r.get("dropped", []))
                          + list(r.get("pruned", []))))
        runner_ups += r["runner_ups"]
        target = {t["rate_per_s"] for t in r["pareto_front"]}
        trials += [t for t in r["trials"] if t["rate_per_s"] in target]
    return PlanTables(pd.DataFrame(plans), pd.DataFrame(runner_ups), pd.DataFrame(trials),
                      errors, num_missing)


def stored_plan(scenario: Scenario, out_root: str | Path) -> PlanTables:
    """The plans already finished in the store (by `molcap run` or the dashboard); computes
    nothing."""
    store = PointStore(points_dir(scenario, out_root))
    records = {t.key: store.load(t.key) for t in scenario_tasks(scenario, "plan")}
    done = {k: r for k, r in records.items() if r and r.get("status") == "ok"}
    return _plan_tables(done, num_missing=len(records) - len(done))


def plan_scenario(scenario: Scenario | ResolvedScenario, out_root: str | Path,
                  on_progress: Callable[[int, int], None] | None = None) -> PlanTables:
    """Capacity plan of every strategy, in this process (finished points are reused)."""
    resolved = as_resolved(scenario)
    tasks = scenario_tasks(resolved, "plan")
    records = run_points(tasks, functools.partial(plan_point, resolved),
                         PointStore(points_dir(resolved, out_root)),
                         backend="inline", on_done=progress_counter(len(tasks), on_progress))
    return _plan_tables(records)


def _plan_in_child(resolved: ResolvedScenario, out_root: str) -> None:
    plan_scenario(resolved, out_root)


class PlanJob:
    """A capacity search in a child process: poll `progress`, `cancel` at any time (finished
    strategies stay in the store, so starting again resumes), read `result` when done."""

    def __init__(self, scenario: Scenario, out_root: str | Path):
        self.scenario, self.out_root = scenario, Path(out_root)
        resolved = as_resolved(scenario)
        self._store = PointStore(points_dir(scenario, out_root))
        self._keys = [t.key for t in scenario_tasks(resolved, "plan")]
        context = multiprocessing.get_context("spawn")  # never fork a threaded server
        self._process = context.Process(target=_plan_in_child, args=(resolved, str(out_root)),
                                        daemon=True)
        self._process.start()

    def progress(self) -> tuple[int, int]:
        """(strategies finished, strategies in all)."""
        done = sum(self._store.load(k) is not None for k in self._keys)
        return done, len(self._keys)

    @property
    def is_running(self) -> bool:
        """Whether the child is still searching."""
        return self._process.is_alive()

    def cancel(self) -> None:
        """Stop the search now; the strategy in progress is dropped, finished ones are kept."""
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=10)

    def result(self) -> PlanTables:
        """The plans finished so far."""
        return stored_plan(self.scenario, self.out_root)


def sim_violations(scenario: Scenario, summary: pd.DataFrame) -> dict[str, list[str]]:
    """Per strategy, the SLOs its simulation misses on the scenario's own hardware."""
    return {row["strategy"]: slo_violations(scenario.slo, row)
            for row in summary.to_dict(orient="records")}


def plan_headline(scenario: Scenario, plan: PlanTables | None) -> str | None:
    """The plan's recommendation in one line: the cheapest adapter strategy within the SLOs
    (lowest p99 TTFT among equally cheap ones), or None without a feasible plan."""
    if plan is None or plan.plans.empty:
        return None
    feasible = plan.plans[plan.plans["is_feasible"].astype(bool)]
    adapted = _adapter_strategies(scenario, feasible) if not feasible.empty else feasible
    if adapted.empty:
        return None
    best = plan_intervals(adapted.sort_values(["cost_per_hour_usd", "ttft_p99_s"]).head(1),
                          scenario).iloc[0]
    ties = adapted[adapted["cost_per_hour_usd"] == best["cost_per_hour_usd"]]
    also = f" (as cheap: {', '.join(ties['strategy'][1:])})" if len(ties) > 1 else ""
    replicas = int(best["num_replicas"])
    return (f"Plan: {best['strategy']} on {int(best['num_gpus'])} x {best['gpu']} "
            f"(TP={int(best['tensor_parallel_size'])}, {replicas} "
            f"replica{'s' if replicas > 1 else ''}) at {best['cost_per_hour_usd']:,.2f} USD/h, "
            f"p99 TTFT {interval_phrase(best, 'ttft_p99_s', 's')}: the cheapest adapter "
            f"strategy within the SLOs{also}.")


def recommendation(scenario: Scenario, sim: SimTables, plan: PlanTables | None) -> list[str]:
    """A few lines saying what the numbers recommend, plan first, then the simulation."""
    headline = plan_headline(scenario, plan)
    lines = [headline] if headline else []
    if not sim.summary.empty:
        hw = scenario.hardware
        misses = {k: v for k, v in sim_violations(scenario, sim.summary).items() if v}
        num_ok = len(sim.summary) - len(misses)
        rate = _rate_text(scenario)
        replicas = f"{hw.num_replicas} replica" + ("s" if hw.num_replicas > 1 else "")
        where = f"{replicas} of {hw.num_gpus_per_replica} x {hw.gpu_spec.name}"
        missed = "; ".join(f"{k} ({', '.join(v)})" for k, v in misses.items())
        lines.append(f"At {rate} on {where}: {num_ok} of {len(sim.summary)} strategies meet "
                     f"the SLOs" + (f"; missing them: {missed}." if misses else "."))
        adapted = _adapter_strategies(scenario, sim.summary)
        if not adapted.empty:
            adapted = summary_intervals(adapted, scenario)
            fast = adapted.sort_values("ttft_p99_s").iloc[0]
            good = adapted.sort_values("goodput_turns_per_s").iloc[-1]
            ttft = interval_phrase(fast, "ttft_p99_s", "s")
            goodput = interval_phrase(good, "goodput_turns_per_s", "turns/s")
            lines.append(f"Among adapter strategies: lowest p99 TTFT {fast['strategy']} at "
                         f"{ttft}; most goodput within the SLOs {good['strategy']} at "
                         f"{goodput}.")
    return lines


COMPARED_METRICS = {
    "ttft_p99_s": "p99 time to first token (s)", "tpot_p99_s": "p99 time per output token (s)",
    "e2e_p99_s": "p99 end-to-end per turn (s)", "output_tokens_per_s": "output tokens/s",
    "goodput_turns_per_s": "goodput (turns/s within SLOs)", "slo_attainment": "SLO attainment",
}
"""Summary metrics the variant comparison shows, with their units."""


def compare_summaries(before: pd.DataFrame, after: pd.DataFrame) -> tuple[pd.DataFrame,
                                                                          pd.DataFrame]:
    """Two variants' summaries: stacked with a `variant` column, and per strategy and metric
    the change from before to after (absolute and relative)."""
    cols = ["strategy", *[m for m in COMPARED_METRICS if m in before and m in after]]
    stacked = pd.concat([before[cols].assign(variant="before"),
                         after[cols].assign(variant="after")], ignore_index=True)
    joined = before[cols].merge(after[cols], on="strategy", suffixes=("_before", "_after"))
    rows = []
    for metric in cols[1:]:
        for row in joined.to_dict(orient="records"):
            a, b = row[f"{metric}_before"], row[f"{metric}_after"]
            rows.append(dict(strategy=row["strategy"], metric=metric, before=a, after=b,
                             change=b - a, relative_change=(b - a) / a if a else math.nan))
    return stacked, pd.DataFrame(rows)


def pricing(scenario: Scenario | ResolvedScenario, base_dir: Path | None = None) -> dict:
    """Which cost profile priced the scenario (as `planner.scenario.resolved` resolved it): the
    fitted profile's name or None for assumed defaults, how it was derived from another GPU's fit
    ("" when fitted on this GPU), its one-line description, the coefficients
    (one row each) and the profile's fit errors when it has them."""
    from sim.cost.cost_model import CostCoeffs

    resolved = as_resolved(scenario, base_dir)
    scenario = resolved.scenario
    source = resolved.source(scenario.hardware.gpu_spec.name)
    rows = []
    for name, info in CostCoeffs.model_fields.items():
        value = getattr(source.coeffs, name)
        if isinstance(value, tuple):  # all_reduce_fits: one numeric row per fitted value
            rows += [dict(coefficient=f"{name}[tp={f.tensor_parallel_size}, {f.interconnect}]"
                          f".{key}", value=getattr(f, key), meaning=f.source)
                     for f in value for key in ("latency_s", "bandwidth_bytes_per_s")]
        else:
            rows.append(dict(coefficient=name, value=value, meaning=info.description or ""))
    fit = source.profile.fit.errors if source.profile is not None else []
    return dict(profile=source.profile.name if source.profile else None,
                derivation=source.profile.derivation if source.profile else "",
                description=source.describe(), gpu=scenario.hardware.gpu_spec.name,
                coefficients=pd.DataFrame(rows),
                fit_errors=pd.DataFrame([e.model_dump() for e in fit]))


def _adapter_strategies(scenario: Scenario, summary: pd.DataFrame) -> pd.DataFrame:
    """Summary rows of the strategies that serve adapters (base is the no-adapter reference)."""
    base = {s.label for s in scenario.strategies if get_strategy(s.kind).is_reference}
    return summary[~summary["strategy"].isin(base)]


def _rate_text(scenario: Scenario) -> str:
    w = scenario.workload
    if isinstance(w, ConversationWorkload):
        return f"{w.arrival_rate_per_s:g} conversations/s"
    if isinstance(w, PunicaWorkload):
        return (f"{w.arrival_rate_per_s:g} requests/s" if w.arrival_rate_per_s
                else "all requests at once")
    return f"{w.rate_scale:g}x the trace's rate"
