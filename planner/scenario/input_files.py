"""The files a scenario's points read besides the scenario itself, and a digest of their content.

A point's key hashes the scenario; the scenario names its trace, output-length trace and cost
profiles by path, so an edit of one of those files would leave the key unchanged and a resumed
run would reuse numbers computed from the old content. The digest of their bytes goes into the
key. (Router cards need no entry: loading copies their numbers into the scenario.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from planner.scenario.pricing import DEFAULT_PROFILES
from planner.scenario.schema import Scenario
from sim.cost.profile import profile_path
from sim.workload.traces import TRACES_DIR

_DIGESTS: dict[tuple[str, int, int], str] = {}
"""(path, size, mtime_ns) -> content digest: a sweep asks for the same files at every point."""


def _lengths_file(trace_path: str) -> Path:
    """Where the simulator finds an output-length trace (`planner.predict.simulation`): the path as
    given when absolute (loading anchors one beside the scenario), else the shipped traces."""
    path = Path(trace_path)
    if path.is_absolute():
        return path
    shipped = TRACES_DIR / path
    return shipped if shipped.exists() else Path.cwd() / path


def input_files(scenario: Scenario) -> list[Path]:
    """Every file the scenario's simulations and plans read, other than code."""
    files = []
    workload = scenario.workload
    trace = getattr(workload, "path", None)
    if trace is not None:
        files.append(Path(trace))
    lengths = getattr(workload, "output_lengths", None)
    if lengths is not None and lengths.distribution == "trace":
        files.append(_lengths_file(lengths.trace_path))
    if scenario.hardware.profile is not None:
        files.append(profile_path(scenario.hardware.profile))
    # Each GPU kind the plan may try is priced by its shipped profile when it has one.
    for gpu in sorted({scenario.hardware.gpu_spec.name, *(scenario.search.gpus or ())}):
        default = DEFAULT_PROFILES.get(gpu)
        if default is not None and profile_path(default).exists():
            files.append(profile_path(default))
    return files


def _file_digest(path: Path) -> str:
    try:
        stat = path.stat()
    except OSError:
        return "missing"  # the point itself reports the missing file
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha1(path.read_bytes()).hexdigest()
    return _DIGESTS[key]


def input_files_digest(scenario: Scenario) -> list[str]:
    """Content digests of `input_files(scenario)`, in order (a part of a point's key)."""
    return [_file_digest(path) for path in input_files(scenario)]
