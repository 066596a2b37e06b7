"""Least-squares fit of cost-model coefficients to measured step samples.

`fit(samples, model_terms, profiles, start=...) -> FitResult` moves the named `CostCoeffs` fields
(inside the ranges their pydantic fields allow) so that `sim.cost.cost_model.predict_step` matches
the measured step seconds: least squares over soft-L1 residuals of each step's error relative
to its kind of step, each kind weighed alike (see `_bucket_scales`), scipy's trust-region
reflective solver. The
result carries each coefficient's standard error and, per sample group, MAPE and R² on the
fitting samples and on held-out ones. The simulator itself never imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from annotated_types import Ge, Gt, Le
from scipy.optimize import least_squares

from calibrate.recorder import StepSample
from sim.cost.cost_model import CostCoeffs, predict_step
from sim.cost.layer_costs import LayerCosts

DEFAULT_TERMS = (
    "gemm_flops_efficiency", "attention_flops_efficiency", "memory_bandwidth_efficiency",
    "step_overhead_s", "per_sequence_overhead_s", "prompt_step_overhead_s",
)
"""Coefficients every engine profile fits."""
LORA_TERMS = ("lora_flops_efficiency", "lora_launch_overhead_s", "lora_per_adapter_overhead_s",
              "lora_slice_launch_s", "lora_token_gather_share")
"""Coefficients of the LoRA path (fitted when LoRA samples are present)."""
DIREFT_TERMS = ("direft_flops_efficiency", "direft_layer_overhead_s")
"""Coefficients of DiReFT (fitted when DiReFT_P samples are present)."""


@dataclass(frozen=True)
class FitResult:
    """Fitted coefficients and how well they explain the samples."""

    coeffs: CostCoeffs
    terms: tuple[str, ...]
    stderr: dict[str, float]
    """Standard error of each fitted coefficient (same unit as the coefficient)."""
    errors: list[dict]
    """Per split ("train", "test") and group: n, MAPE, median APE, R²."""
    term_shares: dict[str, float]
    """Mean share of predicted step time per StepCost term, over the fitting samples."""
    num_iterations: int


def _bounds(name: str) -> tuple[float, float]:
    lo, hi = 0.0, np.inf
    for meta in CostCoeffs.model_fields[name].metadata:
        if isinstance(meta, Gt):
            lo = max(lo, float(meta.gt) * (1 + 1e-9) + 1e-6)
        elif isinstance(meta, Ge):
            lo = max(lo, float(meta.ge))
        elif isinstance(meta, Le):
            hi = min(hi, float(meta.le))
    return lo, hi


def predict_samples(coeffs: CostCoeffs, samples: list[StepSample],
                    profiles: dict[str, LayerCosts]) -> np.ndarray:
    """Predicted seconds of each sample under `coeffs`."""
    return np.array([predict_step(coeffs, profiles[s.group],
                                  s.batch(profiles[s.group].num_layers)).total_s
                     for s in samples])


def error_row(split: str, group: str, measured, predicted) -> dict:
    """Error summary of one group of predictions (the GPU fits' rows)."""
    ape = np.abs(predicted - measured) / measured
    ss_tot = float(((measured - measured.mean()) ** 2).sum())
    r2 = 1 - float(((measured - predicted) ** 2).sum()) / ss_tot if ss_tot > 0 else 0.0
    return dict(split=split, group=group, num_samples=int(measured.size),
                mape=float(ape.mean()), median_ape=float(np.median(ape)), r2=min(r2, 1.0))


def _error_rows(split: str, samples, measured, predicted) -> list[dict]:
    rows = []
    groups = sorted({s.group for s in samples})
    for group in [*groups, "all"] if len(groups) > 1 else groups:
        mask = np.array([group in ("all", s.group) for s in samples])
        y, p = measured[mask], predicted[mask]
        ape = np.abs(p - y) / y
        ss_res, ss_tot = float(((y - p) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
        rows.append(dict(split=split, group=group, num_samples=int(mask.sum()),
                         mape=float(ape.mean()), median_ape=float(np.median(ape)),
                         r2=1 - ss_res / ss_tot if ss_tot > 0 else float("nan")))
    return rows


def _term_shares(coeffs, samples, profiles) -> dict[str, float]:
    shares: dict[str, list[float]] = {}
    for s in samples:
        cost = predict_step(coeffs, profiles[s.group], s.batch(profiles[s.group].num_layers))
        for name, value in cost.as_dict().items():
            if name != "total_s":
                shares.setdefault(name, []).append(value / cost.total_s)
    return {k: float(np.mean(v)) for k, v in shares.items()}


def fit(samples: list[StepSample], model_terms: tuple[str, ...],
        profiles: dict[str, LayerCosts], *, start: CostCoeffs | None = None,
        held_out: list[StepSample] = ()) -> FitResult:
    """Fit `model_terms` (CostCoeffs field names) to `samples`; `profiles` maps each sample
    group to the cost profile it was measured on; `held_out` samples are only scored."""
    if not samples:
        raise ValueError("no samples to fit")
    start = start or CostCoeffs()
    unknown = [t for t in model_terms if t not in CostCoeffs.model_fields]
    if unknown:
        known = sorted(CostCoeffs.model_fields)
        raise ValueError(f"unknown coefficients {unknown}; known: {known}")
    lo, hi = np.array([_bounds(t) for t in model_terms]).T
    x0 = np.clip([getattr(start, t) for t in model_terms], lo, hi)
    scale = np.where(x0 > 0, x0, np.where(np.isfinite(hi), hi * 1e-3, 1e-3))
    batches = [(profiles[s.group], s.batch(profiles[s.group].num_layers)) for s in samples]
    measured = np.array([s.measured_s for s in samples])
    median_s, weight = _bucket_scales(samples, measured)

    def coeffs_at(x):
        return start.model_copy(update=dict(zip(model_terms, (float(v) for v in x * scale),
                                                strict=True)))

    def residuals(x):
        c = coeffs_at(x)
        predicted = np.array([predict_step(c, p, b).total_s for p, b in batches])
        return soft_l1_residuals((predicted - measured) / median_s) * weight

    solution = least_squares(residuals, x0 / scale, bounds=(lo / scale, hi / scale),
                             x_scale="jac", diff_step=1e-4, ftol=1e-6, xtol=1e-6)
    coeffs = CostCoeffs(**coeffs_at(solution.x).model_dump())  # validated
    return FitResult(coeffs=coeffs, terms=tuple(model_terms),
                     stderr=_stderr(solution, scale, model_terms),
                     errors=_scores(coeffs, samples, list(held_out), profiles),
                     term_shares=_term_shares(coeffs, samples, profiles),
                     num_iterations=int(solution.nfev))


def step_kind(s: StepSample) -> str:
    """"decode" (one token per item), "prefill" (prompt chunks only) or "mixed"."""
    if max(s.num_new_tokens, default=1) == 1:
        return "decode"
    return "mixed" if min(s.num_new_tokens) == 1 else "prefill"


ROBUST_SCALE = 0.25
"""Relative step error past which a step's residual counts linearly, not quadratically. On a
machine shared with other jobs identical steps can take up to twice their median; squared, a
few such steps in a small bucket outvote thousands of decode steps, and a least-squares fit
gives up the fixed per-step cost (what serving's decode steps are made of) to chase them."""


def soft_l1_residuals(errors: np.ndarray, scale: float = ROBUST_SCALE) -> np.ndarray:
    """Residuals whose squares are the soft-L1 loss of `errors`: 2 c² (sqrt(1 + (e/c)²) - 1),
    about e² for |e| << c and 2 c |e| for |e| >> c; signed like `errors`."""
    loss = 2 * scale**2 * (np.sqrt(1 + (errors / scale) ** 2) - 1)
    return np.sign(errors) * np.sqrt(loss)


def _bucket_scales(samples: list[StepSample],
                   measured: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample, the median measured time of its (group, kind of step) bucket (its error is
    relative to that), and the weight of its residual: one over the square root of the
    bucket's size over the mean size.

    So a 5 ms decode step and a 300 ms prefill weigh alike, and so do a bucket of 2,000 decode
    steps and one of 60 mixed steps (the steps that price serving's TTFT); within a bucket the
    soft-L1 loss (`soft_l1_residuals`) fits the typical step and lets the few steps the
    machine's other jobs slowed 2x count linearly."""
    keys = [(s.group, step_kind(s)) for s in samples]
    counts: dict = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    mean_count = len(keys) / len(counts)
    medians = {k: float(np.median([m for kk, m in zip(keys, measured, strict=True) if kk == k]))
               for k in counts}
    return (np.array([medians[k] for k in keys]),
            np.array([1 / np.sqrt(counts[k] / mean_count) for k in keys]))


def thin_decode_steps(samples: list[StepSample], keep: int = 4,
                      keep_staggered: int = 12) -> list[StepSample]:
    """At most `keep` evenly spaced decode steps per probe of identical requests submitted at
    once (its decode steps differ only by a token of context), `keep_staggered` per staggered
    probe; every prefill and mixed step. Cuts the fit's cost several times over without losing
    a kind of step."""
    by_probe: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        if step_kind(s) == "decode":
            by_probe.setdefault(repr(sorted(s.tags.items())), []).append(i)
    dropped = set()
    for indices in by_probe.values():
        limit = keep_staggered if samples[indices[0]].tags.get("stagger") else keep
        if len(indices) > limit:
            kept = set(np.linspace(0, len(indices) - 1, limit).round().astype(int).tolist())
            dropped |= {idx for j, idx in enumerate(indices) if j not in kept}
    return [s for i, s in enumerate(samples) if i not in dropped]


def _stderr(solution, scale, terms) -> dict[str, float]:
    """Standard errors from the Jacobian at the solution (Gauss-Newton covariance)."""
    jac, res = solution.jac, solution.fun
    dof = max(1, res.size - len(terms))
    cov = np.linalg.pinv(jac.T @ jac) * float(res @ res) / dof
    return {t: float(np.sqrt(max(cov[i, i], 0.0)) * scale[i]) for i, t in enumerate(terms)}


def _scores(coeffs, train, test, profiles) -> list[dict]:
    rows = []
    for split, part in (("train", train), ("test", test)):
        if part:
            measured = np.array([s.measured_s for s in part])
            rows += _error_rows(split, part, measured, predict_samples(coeffs, part, profiles))
    return rows


def group_profiles(arch, gpu, *, adapter_rank: int, adapter_placements,
                   ranks=(16, 32)) -> dict[str, LayerCosts]:
    """Cost profile of each vLLM sample group: base on an engine without LoRA; LoRA and LoRA_P
    on a LoRA engine (LoRA_P's decode tokens are marked unadapted in the samples), also at
    other max_lora_rank values ("lora_r16"); DiReFT_P by its own shapes (every layer edited)
    on a LoRA engine, whose LoRA wrapper runs for every token although none is LoRA-adapted."""
    from sim.cost.layer_costs import LORA_MODULES, create_layer_costs

    out = {"base": create_layer_costs(arch, gpu)}
    for rank in (adapter_rank, *ranks):
        lora = create_layer_costs(arch, gpu, adapter_kind="lora", adapter_rank=rank,
                                   adapter_placements=list(adapter_placements))
        suffix = "" if rank == adapter_rank else f"_r{rank}"
        out["lora" + suffix] = out["lora_p" + suffix] = lora
    wrapped = [(i, m) for i in range(arch.num_layers) for m in LORA_MODULES]
    out["direft_p"] = create_layer_costs(
        arch, gpu, adapter_kind="direft", adapter_rank=adapter_rank,
        adapter_placements=[(i, "residual") for i in range(arch.num_layers)],
        lora_wrapped_placements=wrapped)
    return out


def fit_adapter_loads(loads: list[dict], gpu) -> tuple[dict[str, float], dict]:
    """Slot activations (cached adapter into a device slot): seconds = overhead + bytes /
    (PCIe bandwidth x efficiency), non-negative least squares. Returns the two coefficients
    and a summary (per kind: count, median seconds, median bytes; the fit's MAPE)."""
    from scipy.optimize import nnls

    summary: dict = {}
    for kind in sorted({x["kind"] for x in loads}):
        mine = [x for x in loads if x["kind"] == kind]
        summary[kind] = dict(num_loads=len(mine),
                             median_s=float(np.median([x["seconds"] for x in mine])),
                             median_bytes=float(np.median([x["num_bytes"] for x in mine])))
    active = [x for x in loads if x["kind"] == "activate"]
    if len(active) < 2:
        return {}, summary
    y = np.array([x["seconds"] for x in active])
    nbytes = np.array([x["num_bytes"] for x in active], dtype=float)
    a = np.stack([np.ones_like(nbytes), nbytes / 1e6], axis=1)
    (overhead, per_mb), _ = nnls(a, y)
    efficiency = 1.0 if per_mb <= 0 else min(1.0, 1e6 / (per_mb * gpu.pcie_bandwidth_bytes_per_s))
    coeffs = {"adapter_load_overhead_s": float(overhead),
              "adapter_load_bandwidth_efficiency": float(max(efficiency, 1e-6))}
    predicted = overhead + nbytes / (gpu.pcie_bandwidth_bytes_per_s *
                                     coeffs["adapter_load_bandwidth_efficiency"])
    summary["activate"]["fit_mape"] = float(np.mean(np.abs(predicted - y) / y))
    return coeffs, summary


def fit_host_cache_loads(loads: list[dict]) -> tuple[dict[str, float], dict]:
    """Loads from an adapter's files into the host cache (kind "disk"): seconds = overhead +
    GiB x seconds per GiB, non-negative least squares over every load given. Returns the two
    coefficients and a summary (count, median seconds and bytes, the fit's MAPE)."""
    from scipy.optimize import nnls

    disk = [x for x in loads if x["kind"] == "disk"]
    if len(disk) < 2:
        return {}, {}
    y = np.array([x["seconds"] for x in disk])
    gib = np.array([x["num_bytes"] for x in disk], dtype=float) / 2**30
    (overhead, per_gib), _ = nnls(np.stack([np.ones_like(gib), gib], axis=1), y)
    predicted = overhead + gib * per_gib
    summary = dict(num_loads=float(len(disk)), median_s=float(np.median(y)),
                   median_bytes=float(np.median(gib) * 2**30),
                   fit_mape=float(np.mean(np.abs(predicted - y) / y)))
    return ({"adapter_disk_load_overhead_s": float(overhead),
             "adapter_disk_read_s_per_gib": float(per_gib)}, summary)


def create_calibration_profile(result: FitResult, *, name: str, model: str, engine: dict,
                               hardware: dict, packages: dict, num_samples: int,
                               load_average, commands, description: str = "",
                               adapter_loads: dict | None = None):
    """The profile file's model from a fit and where its samples came from."""
    import datetime as dt

    from sim.cost.profile import CalibrationProfile, FitErrorRow, FitSummary

    summary = FitSummary(fitted_terms=result.terms, stderr=result.stderr,
                         errors=tuple(FitErrorRow(**row) for row in result.errors),
                         term_shares=result.term_shares,
                         load_average=tuple(round(x, 2) for x in load_average),
                         adapter_loads=adapter_loads or {})
    return CalibrationProfile(
        name=name, description=description, model=model, engine=engine, hardware=hardware,
        packages=packages, created_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        coefficients=result.coeffs, fit=summary, commands=tuple(commands),
        num_samples=num_samples)


def write_profile(profile, path) -> None:
    """Write a profile as YAML (atomically; parent folders created)."""
    from pathlib import Path

    import yaml

    from sim.io.files import write_atomic

    data = profile.model_dump(mode="json")
    text = yaml.safe_dump(data, sort_keys=False, width=100)
    write_atomic(Path(path), text.encode("utf-8"))
