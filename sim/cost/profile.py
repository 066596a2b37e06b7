"""A fitted cost profile: coefficients measured on one engine, model and machine, with their error.

`calibrate/` writes these as YAML (one file per engine x model x GPU kind, in
`calibrate/profiles/`); the planner reads them (`load_profile`) and prices a
scenario that names one (`hardware.profile`). The coefficients are a `CostCoeffs`, so their
ranges are checked where they are defined; unknown keys anywhere are errors.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from sim.cost.cost_model import CostCoeffs
from sim.io.yaml_input import ScenarioError, model_from_text


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class EngineInfo(_Frozen):
    """The engine the samples came from."""

    name: str = Field(min_length=1)
    """"vllm" or "molcap-ced" (the torch CED engine)."""
    version: str = Field(min_length=1)
    """Engine version (vLLM's __version__; molcap's for the CED engine)."""
    settings: dict[str, int | float | bool | str] = Field(default_factory=dict)
    """Engine limits the profile was measured under (max_num_seqs, max_loras, ...)."""


class HardwareInfo(_Frozen):
    """Where the samples were measured."""

    gpu: str = Field(min_length=1)
    """Catalogue GPU kind the coefficients are relative to ("cpu" for a CPU engine)."""
    fingerprint: dict[str, int | float | str] = Field(default_factory=dict)
    """Processor, core count, platform, GPU name as the machine reported them."""


class FitErrorRow(_Frozen):
    """Fit error of one sample group on one split."""

    split: str
    """"train" (fitting samples) or "test" (held-out probes)."""
    group: str
    """Sample group ("base", "lora", "lora_p", "ced_decode", ..., "all")."""
    num_samples: int = Field(ge=0)
    """Steps scored."""
    mape: float = Field(ge=0)
    """Mean absolute percentage error, as a fraction."""
    median_ape: float = Field(ge=0)
    """Median absolute percentage error, as a fraction."""
    r2: float = Field(le=1)
    """Coefficient of determination of the step times."""


class RunFitRecord(_Frozen):
    """What a run-level fit (simulation in the loop, `calibrate.gpu_run_fit`) saw: the serving
    runs it replayed and the coefficients it moved. A validation of the profile leaves these
    runs out (`calibrate.gpu_validate`)."""

    dataset: str = Field(min_length=1)
    """Dataset and its commit ("agullo-dt@bae36e2d")."""
    group: str = Field(min_length=1)
    """Run group the runs were taken from ("ml_modelling/test_dataset")."""
    rule: str = Field(min_length=1)
    """How the runs were chosen, in words a reader can repeat."""
    run_ids: tuple[str, ...] = Field(min_length=1)
    """Every run fitted on."""
    engine_version: str = Field(min_length=1)
    """Engine version of the runs."""
    commit: str = Field(min_length=1)
    """Commit of the code that ran the fit ("unknown" outside a git checkout)."""
    targets: str = Field(min_length=1)
    """Which metrics of which runs were residuals."""
    window_s: float = Field(gt=0)
    """Simulated window per run."""
    warmup_s: float = Field(ge=0)
    """Warm-up left out of each run's scores."""
    start: dict[str, float]
    """Unknowns at the start (the step-fitted values)."""
    fitted: dict[str, float]
    """Unknowns as fitted; the profile's coefficients carry these."""
    rms_log_error_start: float = Field(ge=0)
    """Root mean square of log(simulated / measured) over the residuals at the start."""
    rms_log_error: float = Field(ge=0)
    """The same at the fitted values."""
    num_simulations: int = Field(ge=0)
    """Runs simulated in the fit (all trial points)."""
    wall_s: float = Field(ge=0)
    """Wall time of the fit."""
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Machine load (1, 5, 15 min) at the end of the fit."""


class FitSummary(_Frozen):
    """How well the fitted coefficients explain the measured steps."""

    fitted_terms: tuple[str, ...]
    """Coefficients that were fitted (the rest kept their assumed values)."""
    stderr: dict[str, float] = Field(default_factory=dict)
    """Standard error of each fitted coefficient."""
    errors: tuple[FitErrorRow, ...] = ()
    """Per split and group."""
    term_shares: dict[str, float] = Field(default_factory=dict)
    """Mean share of predicted step time per cost term."""
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Machine load (1, 5, 15 min) when the samples were taken."""
    adapter_loads: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Measured adapter loads per kind ("load": files into the CPU cache, "activate": into a
    device slot): count, median seconds and bytes, and the slot-load fit's MAPE."""
    run_fit: RunFitRecord | None = None
    """The run-level fit applied on top of the step fit, if any."""


class CalibrationProfile(_Frozen):
    """One fitted profile file."""

    name: str = Field(min_length=1)
    """Profile name (the file stem)."""
    description: str = ""
    """Free text."""
    model: str = Field(min_length=1)
    """Catalogue model the samples were measured on."""
    engine: EngineInfo
    """Engine and its settings."""
    hardware: HardwareInfo
    """GPU kind and machine fingerprint."""
    packages: dict[str, str] = Field(default_factory=dict)
    """Versions of the packages that shape the timings (torch, vllm, molcap)."""
    created_utc: str = Field(min_length=1)
    """When the fit ran (ISO 8601)."""
    coefficients: CostCoeffs
    """The fitted (and kept) coefficients."""
    fit: FitSummary
    """Fit error."""
    commands: tuple[str, ...] = ()
    """Commands that produced the samples and the fit."""
    num_samples: Annotated[int, Field(ge=0)] = 0
    """Samples measured."""
    derivation: str = ""
    """How the coefficients were carried over from another GPU's fit ("scaled from H100
    measurements: ..."); empty for a profile fitted on its own GPU's measurements."""


PROFILES_DIR = Path(__file__).resolve().parents[2] / "calibrate" / "profiles"
"""Shipped fitted profiles."""


def profile_path(ref: str, base_dir: Path | None = None) -> Path:
    """File of a profile reference: a name in PROFILES_DIR, or a path (relative to
    `base_dir`, then the working directory)."""
    if "/" not in ref and not ref.endswith((".yaml", ".yml")):
        return PROFILES_DIR / f"{ref}.yaml"
    path = Path(ref)
    if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
        return base_dir / path
    return path


@lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int) -> CalibrationProfile:
    text = Path(path).read_text(encoding="utf-8")
    return model_from_text(CalibrationProfile, text, path, what="a cost profile")


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read and validate a profile file; ScenarioError with FILE:LINE: field messages."""
    path = Path(path)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as err:
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
        raise ScenarioError([f"{path}: cannot read cost profile: {err.strerror}; shipped "
                             f"profiles: {known}"]) from None
    return _load_cached(str(path), mtime)
