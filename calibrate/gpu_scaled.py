"""Profiles for GPU kinds without measurements of their own, derived from the H100 fit.

Method (stated in each profile's `derivation`): the fitted efficiencies are shares of a GPU's
peak, so they carry over and the step's roofline terms scale with the target's peak bf16
FLOP/s and HBM bandwidth from the catalogue; host-side fixed costs (per step, per sequence,
per adapter load) carry over unchanged; the LoRA kernel programs' seconds, which are amortised
over the streaming multiprocessors, scale by the H100's SM count x boost clock over the
target's. Adapter copies use the target's PCIe bandwidth. Nothing here was measured on the
target: the CLI, report and dashboard say "scaled from H100 measurements".
"""

from __future__ import annotations

from pathlib import Path

from sim.cost.profile import CalibrationProfile, FitSummary, HardwareInfo

SM_CLOCKS = {
    "H100-64GB": (132, 1.98, "assumed as the SXM5 H100 (same GH100 SXM5 part)"),
    "H100-SXM": (132, 1.98, "NVIDIA H100 Tensor Core GPU architecture whitepaper (SXM5)"),
    "H200": (132, 1.98, "NVIDIA H200 datasheet (the H100's GH100 with HBM3e)"),
    "A100-80GB": (108, 1.41, "NVIDIA A100 Tensor Core GPU architecture whitepaper"),
    "H20": (78, 1.98, "reported SM count of the H20 (not in NVIDIA's brief); clock assumed "
                      "as the H100's"),
}
"""GPU kind -> (streaming multiprocessors, boost clock GHz, source)."""
PROGRAM_TERMS = ("lora_idle_shrink_program_s", "lora_idle_expand_program_s",
                 "lora_working_program_s", "lora_working_mac_s")
SCALED_PROFILES = {"H200": "h200-scaled-from-h100-64gb",
                   "H20": "h20-scaled-from-h100-64gb"}
"""GPU kind -> name of its derived profile. The A100-80GB and the 80 GB H100 (H100-SXM) have
their dense part fitted on vidur's operator times instead (`calibrate.gpu_vidur_fit`)."""


def program_scale(source_gpu: str, target_gpu: str) -> float:
    """How much longer one kernel program takes, amortised, on the target than the source."""
    sms, clock, _ = SM_CLOCKS[source_gpu]
    target_sms, target_clock, _ = SM_CLOCKS[target_gpu]
    return (sms * clock) / (target_sms * target_clock)


def scale_profile(source: CalibrationProfile, target_gpu: str, name: str) -> CalibrationProfile:
    """`source`'s coefficients carried to `target_gpu` by the module's stated method."""
    scale = program_scale(source.hardware.gpu, target_gpu)
    c = source.coefficients
    coeffs = c.model_copy(update={t: getattr(c, t) * scale for t in PROGRAM_TERMS})
    held = [r for r in source.fit.errors if r.split == "test" and r.group == "all"]
    error = f"; the source's held-out step MAPE {held[0].mape:.1%}" if held else ""
    derivation = (
        f"scaled from H100 measurements: profile {source.name} ({source.engine.name} "
        f"{source.engine.version} on {source.hardware.gpu}); efficiencies kept (time follows "
        f"the {target_gpu} peak FLOP/s and HBM bandwidth), host-side costs kept, LoRA kernel "
        f"programs x{scale:.2f} (SMs x clock: {SM_CLOCKS[source.hardware.gpu][:2]} -> "
        f"{SM_CLOCKS[target_gpu][:2]}, {SM_CLOCKS[target_gpu][2]}){error}")
    return source.model_copy(update=dict(
        name=name, coefficients=coeffs, derivation=derivation,
        description=f"Derived, not measured on {target_gpu}. " + derivation,
        hardware=HardwareInfo(gpu=target_gpu, fingerprint={}),
        fit=FitSummary(fitted_terms=(), adapter_loads=source.fit.adapter_loads),
        commands=("python -m calibrate.gpu_fit",)))


def write_scaled_profiles(source: CalibrationProfile, folder: Path) -> list[Path]:
    """Write the profiles of `SCALED_PROFILES`, derived from the source, next to it."""
    from calibrate.fitter import write_profile

    paths = []
    for gpu, name in SCALED_PROFILES.items():
        path = Path(folder) / f"{name}.yaml"
        write_profile(scale_profile(source, gpu, name), path)
        paths.append(path)
    return paths
