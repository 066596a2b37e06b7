"""Sweeps: vary scenario fields over a grid, run every point, collect one tidy table.

A sweep spec names a base scenario and the fields to vary (dotted paths; `strategies.*.field`
sets a field on every strategy). Every point is a whole scenario, validated before anything
runs, so a bad value is reported against the spec line that produced it.
"""

from __future__ import annotations

import itertools
import math
import pickle
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, ValidationError

from planner.scenario.input_files import input_files_digest
from planner.scenario.loading import scenario_from_file_text
from planner.scenario.schema import Scenario
from sim.frozen import FrozenModel
from sim.io.points import content_digest
from sim.io.yaml_input import ScenarioError, parse_yaml, read_text_file, shorten

MAX_SWEEP_POINTS = 100_000
"""Most points one sweep may expand to (each is a whole scenario, validated and stored)."""


class SweepParameter(FrozenModel):
    """One varied field."""

    field: str = Field(min_length=1)
    """Dotted path into the scenario, e.g. `workload.switch_probability` or `hardware.gpu`."""
    values: tuple[Any, ...] = Field(min_length=1)
    """Values the field takes."""


class SweepSpec(FrozenModel):
    """A sweep over one base scenario."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Sweep name; results go to out/<name>/."""
    scenario: str = Field(min_length=1)
    """Base scenario file, relative to the spec file."""
    parameters: tuple[SweepParameter, ...] = Field(min_length=1)
    """Fields to vary."""
    combine: Literal["grid", "zip"] = "grid"
    """grid: every combination; zip: the i-th values of every parameter together."""
    evaluate: Literal["analysis", "simulate"] = "analysis"
    """What each point computes: the analytical comparisons, or a simulation of every strategy."""


class SweepPoint(NamedTuple):
    """One expanded point of a sweep."""

    key: str
    """Its file-name key (`point_key`)."""
    params: dict
    """The varied fields' values at this point (dotted path -> value)."""
    scenario: dict
    """The whole scenario as plain JSON-able data (the stored payload, and so the key)."""
    model: Scenario
    """The same scenario validated: what the sweep resolves and runs, validated only here."""


def _set_path(data: dict, path: str, value: Any) -> None:
    parts = path.split(".")
    targets = [data]
    for part in parts[:-1]:
        nxt = []
        for node in targets:
            if part == "*" and isinstance(node, list):
                nxt += node
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                nxt.append(node[int(part)])
            elif isinstance(node, dict):
                nxt.append(node.setdefault(part, {}))
            else:
                raise KeyError(f"{path!r}: {part!r} does not lead into the scenario")
        targets = nxt
    for node in targets:
        if not isinstance(node, dict):
            raise KeyError(f"{path!r}: cannot set {parts[-1]!r} on a {type(node).__name__}")
        node[parts[-1]] = value


def point_key(index: int, params: dict, scenario: dict, evaluate: str,
              inputs: list[str] = ()) -> str:
    """Stable file-name key of a point: its index and a hash of its parameter values, the whole
    scenario it evaluates (an edit of the base reruns it), the content of the files it reads
    (`inputs`, from `input_files_digest`), what it computes and the model version."""
    return f"p{index:05d}-{content_digest(params, scenario, evaluate, list(inputs))}"


def _combinations(spec: SweepSpec) -> list[tuple[tuple[int, ...], dict]]:
    ranges = [range(len(p.values)) for p in spec.parameters]
    if spec.combine == "zip":
        indices = list(zip(*ranges, strict=False))
    else:
        indices = list(itertools.product(*ranges))
    return [(idx, {p.field: p.values[i] for p, i in zip(spec.parameters, idx, strict=True)})
            for idx in indices]


def load_sweep(path: str | Path) -> tuple[SweepSpec, list[SweepPoint]]:
    """Read a sweep spec and expand it into its points, each scenario validated once."""
    path = Path(path)
    data, index = parse_yaml(read_text_file(path, "sweep spec"), str(path))
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise ScenarioError([
            f"{path}:{index.line_of(tuple(e['loc'])) or '?'}: {index.path_of(tuple(e['loc']))}: "
            f"{e['msg']} (given: {shorten(e.get('input'))})" for e in err.errors()]) from None
    sizes = [len(p.values) for p in spec.parameters]
    count = math.prod(sizes) if spec.combine == "grid" else min(sizes)
    if count > MAX_SWEEP_POINTS:
        raise ScenarioError([f"{path}:{index.line_of(('parameters',)) or '?'}: parameters: "
                             f"the {spec.combine} has {count} points "
                             f"({' x '.join(map(str, sizes))}); allowed: at most "
                             f"{MAX_SWEEP_POINTS}, split it into sweeps"])
    if spec.combine == "zip" and len({len(p.values) for p in spec.parameters}) > 1:
        raise ScenarioError([f"{path}:{index.line_of(('parameters',)) or '?'}: parameters: "
                             "combine: zip needs the same number of values for every parameter"])
    base = scenario_from_text_or_error(path.parent / spec.scenario, path, index)
    points, problems = [], []
    for n, (_, params) in enumerate(_combinations(spec)):
        try:
            scenario, model = _apply(base, params)
        except (KeyError, ValidationError) as err:
            # Name a bad value on its own spec line when one alone breaks the base (checked at
            # the first failing point only: a valid sweep need not validate each value twice).
            if not problems:
                alone = _single_value_problems(path, index, spec, base)
                if alone:
                    raise ScenarioError(alone) from None
            given = ", ".join(f"{f}={shorten(v)}" for f, v in params.items())
            problems += [f"{path}:{index.line_of(('parameters',)) or '?'}: parameters: the point "
                         f"{given} gives an invalid scenario: {d}" for d in _details(err)]
            continue
        key = point_key(n, params, scenario, spec.evaluate, input_files_digest(model))
        points.append(SweepPoint(key, params, scenario, model))
    if problems:
        raise ScenarioError(problems)
    return spec, points


def _apply(base: dict, params: dict) -> tuple[dict, Scenario]:
    scenario = pickle.loads(pickle.dumps(base))  # a deep copy, several times faster
    for field_path, value in params.items():
        _set_path(scenario, field_path, value)
    return scenario, Scenario.model_validate(scenario)


def _details(err: Exception) -> list[str]:
    if isinstance(err, KeyError):
        return [str(err.args[0])]
    details = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = ".".join(map(str, e["loc"]))
        details.append(f"{loc}: {msg}" if loc else msg)
    return details


def _single_value_problems(path: Path, index, spec: SweepSpec, base: dict) -> list[str]:
    """Each value applied alone to the base scenario, so a bad one is named exactly."""
    problems = []
    for p_i, param in enumerate(spec.parameters):
        line = index.line_of(("parameters", p_i, "values")) or "?"
        for v_i, value in enumerate(param.values):
            try:
                _apply(base, {param.field: value})
            except (KeyError, ValidationError) as err:
                problems += [f"{path}:{line}: parameters.{p_i}.values.{v_i}: {param.field}="
                             f"{shorten(value)} gives an invalid scenario: {d}"
                             for d in _details(err)]
    return problems


def scenario_from_text_or_error(base_path: Path, spec_path: Path, index) -> dict:
    """The base scenario as a complete plain dict, or a located error on the spec."""
    line = index.line_of(("scenario",)) or "?"
    try:
        text = read_text_file(base_path)
    except ScenarioError as err:
        raise ScenarioError([f"{spec_path}:{line}: scenario: " + m.replace(
            f"{base_path}: cannot read: ", f"cannot read {base_path}: ", 1)
            for m in err.messages]) from None
    # Located errors on the base itself; its relative paths resolve against its own folder.
    scenario = scenario_from_file_text(text, str(base_path), base_path.parent)
    # Every default made explicit, so a sweep can set a field the base file leaves out.
    return scenario.model_dump(mode="json")
