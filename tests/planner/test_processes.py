"""No worker outlives a killed parent, and SIGINT to the main process alone stops a local run
promptly, keeping every point that finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from planner_helpers import REPO

SCRIPT = """\
import sys
from pathlib import Path
from planner.points import PointStore, PointTask, run_points
from planner_helpers import slow_point

folder = Path(sys.argv[1])
seconds = [float(s) for s in sys.argv[2].split(",")]
tasks = [PointTask(f"t{i}", {"folder": str(folder), "seconds": s}) for i, s in enumerate(seconds)]
try:
    run_points(tasks, slow_point, PointStore(folder / "points"), backend="local", num_workers=2)
except KeyboardInterrupt:
    import threading  # the pool's manager thread must not be left running into the exit hooks
    print("threads left:", [t.name for t in threading.enumerate()])
    sys.exit(130)
"""
SLOW = 120.0
"""Seconds a slow point sleeps: far longer than any wait below."""


def start(tmp_path: Path, seconds: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(Path(__file__).parent)])}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), seconds], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return False


def worker_pids(tmp_path: Path) -> list[int]:
    return [int(p.read_text()) for p in tmp_path.glob("worker-*.pid") if p.read_text()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its new parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_workers_exit_when_the_parent_is_killed(tmp_path):
    parent = start(tmp_path, f"{SLOW},{SLOW}")
    try:
        assert wait_for(lambda: len(worker_pids(tmp_path)) == 2), parent.stderr
        workers = worker_pids(tmp_path)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        assert wait_for(lambda: not any(alive(pid) for pid in workers), timeout=30), workers
    finally:
        for pid in worker_pids(tmp_path):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigint_to_the_parent_alone_stops_promptly_and_keeps_finished_points(tmp_path):
    parent = start(tmp_path, f"0.1,0.1,{SLOW},{SLOW}")
    try:
        assert wait_for(lambda: len(list((tmp_path / "points").glob("t*.json"))) == 2
                        and len(worker_pids(tmp_path)) == 2)
        assert wait_for(lambda: len(set(worker_pids(tmp_path))) >= 2)
        os.kill(parent.pid, signal.SIGINT)  # the parent only, not its process group
        out, err = parent.communicate(timeout=SLOW / 4)  # long before a slow point could end
        assert parent.returncode == 130 and "Traceback" not in err, err
        assert "threads left: ['MainThread']" in out, out
        assert sorted(p.name for p in (tmp_path / "points").glob("t*.json")) == [
            "t0.json", "t1.json"]
        assert wait_for(lambda: not any(alive(pid) for pid in worker_pids(tmp_path)), 30)
    finally:
        parent.kill()
        for pid in worker_pids(tmp_path):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
