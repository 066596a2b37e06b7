"""Scenario files in, `Scenario` or located error messages out (YAML parsed by `sim.io.yaml_input`).

Every problem becomes one line `FILE:LINE: field.path: what is wrong (given: VALUE)`, so a user
can jump to it; duplicate keys and malformed YAML are caught before validation.
"""

from __future__ import annotations

from pathlib import Path

from planner.scenario.card_values import RouterCardProblem, apply_router_cards
from planner.scenario.checks import trace_problems
from planner.scenario.pricing import anchor_profile, located_profile_error
from planner.scenario.resolved import ResolvedScenario, resolve_scenario
from planner.scenario.schema import Scenario
from planner.scenario.workloads import TraceWorkload
from sim.io.yaml_input import (
    LineIndex,
    ScenarioError,
    parse_yaml,
    read_text_file,
    validate_model,
)


def _validated(text: str, source: str,
               folder: str | Path | None = None) -> tuple[Scenario, LineIndex]:
    data, index = parse_yaml(text, source)
    scenario = validate_model(Scenario, data, source, index, "a scenario")
    if folder is None:
        folder = Path(source).parent if Path(source).is_file() else Path.cwd()
    try:
        return apply_router_cards(scenario, folder), index
    except RouterCardProblem as err:
        raise ScenarioError([f"{source}:{index.line_of(err.loc)}: {index.path_of(err.loc)}: "
                             f"{err}"]) from None


def scenario_from_text(text: str, source: str = "<string>",
                       folder: str | Path | None = None) -> Scenario:
    """Validate YAML text as a Scenario; raise ScenarioError with located messages. Router
    cards resolve against `folder` (default: the folder of `source` if it is a file, else the
    working directory)."""
    return _validated(text, source, folder)[0]


def scenario_from_file_text(text: str, source: str, folder: str | Path) -> Scenario:
    """Validate the text of a scenario file that lives in `folder`: relative paths resolve
    against it, and the files it names (the trace, the profile) are opened and checked as a
    run would."""
    return resolved_from_file_text(text, source, folder).scenario


def resolved_from_file_text(text: str, source: str, folder: str | Path) -> ResolvedScenario:
    """`scenario_from_file_text`, resolved (`planner.scenario.resolved`): the one place a
    loaded scenario's pricing, adapter numbers and input files are fixed."""
    scenario, index = _validated(text, source, folder)
    scenario = anchor_paths(scenario, folder)
    if isinstance(scenario.workload, TraceWorkload):
        problems = trace_problems(scenario, source, index.line_of(("workload", "path")))
        if problems:
            raise ScenarioError(problems)
    scenario = anchor_profile(scenario, Path(folder))
    try:
        return resolve_scenario(scenario, Path(folder), strict=True)
    except ScenarioError as err:
        if scenario.hardware.profile is None:
            raise
        raise located_profile_error(err, text, source) from None


def anchor_paths(scenario: Scenario, folder: str | Path) -> Scenario:
    """The scenario with its relative file paths made absolute against `folder`, the scenario
    file's own folder, so that it reads the same files from any working directory and in any
    worker process: the trace always, an output-length trace when it lies there (otherwise the
    shipped data folder is searched, as for the default)."""
    workload, update = scenario.workload, {}
    trace_path = getattr(workload, "path", None)
    if trace_path is not None and not Path(trace_path).is_absolute():
        update["path"] = str((Path(folder) / trace_path).resolve())
    lengths = getattr(workload, "output_lengths", None)
    near = Path(folder) / lengths.trace_path if lengths is not None else None
    if near is not None and not Path(lengths.trace_path).is_absolute() and near.is_file():
        update["output_lengths"] = lengths.model_copy(
            update={"trace_path": str(near.resolve())})
    if not update:
        return scenario
    return scenario.model_copy(update={"workload": workload.model_copy(update=update)})


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; its relative paths resolve against its folder."""
    return load_resolved(path).scenario


def load_resolved(path: str | Path) -> ResolvedScenario:
    """Read, validate and resolve a scenario file (what `molcap run` hands its workers)."""
    path = Path(path)
    return resolved_from_file_text(read_text_file(path), str(path), path.parent)
