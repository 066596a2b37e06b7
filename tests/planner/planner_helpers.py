"""Small scenarios and helpers shared by the planner hardening tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TINY = """\
name: tiny
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB}
strategies:
  - kind: base
  - kind: multi_lora
    adapters: [{name: chat, rank: 8}, {name: code, rank: 8}]
workload: {kind: punica, num_requests: 20, num_adapters: 2, num_output_tokens: 8,
           arrival_rate_per_s: 2}
search: {num_seeds: 1, max_turns_per_evaluation: 20}
analysis: {context_tokens: [512], adapters_visited: [1], decode_tokens_per_turn: [16],
           decision_every_tokens: [32], distinct_adapters: [1], decode_batch_size: 4}
"""
"""Two strategies on a small model: a whole `molcap run` takes a few seconds."""


def write_tiny(folder: Path, name: str = "tiny", text: str = TINY) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def molcap(*args: str, cwd: Path, timeout: float = 300, path_first: Path | None = None,
           **kwargs) -> subprocess.CompletedProcess:
    """The CLI in a subprocess (this checkout's code), output captured as text; `path_first`
    goes on PYTHONPATH before the checkout (to shadow a package)."""
    pythonpath = os.pathsep.join(str(p) for p in (path_first, REPO) if p is not None)
    env = {**os.environ, "PYTHONPATH": pythonpath, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def slow_point(payload: dict) -> dict:
    """A point that records its worker's pid, then takes `seconds`; with `until_released`, it
    holds until the file `release` appears in its folder instead (for process tests: a point
    that cannot end on its own, so a wait on it is a condition, not a race against a clock).
    `seconds` then only bounds a leak if a test forgets to stop its workers."""
    import time

    folder = Path(payload["folder"])
    (folder / f"worker-{os.getpid()}.pid").write_text(str(os.getpid()), encoding="utf-8")
    end = time.monotonic() + payload["seconds"]
    if payload.get("until_released"):
        while not (folder / "release").exists() and time.monotonic() < end:
            time.sleep(0.05)
    else:
        time.sleep(payload["seconds"])
    return {"slept": payload["seconds"]}
