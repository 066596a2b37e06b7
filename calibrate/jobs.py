"""The three calibration jobs the CLI, the Slurm script and the Ray job run: profile, fit, validate.

profile: time the probe grid on each engine (samples in OUT/samples, one JSON per probe, so an
interrupted run resumes); fit: least squares over those samples into a profile YAML; validate:
replay the validation workloads on the engine and in the simulator under a profile and write
the error table (markdown + JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

from calibrate.commands import (
    MEASURE_COMMAND_FILE,
    current_command,
    measure_command,
    recorded_measure_command,
)
from calibrate.fitter import (
    DEFAULT_TERMS,
    DIREFT_TERMS,
    LORA_TERMS,
    create_calibration_profile,
    fit_adapter_loads,
    group_profiles,
    thin_decode_steps,
    write_profile,
)
from calibrate.fitter import (
    fit as fit_samples,
)
from calibrate.recorder import load_adapter_loads, load_average, load_samples, split_held_out
from calibrate.runner import (
    ADAPTER_COUNTS,
    TARGETS,
    VllmEngineSpec,
    engine_name,
    profile_vllm,
)
from calibrate.verify_samples import verify_samples

VLLM_GROUPS = ("base", "lora", "lora_p", "direft_p", "lora_r16", "lora_r32")


RANK_GRID = (16, 32)
"""max_lora_rank values profiled on their own engines beside rank 8 (LoRA only, fewer probes
and one repeat: the rank changes the adapter terms' shapes, not the scheduler)."""


def measure(out: Path, *, engine: str = "all", device: str = "cpu", gpu_kind: str = "cpu",
            num_repeats: int = 3, quick: bool = False, on_progress=None) -> Path:
    """Run the probe grids of `engine` ("vllm", "ced", "all"); returns the samples folder."""
    out = Path(out)
    samples = out / "samples"
    out.mkdir(parents=True, exist_ok=True)
    (out / MEASURE_COMMAND_FILE).write_text(measure_command(
        out, engine=engine, device=device, gpu_kind=gpu_kind, num_repeats=num_repeats,
        quick=quick) + "\n")
    hook = on_progress or (lambda label: None)
    if engine in ("vllm", "all"):
        runs = [(VllmEngineSpec(enable_lora=False, device=device, gpu_kind=gpu_kind),
                 ("base",), ADAPTER_COUNTS),
                (VllmEngineSpec(device=device, gpu_kind=gpu_kind),
                 ("lora", "lora_p", "direft_p"), ADAPTER_COUNTS)]
        runs += [(VllmEngineSpec(device=device, gpu_kind=gpu_kind, max_lora_rank=rank),
                  ("lora",), (1, 8, 32)) for rank in (() if quick else RANK_GRID)]
        for spec, kinds, counts in runs:
            repeats = num_repeats if spec.max_lora_rank == 8 else 1
            profile_vllm(out / "work", samples, spec, kinds=kinds, num_repeats=repeats,
                         quick=quick, adapter_counts=counts,
                         on_progress=hook(f"{engine_name(spec)} " + "+".join(kinds)))
    if engine in ("ced", "all"):
        from calibrate.ced_runner import profile_ced

        profile_ced(samples, num_repeats=num_repeats, quick=quick, on_progress=hook("ced engine"))
    return samples


def _meta(root: Path, name: str) -> dict:
    path = root / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no engine record; run `molcap calibrate measure` "
                                f"with --out {root} first")
    return json.loads(path.read_text())


def fit(root: Path, *, name: str, out_dir: Path, engine: str = "vllm",
        add_verify: tuple[Path, ...] = ()):
    """Fit the samples under `root` (vLLM or CED) into OUT_DIR/NAME.yaml, with the timed steps
    of the verify runs `add_verify` (`molcap verify --out RUN`) joining them; (path, profile)."""
    if add_verify and engine == "ced":
        raise ValueError("--add-verify: verify runs are vLLM steps; fit them with --engine vllm")
    if engine == "ced":
        from calibrate.ced_runner import fit_ced

        return fit_ced(Path(root), name=name, out_dir=Path(out_dir))
    from sim.cost.cost_model import CostCoeffs
    from sim.hardware.catalogue import get_gpu, get_model

    root = Path(root)
    meta = _meta(root, "vllm-lora")
    samples = [s for s in load_samples(root / "samples") if s.group in VLLM_GROUPS]
    if not samples:
        raise ValueError(f"{root / 'samples'}: no vLLM samples")
    gpu = get_gpu(meta["hardware"]["gpu"])
    settings = meta["engine"]["settings"]
    profiles = group_profiles(get_model("vllm-tiny-llama"), gpu,
                              adapter_rank=settings["max_lora_rank"],
                              adapter_placements=[(i, m) for i in range(4) for m in TARGETS])
    for run in add_verify:
        extra, extra_profiles = verify_samples(Path(run), gpu.name)
        samples, profiles = samples + extra, {**profiles, **extra_profiles}
    train, test = split_held_out(samples)
    load_coeffs, load_summary = fit_adapter_loads(load_adapter_loads(root / "samples"), gpu)
    # From the plain defaults, not the shipped profile: the solver scales each term by its
    # start, so a term an earlier fit left at ~1e-11 could hardly move again.
    start = CostCoeffs().model_copy(update=load_coeffs)
    terms = DEFAULT_TERMS + LORA_TERMS
    terms += DIREFT_TERMS if any(s.group == "direft_p" for s in samples) else ()
    result = fit_samples(thin_decode_steps(train), terms, profiles, start=start, held_out=test)
    profile_ = create_calibration_profile(
        result, name=name, model="vllm-tiny-llama", engine=meta["engine"],
        hardware=meta["hardware"], packages=meta["packages"], num_samples=len(samples),
        load_average=meta["load_average"], adapter_loads=load_summary,
        commands=(recorded_measure_command(root), current_command()),
        description="vLLM step times of the tiny float32 Llama (4 layers, hidden 256): base, "
                    "LoRA/LoRA_P on q/v/o/down at max_lora_rank 8 (LoRA also 16, 32), DiReFT_P "
                    "on every layer; adapter slot loads; the engine thread's CPU seconds")
    path = Path(out_dir) / f"{name}.yaml"
    write_profile(profile_, path)
    return path, profile_


def validate(profile_, out: Path, *, num_repeats: int = 3, num_requests: int = 48,
             clock: str = "cpu", quick: bool = False, on_progress=None,
             command: str | None = None) -> Path:
    """Measure and predict the validation workloads under `profile_`; returns the table path."""
    from calibrate.validation_run import run_validation

    return run_validation(profile_, Path(out), num_repeats=num_repeats,
                          num_requests=num_requests, clock=clock, quick=quick,
                          on_progress=on_progress or (lambda label: None),
                          command=command or current_command(), load_at_start=load_average())


def calibrate_kind(kind: str, device: str, engine: str, out: str, repeats: int,
                   quick: bool) -> tuple[str, str]:
    """Profile and fit one GPU kind on this machine (a cluster job's task); (name, YAML)."""
    root = Path(out) / kind
    measure(root, engine=engine, device=device, gpu_kind=kind, num_repeats=repeats, quick=quick)
    model = "ced-small" if engine == "ced" else "tiny-llama"
    name = f"{kind.lower()}-{engine}-{model}"
    path, _ = fit(root, name=name, out_dir=root / "profiles", engine=engine)
    return name, path.read_text()
