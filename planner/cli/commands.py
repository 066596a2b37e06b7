"""The `molcap` command line: thin Typer commands over planner functions."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.text import Text

from planner.cli import interrupt
from planner.scenario.loading import ScenarioError, load_scenario
from planner.scenario.schema import Scenario
from planner.scenario.workloads import OFFLINE_NOTE, is_offline


class _Program(typer.Typer):
    """The `molcap` program: Ctrl-C, wherever it arrives, ends it with one line and exit 130
    (see planner.cli.interrupt); what finished is kept, and `finally` clean-ups have run."""

    def __call__(self, *args, **kwargs):
        interrupt.interrupt_on_ctrl_c()
        try:
            return super().__call__(*args, **kwargs)
        except interrupt.Interrupted:
            interrupt.ignore_ctrl_c()
            # Not through rich: a display cut off while starting may still hold sys.stderr.
            sys.__stderr__.write(interrupt.MESSAGE + "\n")
            sys.exit(interrupt.INTERRUPTED_EXIT)
        finally:
            interrupt.ignore_ctrl_c()  # done: nothing left to interrupt in the exit hooks


app = _Program(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan GPU capacity for serving many LoRA adapters on one base model.")
# No markup or emoji codes: user values ("[/x]", ":x:") must print as typed, never crash.
console = Console(soft_wrap=True, highlight=False, emoji=False, markup=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False, markup=False)

BAD_INPUT_EXIT = 2
FAILED_POINTS_EXIT = 1
"""Some points raised: the others finished and were written, but the run is not a success."""


def _exit_if_points_failed(failed: int, total: int, reports: list[Path]) -> None:
    """The last line of a run or sweep with failed points, then a non-zero exit."""
    if failed:
        shown = ", ".join(str(r) for r in reports)
        errors.print(f"{failed} of {total} points failed: why is above and in the report's "
                     f"'Failed points' section ({shown}); run the same command again to retry "
                     "them", markup=False)
        raise typer.Exit(FAILED_POINTS_EXIT)


def _fail(messages: list[str]) -> None:
    for message in messages:
        errors.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(BAD_INPUT_EXIT)


@app.command()
def schema(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write here, not stdout.")] = None,
):
    """Write the scenario JSON Schema (for editor completion of YAML files)."""
    text = json.dumps(Scenario.model_json_schema(), indent=2)
    if out is None:
        sys.stdout.write(text + "\n")
    else:
        out.write_text(text + "\n", encoding="utf-8")
        console.print(f"wrote {out}")


@app.command()
def validate(files: Annotated[list[Path], typer.Argument(help="Scenario YAML files.")]):
    """Check scenario files; print every problem with its file, line and field."""
    problems: list[str] = []
    for path in files:
        try:
            scenario = load_scenario(path)
            console.print(f"ok {path}")
            if is_offline(scenario.workload):
                console.print(f"  {OFFLINE_NOTE}")
        except ScenarioError as err:
            problems += err.messages
    if problems:
        _fail(problems)


@app.command()
def run(
    files: Annotated[list[Path], typer.Argument(help="Scenario YAML files.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output root folder.")] = Path("out"),
    backend: Annotated[str, typer.Option(help="local (processes), ray, or inline.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address.")] = None,
    workers: Annotated[int | None, typer.Option(help="Local worker processes.")] = None,
):
    """Plan capacity, simulate and compare every strategy of each scenario; write a report.

    Finished points are kept under OUT/<name>/points: rerun the same command to resume.
    """
    from planner.jobs.run import run_scenario_file

    _check_backend(backend)
    problems: list[str] = []
    failed, total, reports = 0, 0, []
    try:
        with Progress(console=console, transient=True) as progress:
            for path in files:
                task = progress.add_task(f"{path.name}", total=None)
                try:
                    result = run_scenario_file(
                        path, out, backend=backend, num_workers=workers, ray_address=address,
                        on_progress=lambda done, total, t=task: progress.update(
                            t, completed=done, total=total))
                except ScenarioError as err:
                    problems += err.messages
                    continue
                _print_plan(result)
                failed, total = failed + len(result.errors), total + result.num_points
                if result.errors:
                    reports.append(result.report_path)
    except BrokenProcessPool as err:
        _worker_died(err)
    except OSError as err:
        _cannot_write(err)
    if problems:
        _fail(problems)
    _exit_if_points_failed(failed, total, reports)


def _print_plan(result) -> None:
    plans = result.plans
    console.print(Text.assemble((result.scenario.name, "bold"), ": capacity plan"))
    for note in result.notes:
        console.print(f"  {note}", markup=False)
    from planner.predict.intervals import DEFAULT_CONFIDENCE, plan_row_text, pricing_errors

    confidence = result.scenario.search.confidence or DEFAULT_CONFIDENCE
    for row in plans.to_dict(orient="records"):
        if row.get("is_feasible"):
            console.print(
                f"  {row['strategy']:<22} {row['num_gpus']:>4} x {row['gpu']:<9} "
                f"(TP={row['tensor_parallel_size']}, {row['num_replicas']} replicas)  "
                f"{row['cost_per_hour_usd']:8.2f} USD/h  "
                f"{row['cost_per_million_tokens_usd']:8.3f} USD/M tokens")
            console.print("      " + plan_row_text(
                row, pricing_errors(result.resolved, row["gpu"]), confidence))
        else:
            console.print(f"  {row['strategy']:<22} infeasible: {row.get('reason')}")
    for key, message in result.errors.items():
        errors.print(f"point {key} failed: {message}", markup=False)
    from planner.outputs.plan_table import chosen_gpu_pricing
    from planner.scenario.accuracy_notes import accuracy_notes
    from planner.scenario.resolved import gpu_pricing_source

    # One line per GPU kind the plans chose; none chosen: the scenario's own GPU.
    own = result.scenario.hardware.gpu_spec.name
    pricing = (chosen_gpu_pricing(result.resolved, plans)
               or {own: gpu_pricing_source(result.resolved, own)})
    for gpu, source in pricing.items():
        console.print(f"  {gpu} priced by {source}", markup=False)
    for label, note in accuracy_notes(result.scenario).items():
        console.print(f"  {label} {note}", markup=False)
    console.print(f"report: {result.report_path}")
    console.print(f"tables: {result.table_paths[0].parent} (parquet and CSV)")


def _check_backend(backend: str) -> None:
    if backend not in ("local", "ray", "inline"):
        _fail([f"--backend: {backend!r} is not allowed; allowed: local, ray, inline"])
    if backend == "ray":
        try:
            import ray  # noqa: F401 - only whether it imports
        except ImportError as err:
            _fail([f"--backend ray: Ray cannot be imported ({err}); install the dist extra: "
                   "pip install -e '.[dist]', or use --backend local"])


def _worker_died(err: BrokenProcessPool) -> None:
    """A local worker process ended abruptly (killed, out of memory): one line, exit 1."""
    errors.print(f"a local worker process died ({err}); finished points are kept; run the "
                 "same command to resume", markup=False)
    raise typer.Exit(FAILED_POINTS_EXIT)


def _cannot_write(err: OSError) -> None:
    """A disk error while writing results: one line, exit 2 (what was written is kept)."""
    where = err.filename or "the output folder"
    _fail([f"{where}: cannot write: {err.strerror or err}; points written before it are kept"])


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="Sweep spec YAML.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output root folder.")] = Path("out"),
    backend: Annotated[str, typer.Option(help="local (processes), ray, or inline.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address.")] = None,
    workers: Annotated[int | None, typer.Option(help="Local worker processes.")] = None,
):
    """Run (or resume) a sweep: every point of the grid, a tidy table and a report."""
    from planner.jobs.sweep import run_sweep

    _check_backend(backend)
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("points", total=None)
            result = run_sweep(spec, out, backend=backend, num_workers=workers,
                               ray_address=address,
                               on_progress=lambda done, total: progress.update(
                                   task, completed=done, total=total))
    except ScenarioError as err:
        _fail(err.messages)
    except BrokenProcessPool as err:
        _worker_died(err)
    except OSError as err:
        _cannot_write(err)
    console.print(f"{len(result.table)} rows, {len(result.errors)} failed points")
    for key, message in result.errors.items():
        errors.print(f"point {key} failed: {message}", markup=False)
    console.print(f"report: {result.report_path}")
    if result.table_paths:
        console.print(f"table: {result.table_paths[0]} (and .csv)")
    _exit_if_points_failed(len(result.errors), result.num_points, [result.report_path])


@app.command("app")
def dashboard(
    port: Annotated[int, typer.Option(help="Local port to serve on.")] = 8501,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "localhost",
    out: Annotated[Path, typer.Option("--out", "-o", help="Output root (runs and points).")] = Path(
        "out"),
):
    """Start the what-if dashboard on a local port (Streamlit, the `app` extra)."""
    if importlib.util.find_spec("streamlit") is None:  # found, not imported: planner stays light
        _fail(["molcap app: streamlit is not installed; install the app extra: "
               "pip install -e '.[app]' (or make app)"])
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MOLCAP_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "streamlit", "run", str(root / "app" / "main.py"),
               "--server.port", str(port), "--server.address", address,
               "--server.headless", "true", "--browser.gatherUsageStats", "false",
               "--client.showSidebarNavigation", "false", "--client.toolbarMode", "minimal",
               "--theme.base", "light"]
    console.print(f"molcap dashboard on http://{address}:{port} (Ctrl-C stops it)")
    raise typer.Exit(_run_child(command, env))


def _run_child(command: list[str], env: dict) -> int:
    """Run `command` until it exits; a SIGTERM or Ctrl-C sent to molcap stops it too (a child
    left behind would keep the port)."""
    child = subprocess.Popen(command, env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        return child.wait()
    except (KeyboardInterrupt, interrupt.Interrupted):
        child.terminate()
        child.wait(timeout=30)
        return interrupt.INTERRUPTED_EXIT
    finally:
        signal.signal(signal.SIGTERM, previous)
