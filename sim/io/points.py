"""Run many independent points, locally or on Ray, keeping every finished result on disk.

Each point's result is written atomically the moment it finishes (`<store>/<key>.json`), so a
run killed or interrupted half-way resumes where it stopped: finished points are read back, not
recomputed. A point that raises records its error and the others go on. Results come back as
values through the executor, never by scraping files that workers wrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sim.version
from sim.io.files import write_atomic

log = logging.getLogger("molcap")

PointFn = Callable[..., dict]
"""A top-level (picklable) function: point payload -> JSON-able result; called as
fn(payload, given) for a task that carries a `given` object."""


def content_digest(*parts: Any) -> str:
    """Short hash of what shapes a point's result: its inputs and the model version of the
    code, so that an edit of either gives the point a new key (and a new computation)."""
    data = json.dumps([sim.version.MODEL_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha1(data.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class PointTask:
    """One unit of work: a stable key (its file name) and the payload handed to the function."""

    key: str
    payload: dict
    given: Any = field(default=None, repr=False, compare=False)
    """An object the parent already built from the payload (a resolved scenario), handed to
    the function beside it so a worker need not rebuild it; never stored (None: none)."""


class PointStore:
    """Finished points of one run, one JSON file each."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        """File of point `key`."""
        return self.folder / f"{key}.json"

    def load(self, key: str) -> dict | None:
        """The stored record of `key`, or None when absent, unreadable or of the wrong shape
        (then it reruns; a damaged file is named in a warning)."""
        path = self.path(key)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("%s: unreadable point file (%s); recomputing it", path, err)
            return None
        problem = _shape_problem(record, key)
        if problem:
            log.warning("%s: %s; recomputing it", path, problem)
            return None
        return record

    def save(self, key: str, record: dict) -> None:
        """Write a record atomically (a crash mid-write leaves the old state, never half a file)."""
        write_atomic(self.path(key), json.dumps(record, default=str).encode("utf-8"))


def _shape_problem(record, key: str) -> str | None:
    """Why a stored record (valid JSON) is not a point record, or None."""
    if not isinstance(record, dict):
        return f"a point record is a JSON object, got {type(record).__name__}"
    if record.get("key", key) != key:
        return f"it holds point {record.get('key')!r}"
    status = record.get("status")
    if status == "ok" and not isinstance(record.get("result"), (dict, list)):
        return "status 'ok' without a result object"
    if status == "error" and not isinstance(record.get("error"), str):
        return "status 'error' without an error message"
    if status not in ("ok", "error"):
        return f"status {status!r} is neither 'ok' nor 'error'"
    return None


def progress_counter(total: int, on_progress: Callable[[int, int], None] | None):
    """An `on_done` hook that reports (finished, total) after each point."""
    finished = [0]

    def on_done(task: PointTask, record: dict) -> None:
        finished[0] += 1
        if on_progress is not None:
            on_progress(finished[0], total)

    return on_done


def _guarded(fn: PointFn, payload: dict, given: Any = None) -> dict:
    """Run one point; turn an exception into an error record instead of killing the run."""
    try:
        return {"status": "ok", "result": fn(payload) if given is None else fn(payload, given)}
    except Exception as err:  # noqa: BLE001 - a failing point must not stop the others
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return {"status": "error", "error": last}


def _pending(tasks: Iterable[PointTask], store: PointStore) -> tuple[list[PointTask], dict]:
    done, todo = {}, []
    for task in tasks:
        record = store.load(task.key)
        if record is not None and record.get("status") == "ok":
            done[task.key] = record
        else:
            todo.append(task)  # absent, unreadable or failed before: run (again)
    return todo, done


def run_points(
    tasks: list[PointTask], fn: PointFn, store: PointStore, *, backend: str = "local",
    num_workers: int | None = None, ray_address: str | None = None,
    on_done: Callable[[PointTask, dict], None] | None = None,
) -> dict[str, dict]:
    """Run every task not already finished in `store`; return all records by key."""
    todo, records = _pending(tasks, store)

    def finish(task: PointTask, record: dict) -> None:
        record = {"key": task.key, "payload": task.payload, **record}
        store.save(task.key, record)
        records[task.key] = record
        if on_done is not None:
            on_done(task, record)

    if backend == "ray":
        _run_on_ray(todo, fn, finish, ray_address)
    elif backend == "local":
        _run_local(todo, fn, finish, num_workers)
    elif backend == "inline":
        for task in todo:
            finish(task, _guarded(fn, task.payload, task.given))
    else:
        raise ValueError(f"backend={backend!r}; allowed: 'local', 'ray', 'inline'")
    return {t.key: records[t.key] for t in tasks}


def _worker_start(parent_pid: int) -> None:
    """Initializer of a local worker: Ctrl-C is the parent's to handle (it stops the workers),
    and the worker exits as soon as its parent is gone (killed, it cannot stop them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # first: a Ctrl-C held back since birth is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def exit_with_parent() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=exit_with_parent, name="molcap-parent-watch", daemon=True).start()


@contextmanager
def _ctrl_c_held_back():
    """Start the workers in one piece: a Ctrl-C meanwhile is noted and raised when the block
    ends (cut off between a fork and its bookkeeping, a worker would never be stopped). SIGINT
    is also blocked in this thread, so the workers it forks inherit the mask and a Ctrl-C to
    the process group cannot end one before its initializer ignores it (a traceback)."""
    in_main = threading.current_thread() is threading.main_thread()  # where handlers live
    previous = signal.getsignal(signal.SIGINT) if in_main else None
    noted: list[int] = []
    if callable(previous):
        signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if callable(previous):
            signal.signal(signal.SIGINT, previous)
            if noted:
                previous(signal.SIGINT, None)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop now: drop queued points and end running ones (their results are not wanted)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() drops its handle
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
    if manager is not None:
        # It sees the workers gone and closes the pool's pipes. Joined now, not left running
        # into the interpreter's exit hook, which pokes one of those pipes without a lock
        # (a traceback: "OSError: Bad file descriptor" in concurrent.futures._python_exit).
        manager.join(timeout=10)


def _run_local(todo: list[PointTask], fn: PointFn, finish, num_workers: int | None) -> None:
    if not todo:
        return
    workers = max(1, min(num_workers or os.cpu_count() or 1, len(todo)))
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_start,
                               initargs=(os.getpid(),))
    try:
        with _ctrl_c_held_back():  # the workers start here
            futures = {pool.submit(_guarded, fn, t.payload, t.given): t for t in todo}
        # as_completed, not a wait() loop: waiting on every pending future after each finish
        # costs the parent O(points^2), serial time that caps the speed-up of a big sweep.
        for future in as_completed(futures):
            finish(futures[future], future.result())
    except BaseException:
        _stop_workers(pool)  # Ctrl-C or a failed write: what finished is already on disk
        raise
    pool.shutdown(wait=True)


def _run_on_ray(todo: list[PointTask], fn: PointFn, finish, address: str | None) -> None:
    import ray  # the `dist` extra; imported only when asked for

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    try:
        remote = ray.remote(_guarded)
        pending: dict[Any, PointTask] = {remote.remote(fn, t.payload, t.given): t
                                         for t in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                finish(pending.pop(ref), ray.get(ref))
    finally:
        if started_here and address is None:
            ray.shutdown()
