"""Resumable point runs: a killed run loses nothing finished and recomputes nothing finished."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sim.io.points import PointStore, PointTask, run_points

REPO = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from sim.io.points import PointStore, PointTask, run_points

    LOG = Path(sys.argv[1]) / "computed.log"
    RELEASE = Path(sys.argv[1]) / "release"

    def slow_square(payload):
        time.sleep(0.3)
        while payload["x"] >= 8 and not RELEASE.exists():  # held: the kill lands mid-run
            time.sleep(0.05)
        with open(LOG, "a") as log:  # one line per computation, to count recomputations
            log.write(f"{payload['x']}\\n")
        if payload["x"] == 7:
            raise ValueError("seven is unlucky")
        return {"square": payload["x"] ** 2}

    if __name__ == "__main__":
        tasks = [PointTask(f"x{x:02d}", {"x": x}) for x in range(16)]
        run_points(tasks, slow_square, PointStore(Path(sys.argv[1]) / "points"),
                   backend="local", num_workers=2)
        print("all done")
""")


def _run(tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "sweep_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's planner, not an installed one
    return subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_killed_run_resumes_without_recomputing(tmp_path):
    store = tmp_path / "points"
    first = _run(tmp_path)
    # Points 8 and up are held until `release` exists, so however loaded the machine, the run
    # cannot finish before the kill; the deadline only ends a broken run's wait.
    deadline = time.time() + 600
    while (len(list(store.glob("x*.json"))) < 4 and first.poll() is None
           and time.time() < deadline):
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # no chance to clean up: the hardest interruption
    first.wait()
    finished_before = {p.stem for p in store.glob("x*.json")
                       if json.loads(p.read_text())["status"] == "ok"}
    assert 4 <= len(finished_before) < 16, "the kill must land mid-run"
    computed_before = (tmp_path / "computed.log").read_text().split()

    (tmp_path / "release").touch()
    second = _run(tmp_path)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    computed_after = (tmp_path / "computed.log").read_text().split()[len(computed_before):]
    recomputed = {f"x{int(x):02d}" for x in computed_after} & finished_before
    assert recomputed == set()
    records = {p.stem: json.loads(p.read_text()) for p in store.glob("x*.json")}
    assert sorted(records) == [f"x{x:02d}" for x in range(16)]
    assert records["x07"]["status"] == "error" and "seven is unlucky" in records["x07"]["error"]
    assert all(records[f"x{x:02d}"]["result"] == {"square": x * x} for x in range(16) if x != 7)
    assert not list(store.glob(".*")), "no temporary half-written file may remain"


def _double(payload):
    if payload["x"] < 0:
        raise RuntimeError("negative")
    return {"y": 2 * payload["x"]}


def test_failed_point_is_recorded_and_retried_on_resume(tmp_path):
    store = PointStore(tmp_path)
    tasks = [PointTask("a", {"x": 1}), PointTask("b", {"x": -1}), PointTask("c", {"x": 3})]
    records = run_points(tasks, _double, store, backend="inline")
    assert records["a"]["result"] == {"y": 2} and records["c"]["result"] == {"y": 6}
    assert records["b"]["status"] == "error" and "negative" in records["b"]["error"]
    seen = []
    run_points(tasks, _double, store, backend="inline",
               on_done=lambda task, record: seen.append(task.key))
    assert seen == ["b"]  # finished points are read back, the failed one runs again


def test_unreadable_record_is_recomputed(tmp_path):
    store = PointStore(tmp_path)
    (tmp_path / "a.json").write_text("{half a reco")
    records = run_points([PointTask("a", {"x": 5})], _double, store, backend="inline")
    assert records["a"]["result"] == {"y": 10}
