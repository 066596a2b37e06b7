"""The `molcap` command line: thin Typer commands over planner functions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from planner.loading import ScenarioError, load_scenario
from planner.scenario import Scenario

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan GPU capacity for serving many LoRA adapters on one base model.")
console = Console(soft_wrap=True, highlight=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False)

BAD_INPUT_EXIT = 2


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
            load_scenario(path)
            console.print(f"ok {path}")
        except ScenarioError as err:
            problems += err.messages
    if problems:
        _fail(problems)


@app.command()
def run(
    files: Annotated[list[Path], typer.Argument(help="Scenario YAML files.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for reports, tables.")] = Path(
        "out"),
):
    """Compare every strategy of each scenario; write an HTML report and tidy tables."""
    from planner.run import run_scenario_file

    problems: list[str] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("scenarios", total=len(files))
        for path in files:
            try:
                result = run_scenario_file(path, out)
            except ScenarioError as err:
                problems += err.messages
            else:
                console.print(f"report: {result.report_path}")
                console.print(f"tables: {result.table_paths[0].parent} (parquet and CSV)")
            progress.advance(task)
    if problems:
        _fail(problems)


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="Sweep spec YAML.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output root folder.")] = Path("out"),
    backend: Annotated[str, typer.Option(help="local (processes), ray, or inline.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address.")] = None,
    workers: Annotated[int | None, typer.Option(help="Local worker processes.")] = None,
):
    """Run (or resume) a sweep: every point of the grid, a tidy table and a report."""
    from planner.sweep_run import run_sweep

    if backend not in ("local", "ray", "inline"):
        _fail([f"--backend: {backend!r} is not allowed; allowed: local, ray, inline"])
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("points", total=None)
            result = run_sweep(spec, out, backend=backend, num_workers=workers,
                               ray_address=address,
                               on_progress=lambda done, total: progress.update(
                                   task, completed=done, total=total))
    except ScenarioError as err:
        _fail(err.messages)
    except KeyboardInterrupt:
        errors.print("interrupted: finished points are kept; run the same command to resume")
        raise typer.Exit(130) from None
    console.print(f"{len(result.table)} rows, {len(result.errors)} failed points")
    for key, message in result.errors.items():
        errors.print(f"point {key} failed: {message}", markup=False)
    console.print(f"report: {result.report_path}")
    if result.table_paths:
        console.print(f"table: {result.table_paths[0]} (and .csv)")


if __name__ == "__main__":
    app()
