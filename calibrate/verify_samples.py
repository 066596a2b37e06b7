"""Verify runs as calibration samples (`molcap calibrate fit --add-verify RUN`): every engine step
a verify run timed joins the fit, priced on the cost profile that priced the strategy and
deployment that ran it (stored with the run), so each check a user runs on their cluster
improves the next fit."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np

from calibrate.recorder import StepSample


def load_verify_runs(run: Path) -> list[dict]:
    """Finished strategy records of a verify output folder (OUT/points/verify-*.json)."""
    records = []
    for path in sorted((Path(run) / "points").glob("verify-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a damaged point: verify reruns it, the fit skips it
        if isinstance(record, dict) and record.get("status") == "ok":
            records.append(record["result"])
    if not records:
        raise FileNotFoundError(f"{run}: no finished verify run (points/verify-*.json); run "
                                f"`molcap verify SCENARIO --out {run}` first")
    return records


def layer_costs_from_json(raw: dict):
    """A `sim.cost.layer_costs.LayerCosts` from the JSON `planner.verify.prepare.layer_costs_json`
    wrote."""
    from sim.cost.layer_costs import LayerCosts
    from sim.hardware.specs import GpuSpec

    values = {}
    for f in fields(LayerCosts):
        value = raw[f.name]
        if isinstance(value, dict) and "array" in value:
            value = np.array(value["array"], dtype=value["dtype"])
        elif f.name == "gpu":
            value = GpuSpec.model_validate(value)
        values[f.name] = value
    return LayerCosts(**values)


def verify_samples(run: Path, gpu_kind: str) -> tuple[list[StepSample], dict]:
    """The step samples of a verify run and the cost profile of each sample group; refuses a
    run on another GPU kind than the samples it joins (naming both)."""
    samples, profiles = [], {}
    for record in load_verify_runs(run):
        gpu = record["deployment"]["gpu"]
        if gpu != gpu_kind:
            raise ValueError(f"{run}: verify run of {record['strategy']!r} ran on GPU kind "
                             f"{gpu!r}; the samples it would join are of {gpu_kind!r}")
        if not record.get("steps"):
            raise ValueError(f"{run}: verify run of {record['strategy']!r} has no timed steps; "
                             "run verify again")
        group = f"verify:{record['strategy']}"
        profiles[group] = layer_costs_from_json(
            record.get("layer_costs") or record["cost_profile"])  # cost_profile: older runs
        samples += [StepSample.from_json(s) for s in record["steps"]]
    return samples, profiles
