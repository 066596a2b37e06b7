"""Ctrl-C to `molcap run`'s process group ends it with one line on stderr and exit 130, no
traceback, whenever it arrives (README "The CLI"): here while the CLI's imports load, while
the command starts, as the local worker starts and while its first point runs. A local
worker that dies (killed) ends the run with one line and exit 1."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_capacity import SMALL

ROOT = Path(__file__).resolve().parents[2]


def _ctrl_c_default() -> None:
    """A test run from a background job starts with SIGINT ignored, and children inherit that:
    the Ctrl-C sent below would then test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


MODULE = [sys.executable, "-m", "app.cli"]
SCRIPT = [sys.executable, "-c", "import sys; from app.launch import main; sys.exit(main())"]
"""What the `molcap` console script runs (pyproject.toml [project.scripts])."""


def _start(tmp_path: Path, name: str) -> subprocess.Popen:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    command = SCRIPT if name.endswith("script") else MODULE
    return subprocess.Popen(
        [*command, "run", str(scenario), "--out",
         str(tmp_path / name), "--workers", "1"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_ctrl_c_default)


def _importing_the_cli(process: subprocess.Popen) -> bool:
    """pydantic's compiled core is mapped: the CLI module's imports are under way."""
    try:
        return "_pydantic_core" in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


def _children(process: subprocess.Popen) -> list[int]:
    """Pids of the processes `process` started (its local workers)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if parent == process.pid:
            pids.append(int(stat.parent.name))
    return pids


def _has_worker(process: subprocess.Popen) -> bool:
    return bool(_children(process))


def _alive(pid: int) -> bool:
    try:  # a zombie has exited
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ctrl_c(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended early: asserted below
        os.killpg(process.pid, signal.SIGINT)  # to the process group, as a terminal does


def _kill_worker(process: subprocess.Popen) -> None:
    for pid in _children(process):
        os.kill(pid, signal.SIGKILL)


CASES = {  # name: (wait for, seconds after it, then, exit code, the one line starts with)
    "ctrl-c in cli imports": (_importing_the_cli, 0.0, _ctrl_c, 130, "interrupted"),
    "ctrl-c in cli imports, console script": (
        _importing_the_cli, 0.0, _ctrl_c, 130, "interrupted"),
    "ctrl-c in command start": (_importing_the_cli, 0.6, _ctrl_c, 130, "interrupted"),
    "ctrl-c in worker start": (_has_worker, 0.0, _ctrl_c, 130, "interrupted"),
    "ctrl-c in first point": (_has_worker, 0.6, _ctrl_c, 130, "interrupted"),
    "worker killed": (_has_worker, 0.6, _kill_worker, 1, "a local worker process died"),
}


PATIENCE = 600.0
"""Seconds a wait below gives its condition: each ends as soon as its condition holds, so this
only has to exceed what six runs starting at once need on the slowest loaded machine."""


def test_ctrl_c_in_every_phase_or_a_dead_worker_ends_with_one_line(tmp_path):
    runs = {name: _start(tmp_path, name.replace(" ", "_").replace(",", "")) for name in CASES}
    pending, deadline, workers = dict(runs), time.monotonic() + PATIENCE, {}
    seen: dict[str, float] = {}
    while pending and time.monotonic() < deadline:
        for name, process in list(pending.items()):
            condition, after, then = CASES[name][:3]
            if name not in seen and (condition(process) or process.poll() is not None):
                seen[name] = time.monotonic()
            if name in seen and time.monotonic() >= seen[name] + after:
                workers[name] = _children(process)
                then(process)
                del pending[name]
        time.sleep(0.05)
    ended = {}
    for name, process in runs.items():
        _, err = process.communicate(timeout=PATIENCE)
        end = time.monotonic() + PATIENCE
        while any(map(_alive, workers.get(name, []))) and time.monotonic() < end:
            time.sleep(0.1)
        alive = [pid for pid in workers.get(name, []) if _alive(pid)]
        lines = err.strip().splitlines()
        one_line = len(lines) == 1 and lines[0].startswith(CASES[name][4])
        ended[name] = (process.returncode, one_line or err, len(alive))
    assert ended == {name: (case[3], True, 0) for name, case in CASES.items()}
