"""Per-strategy work of `molcap run` as resumable points: a capacity plan and a simulation.

Each point function takes the scenario resolved at load (`planner.scenario.resolved`) and a JSON
payload (the scenario dump, kept in the stored record, and the strategy index), and returns a
JSON-able record. `point_function` binds the resolved scenario, so points run in worker
processes or on Ray, which receive it pickled and re-validate nothing, and are stored as they
finish.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import math
from dataclasses import asdict

import pandas as pd

from planner.predict.simulation import simulate_strategy
from planner.scenario.resolved import ResolvedScenario, as_resolved
from planner.scenario.schema import Scenario
from planner.search.slo_search import Plan, Trial
from planner.search.strategy_plan import plan_strategy
from sim.io.files import file_name
from sim.io.points import PointFn, PointTask, content_digest

MAX_TURN_ROWS = 20_000
"""Turn rows per strategy kept as JSON rows in a stored simulation record and in the CSV and
report (which sample them); the record also holds every turn as parquet, for the parquet table."""


def _trial_row(label: str, trial: Trial) -> dict:
    d = trial.deployment
    row = dict(strategy=label, gpu=d.gpu, tensor_parallel_size=d.tensor_parallel_size,
               num_replicas=d.num_replicas, num_model_copies=d.num_model_copies,
               num_router_replicas=d.num_router_replicas,
               max_num_seqs=d.max_num_seqs, max_loras=d.max_loras, num_gpus=d.num_gpus,
               rate_per_s=trial.rate_per_s, cost_per_hour_usd=trial.cost_per_hour_usd,
               meets_slo=trial.meets_slo, violations="; ".join(trial.violations),
               num_seeds=trial.num_seeds)
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                "e2e_p99_s", "output_tokens_per_s", "reply_tokens_per_s", "goodput_turns_per_s",
                "misroute_rate", "routing_gpu_share"):
        if key in trial.mean:
            row[key] = trial.mean[key]
            row[f"{key}_min"], row[f"{key}_max"] = trial.low[key], trial.high[key]
    return row


def plan_record(label: str, plan: Plan, dropped: list[str]) -> dict:
    """A plan as plain JSON: the chosen trial, runner-ups, Pareto front and every trial."""
    chosen = _trial_row(label, plan.chosen) if plan.chosen else None
    if chosen is not None:
        chosen["cost_per_million_tokens_usd"] = plan.cost_per_million_tokens_usd
        chosen["per_replica_rate_per_s"] = plan.per_replica_rate_per_s
        if plan.point_estimate_num_gpus is not None:
            chosen["point_estimate_num_gpus"] = plan.point_estimate_num_gpus
            chosen["confidence_extra_gpus"] = (plan.chosen.deployment.num_gpus
                                               - plan.point_estimate_num_gpus)
    return dict(
        strategy=label, is_feasible=plan.is_feasible, reason=plan.reason, chosen=chosen,
        runner_ups=[_trial_row(label, t) for t in plan.runner_ups],
        pareto_front=[_trial_row(label, t) for t in plan.pareto_front],
        trials=[_trial_row(label, t) for t in plan.trials],
        capacities=[dict(asdict(d), rate_per_s=r) for d, r in plan.capacities.items()],
        dropped=dropped, pruned=list(plan.pruned),
    )


def plan_point(resolved: ResolvedScenario, payload: dict) -> dict:
    """Point function: capacity plan of one strategy."""
    index = payload["index"]
    plan, dropped = plan_strategy(resolved, index)
    return plan_record(resolved.scenario.strategies[index].label, plan, dropped)


def _json_rows(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records"))


def simulate_point(resolved: ResolvedScenario, payload: dict) -> dict:
    """Point function: simulate one strategy on the scenario's own hardware."""
    scenario = resolved.scenario
    index = payload["index"]
    result = simulate_strategy(resolved, index)
    summary = {k: (None if isinstance(v, float) and math.isnan(v) else v)
               for k, v in result.summary.items()}
    return dict(strategy=scenario.strategies[index].label, summary=summary,
                turns=_json_rows(result.turns.head(MAX_TURN_ROWS)), num_turns=len(result.turns),
                turns_parquet=base64.b64encode(result.turns.to_parquet(index=False)).decode(),
                timeseries=_json_rows(result.timeseries),
                kv_by_namespace=_json_rows(result.kv_by_namespace), stats=result.stats)


def run_point(resolved: ResolvedScenario, payload: dict) -> dict:
    """Point function of a `scenario_tasks` task: the plan or the simulation it names."""
    point = plan_point if payload["what"] == "plan" else simulate_point
    return point(resolved, payload)


def point_function(resolved: ResolvedScenario) -> PointFn:
    """`run_point` bound to `resolved`: what `run_points` hands each worker (it pickles)."""
    return functools.partial(run_point, resolved)


def scenario_tasks(scenario: Scenario | ResolvedScenario, what: str) -> list[PointTask]:
    """One task per strategy; the key hashes the whole scenario and the content of the files it
    reads (traces, cost profiles, as resolved), so an edit of either reruns it."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    dump = scenario.model_dump(mode="json")
    digest = content_digest(dump, resolved.input_digests)
    return [PointTask(f"{what}-{i:02d}-{file_name(st.label)}-{digest}",
                      {"what": what, "scenario": dump, "index": i})
            for i, st in enumerate(scenario.strategies)]


def all_turns(record: dict) -> pd.DataFrame:
    """Every turn of a simulation record (its parquet copy; the JSON rows in older records)."""
    if "turns_parquet" in record:
        turns = pd.read_parquet(io.BytesIO(base64.b64decode(record["turns_parquet"])))
    else:
        turns = pd.DataFrame(record["turns"])
    return turns.assign(strategy=record["strategy"])


def turns_cut_note(records: list[dict]) -> str | None:
    """The sentence saying which strategies' turn rows the CSV and the report cut, if any."""
    cut = [f"{r['strategy']} ({len(r['turns']):,} of {r.get('num_turns', len(r['turns'])):,})"
           for r in records if r.get("num_turns", 0) > len(r["turns"])]
    if not cut:
        return None
    return (f"sim_turns.csv and the turn figures hold the first {MAX_TURN_ROWS:,} turns of each "
            f"strategy: cut for {', '.join(cut)}; sim_turns.parquet and the summary hold every "
            "turn.")
