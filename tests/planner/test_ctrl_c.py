"""Ctrl-C to `molcap run`'s process group ends it with one line on stderr and exit 130, no
traceback, whenever it arrives (README "The CLI"): here while the CLI's imports load, while
the command starts, as the local worker starts and while its first point runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from test_capacity import SMALL

ROOT = Path(__file__).resolve().parents[2]


def _ctrl_c_default() -> None:
    """A test run from a background job starts with SIGINT ignored, and children inherit that:
    the Ctrl-C sent below would then test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, name: str) -> subprocess.Popen:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    return subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "run", str(scenario), "--out",
         str(tmp_path / name), "--workers", "1"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_ctrl_c_default)


def _importing_the_cli(process: subprocess.Popen) -> bool:
    """pydantic's compiled core is mapped: the CLI module's imports are under way."""
    try:
        return "_pydantic_core" in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


def _has_worker(process: subprocess.Popen) -> bool:
    try:
        return bool(psutil.Process(process.pid).children())
    except psutil.NoSuchProcess:
        return False


PHASES = {  # name: (what to wait for, seconds after it)
    "cli imports": (_importing_the_cli, 0.0),
    "command start": (_importing_the_cli, 0.6),
    "worker start": (_has_worker, 0.0),
    "first point": (_has_worker, 0.6),
}


def test_ctrl_c_in_every_phase_gives_one_line_and_exit_130(tmp_path):
    runs = {name: _start(tmp_path, name.replace(" ", "_")) for name in PHASES}
    pending, deadline, workers = dict(runs), time.monotonic() + 240, {}
    seen: dict[str, float] = {}
    while pending and time.monotonic() < deadline:
        for name, process in list(pending.items()):
            condition, after = PHASES[name]
            if name not in seen and (condition(process) or process.poll() is not None):
                seen[name] = time.monotonic()
            if name in seen and time.monotonic() >= seen[name] + after:
                workers[name] = psutil.Process(process.pid).children() if _has_worker(
                    process) else []
                with contextlib.suppress(ProcessLookupError):  # ended early: asserted below
                    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
                del pending[name]
        time.sleep(0.01)
    ended = {}
    for name, process in runs.items():
        _, err = process.communicate(timeout=120)
        gone, alive = psutil.wait_procs(workers.get(name, []), timeout=30)
        lines = err.strip().splitlines()
        one_line = len(lines) == 1 and lines[0].startswith("interrupted") and "resume" in lines[0]
        ended[name] = (process.returncode, one_line or err, len(alive))
    assert ended == {name: (130, True, 0) for name in PHASES}  # exit, stderr, workers left
