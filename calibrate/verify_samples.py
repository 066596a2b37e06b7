"""Verify runs as calibration samples (`molcap calibrate fit --add-verify RUN`): every engine step
a verify run timed joins the fit, priced on the cost profile of the strategy and deployment
that ran it, so each check a user runs on their cluster improves the next fit."""

from __future__ import annotations

from pathlib import Path

from calibrate.recorder import StepSample


def load_verify_runs(run: Path) -> list[dict]:
    """Finished strategy records of a verify output folder (OUT/points/verify-*.json)."""
    from planner.points import PointStore

    folder = Path(run) / "points"
    records = [PointStore(folder).load(p.stem) for p in sorted(folder.glob("verify-*.json"))]
    ok = [r["result"] for r in records if r and r.get("status") == "ok"]
    if not ok:
        raise FileNotFoundError(f"{run}: no finished verify run (points/verify-*.json); run "
                                f"`molcap verify SCENARIO --out {run}` first")
    return ok


def verify_samples(run: Path, gpu_kind: str) -> tuple[list[StepSample], dict]:
    """The step samples of a verify run and the cost profile of each sample group; refuses a
    run on another GPU kind than the samples it joins (naming both)."""
    from planner.profiles import create_strategy_costing
    from planner.scenario import Scenario

    samples, profiles = [], {}
    for record in load_verify_runs(run):
        gpu = record["deployment"]["gpu"]
        if gpu != gpu_kind:
            raise ValueError(f"{run}: verify run of {record['strategy']!r} ran on GPU kind "
                             f"{gpu!r}; the samples it would join are of {gpu_kind!r}")
        if not record.get("steps"):
            raise ValueError(f"{run}: verify run of {record['strategy']!r} has no timed steps "
                             "(made before verify recorded them); run verify again")
        scenario = Scenario.model_validate(record["scenario"])
        group = f"verify:{record['strategy']}"
        profiles[group] = create_strategy_costing(scenario, record["index"]).profile
        samples += [StepSample.from_json(s) for s in record["steps"]]
    return samples, profiles
