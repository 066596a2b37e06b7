"""Resolve one strategy of a scenario into what the cost model needs: model, GPU, profile, and
the coefficients that price it (a fitted profile file, or the assumed defaults).

Fitted profiles live in `calibrate/profiles/<name>.yaml` (written by `molcap calibrate fit`).
A scenario names one in `hardware.profile`; without one, a GPU kind with a shipped profile
(`DEFAULT_PROFILES`) uses it and every other kind the assumed `sim.cost.cost_model` defaults.
`planner.scenario.resolved` calls `resolve_pricing` once per scenario, at load; everything else
reads the resolved object.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from planner.scenario.schema import Scenario
from sim.cost.cost_model import CostCoeffs, default_coeffs
from sim.cost.layer_costs import LayerCosts
from sim.cost.profile import PROFILES_DIR, CalibrationProfile, load_profile, profile_path
from sim.hardware.specs import GpuSpec, ModelArch
from sim.io.yaml_input import ScenarioError, parse_yaml
from sim.strategies.placement import KvLayout, adapter_placements
from sim.strategies.registry import get_strategy


@dataclass(frozen=True)
class StrategyCosting:
    """A strategy resolved for costing: its model, GPU, TP, profile and coefficients."""

    label: str
    kind: str
    arch: ModelArch
    gpu: GpuSpec
    tensor_parallel_size: int
    profile: LayerCosts
    coeffs: CostCoeffs
    replay_window_tokens: int
    """Bounded replay length (the strategy's override, else the model's window; 0 if none)."""
    kv_layout: KvLayout
    """What the adapters' placement implies for KV (`sim.strategies.placement.kv_layout`)."""

    @property
    def first_decoder_layer(self) -> int:
        """First layer a bounded replay recomputes (0 on a decoder-only model)."""
        return self.arch.ced.num_encoder_layers if self.arch.ced else 0


@dataclass(frozen=True)
class AdapterPricing:
    """How a strategy's adapters are priced: one rule for the analysis and the simulation."""

    kind: Literal["lora", "direft", "none"]
    rank: int
    """Rank a step's adapter compute is priced at."""
    placements: tuple[tuple[int, str], ...]
    """(layer, module) pairs a step's adapter work covers: the union over the adapters."""
    each: tuple[tuple[tuple[int, str], ...], ...]
    """Each adapter's own placements (what the KV layout follows from)."""


def adapter_pricing(strategy, arch: ModelArch, max_lora_rank: int) -> AdapterPricing:
    """The adapter shape a strategy's steps are priced with, as vLLM runs it: every LoRA slot
    is padded to `max_lora_rank` (vLLM allocates its LoRA buffers at that rank), and a batch
    runs the union of the modules its adapters wrap. A DiReFT edit (the strategy's
    `adapter_pricing_kind` says which) is applied
    at its adapter's own rank, so the largest one prices it."""
    adapters = getattr(strategy, "adapters", ())
    kind = get_strategy(strategy.kind).adapter_pricing_kind(strategy)
    if kind == "none" or not adapters:
        return AdapterPricing("none", 0, (), ())
    each = tuple(tuple(adapter_placements(arch, a.layers, a.target_modules)) for a in adapters)
    placements = tuple(sorted(set().union(*each)))
    if kind == "direft":
        return AdapterPricing("direft", max(a.rank for a in adapters), placements, each)
    return AdapterPricing("lora", max_lora_rank, placements, each)


DEFAULT_PROFILES = {
    "cpu": "cpu-vllm-tiny-llama",
    "H100-64GB": "h100-64gb-vllm085-llama-3.1-8b",
    "H100-SXM": "h100-sxm-vidur-dense", "A100-80GB": "a100-80gb-vidur-dense",  # gpu_vidur_fit.py
    # Derived from the H100-64GB fit (calibrate/gpu_scaled.py): "scaled from H100 measurements".
    "H200": "h200-scaled-from-h100-64gb",
    "H20": "h20-scaled-from-h100-64gb",
}
"""GPU kind -> shipped profile used when a scenario names none."""


@dataclass(frozen=True)
class PricingSource:
    """What priced one strategy's steps."""

    coeffs: CostCoeffs
    profile: CalibrationProfile | None
    """The fitted profile, or None for assumed defaults."""
    path: Path | None
    is_default: bool
    """True when the scenario named no profile (a shipped default, or assumed coefficients)."""

    def describe(self) -> str:
        """One line for reports: which profile, measured where, with what error."""
        if self.profile is None:
            return "assumed coefficients (sim.cost.coeffs.DEFAULT_COEFFS; no fitted profile)"
        p = self.profile
        test = [r for r in p.fit.errors if r.split == "test" and r.group == "all"]
        error = f", held-out step MAPE {test[0].mape:.1%}" if test else ""
        how = "shipped default for " + p.hardware.gpu if self.is_default else "named"
        if p.derivation:
            return f"profile {p.name} ({how}; {p.derivation})"
        # A profile fitted on published data names it (which part came from which dataset).
        dataset = p.engine.settings.get("dataset")
        fitted = f"fitted on {dataset}" if dataset else f"fitted {p.created_utc[:10]}"
        return f"profile {p.name} ({how}; {p.engine.name} {p.engine.version} on {p.model}, " \
               f"{fitted}{error})"


def profile_mismatches(profile: CalibrationProfile, scenario: Scenario) -> list[str]:
    """Why `profile` cannot price `scenario` (model, GPU, engine version), naming both sides."""
    out = []
    gpu = scenario.hardware.gpu_spec.name
    if profile.hardware.gpu != gpu:
        out.append(f"profile {profile.name!r} was measured on GPU {profile.hardware.gpu!r}, "
                   f"the scenario runs on {gpu!r}")
    models = sorted({scenario.strategy_arch(i).name for i in range(len(scenario.strategies))})
    for model in models:
        if model != profile.model:
            out.append(f"profile {profile.name!r} was measured on model {profile.model!r}, "
                       f"the scenario serves {model!r}")
    version = scenario.engine.version
    if version is not None and version != profile.engine.version:
        out.append(f"profile {profile.name!r} was measured on {profile.engine.name} "
                   f"{profile.engine.version}, the scenario's engine.version is {version!r}")
    return out


def gpu_default_pricing(gpu: GpuSpec) -> PricingSource:
    """What prices a GPU kind when the scenario names no profile for it: its shipped profile,
    else the assumed coefficients."""
    default = DEFAULT_PROFILES.get(gpu.name)
    if default is None or not profile_path(default).exists():
        return PricingSource(default_coeffs(gpu), None, None, True)
    path = profile_path(default)
    profile = load_profile(path)
    return PricingSource(profile.coefficients, profile, path, True)


def resolve_pricing(scenario: Scenario, base_dir: Path | None = None, *,
                    strict: bool = False) -> PricingSource:
    """The coefficients that price `scenario`: its named profile (checked against its model,
    GPU and engine version), else the GPU kind's shipped profile, else assumed defaults. A
    named profile prices only its own GPU kind: a search trying other kinds prices those with
    their defaults, unless `strict` (loading a scenario), where that is an error too."""
    gpu = scenario.hardware.gpu_spec
    ref = scenario.hardware.profile
    if ref is None:
        return gpu_default_pricing(gpu)
    path = profile_path(ref, base_dir)
    profile = load_profile(path)
    if not strict and profile.hardware.gpu != gpu.name:
        return gpu_default_pricing(gpu)
    problems = profile_mismatches(profile, scenario)
    if problems:
        raise ScenarioError([f"hardware.profile: {p}; allowed: a profile measured on the "
                             f"scenario's model, GPU and engine (molcap calibrate measure ...)"
                             for p in problems])
    return PricingSource(profile.coefficients, profile, path, False)


def located_profile_error(err: ScenarioError, text: str, source: str) -> ScenarioError:
    """`err`, raised resolving a scenario's named `hardware.profile` (unreadable, invalid, or
    for another model, GPU or engine version), with each message located at that field."""
    line = parse_yaml(text, source)[1].line_of(("hardware", "profile"))
    where = f"{source}:{line}: "
    return ScenarioError([where + (m if m.startswith("hardware.profile:")
                                   else f"hardware.profile: {m}") for m in err.messages])


def anchor_profile(scenario: Scenario, folder: Path) -> Scenario:
    """The scenario with a relative `hardware.profile` path made absolute against its file's
    folder, so worker processes read the same profile from any working directory (a profile
    name stays a name)."""
    ref = scenario.hardware.profile
    if ref is None or Path(ref).is_absolute() or profile_path(ref).parent == PROFILES_DIR:
        return scenario
    near = Path(folder) / ref
    if not near.exists():
        return scenario
    hardware = scenario.hardware.model_copy(update={"profile": str(near.resolve())})
    return scenario.model_copy(update={"hardware": hardware})
