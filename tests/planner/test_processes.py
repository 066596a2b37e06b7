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
from sim.io.points import PointStore, PointTask, run_points
from planner_helpers import slow_point
HELD_LIMIT = {held_limit}

folder = Path(sys.argv[1])
def payload(spec):
    if spec == "held":  # runs until the test writes folder/release: it never ends on its own
        return {"folder": str(folder), "seconds": HELD_LIMIT, "until_released": True}
    return {"folder": str(folder), "seconds": float(spec)}

tasks = [PointTask(f"t{i}", payload(s)) for i, s in enumerate(sys.argv[2].split(","))]
try:
    run_points(tasks, slow_point, PointStore(folder / "points"), backend="local", num_workers=2)
except KeyboardInterrupt:
    import threading  # the pool's manager thread must not be left running into the exit hooks
    print("threads left:", [t.name for t in threading.enumerate()])
    sys.exit(130)
"""
HELD_LIMIT = 900.0
"""A held point ends only when released; this bounds it if a test fails to stop its worker."""
PATIENCE = 600.0
"""How long a wait below gives its condition before failing. The waits end as soon as their
condition holds (or the process they watch has ended), so this is not a timing claim: it only
has to exceed what the slowest loaded machine needs, and the points it waits past are held."""


def start(tmp_path: Path, seconds: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(Path(__file__).parent)])}
    script = SCRIPT.replace("{held_limit}", repr(HELD_LIMIT))
    return subprocess.Popen([sys.executable, "-c", script, str(tmp_path), seconds], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout: float = PATIENCE) -> bool:
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


def _stop(parent: subprocess.Popen, tmp_path: Path) -> None:
    parent.kill()
    for pid in worker_pids(tmp_path):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_workers_exit_when_the_parent_is_killed(tmp_path):
    parent = start(tmp_path, "held,held")
    try:
        assert wait_for(lambda: len(worker_pids(tmp_path)) == 2 or parent.poll() is not None)
        workers = worker_pids(tmp_path)
        assert parent.poll() is None and len(workers) == 2, parent.stderr
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=PATIENCE)
        # The held points cannot end, so only the parent's death can end their workers.
        assert wait_for(lambda: not any(alive(pid) for pid in workers)), workers
    finally:
        _stop(parent, tmp_path)


def test_sigint_to_the_parent_alone_stops_promptly_and_keeps_finished_points(tmp_path):
    # Two quick points, then two held ones that never end unless released (never, here): a
    # parent that waited for its running points instead of stopping them would never exit.
    parent = start(tmp_path, "0.1,0.1,held,held")
    try:
        assert wait_for(lambda: parent.poll() is not None or (
            len(list((tmp_path / "points").glob("t*.json"))) == 2
            and len(set(worker_pids(tmp_path))) == 2))
        assert parent.poll() is None, parent.stderr
        os.kill(parent.pid, signal.SIGINT)  # the parent only, not its process group
        out, err = parent.communicate(timeout=PATIENCE)
        assert parent.returncode == 130 and "Traceback" not in err, err
        assert "threads left: ['MainThread']" in out, out
        assert sorted(p.name for p in (tmp_path / "points").glob("t*.json")) == [
            "t0.json", "t1.json"]
        assert wait_for(lambda: not any(alive(pid) for pid in worker_pids(tmp_path)))
    finally:
        _stop(parent, tmp_path)
