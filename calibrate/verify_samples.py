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


ROUTING_TERMS = ("routing_overhead_s",)
"""Coefficients that price a routing decision (`sim.cost.cost_model.routing_decision_s`)."""


def routing_notes(run: Path, fitted_terms: tuple[str, ...]) -> list[str]:
    """What the fit does with the routing decisions a routed verify run measured: one line per
    routed strategy of `run`, said rather than dropped silently. The timed steps do not record
    which step ran a decision (the step timer sees the scheduler's batch, not the plugin's
    head), so a decision's seconds stay inside the prefill step that ran it."""
    has_term = bool(set(ROUTING_TERMS) & set(fitted_terms))
    why = ("the routing term is fitted without them" if has_term else
           "the fitter has no routing term, so routing_overhead_s keeps its value")
    notes = []
    for record in load_verify_runs(run):
        routing = record.get("routing")
        if not routing:
            continue
        probe = routing["probe"]
        notes.append(
            f"{run}: {record['strategy']!r}: its {int(routing['counts'].get('written', 0))} "
            f"routing decisions ({probe['decision_s'] * 1e3:.3g} ms each as a client sees it, "
            f"{probe.get('clock', record['clock'])} clock) are not fitted: {why}; their "
            "seconds stay inside the prefill steps they ran in, priced as if no decision ran")
    return notes
