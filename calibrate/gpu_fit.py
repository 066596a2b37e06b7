"""Fit the H100-64GB profile from the agullo-dt slice, fit the dense part of the A100-80GB and
H100-SXM profiles on vidur's operator times (`calibrate.gpu_vidur_fit`), and derive profiles for
GPU kinds that have no measurements of their own (`calibrate.gpu_scaled`).

    python -m calibrate.gpu_fit            # rewrites the shipped GPU profiles (step fit)
    python -m calibrate.gpu_run_profile        # the run-level fit on top (not shipped: see
                                           # docs/validation-gpu.md)

The fit is the step-level fit of `calibrate.fitter` over `calibrate.gpu_samples`: base-model
decode and prefill steps and LoRA-engine steps (memory probes over max_loras and rank, the
distinct-adapter sweep) of Llama-3.1-8B fit the roofline efficiencies, the fixed costs and the
LoRA kernel-grid terms together. The work term of the kernels' computing programs
(`lora_working_mac_s`), which these steps cannot tell from their count, stays 0 here;
`calibrate.gpu_work_fit` (`python -m calibrate.gpu_errors --work-fit`) fits it on light
serving runs (not shipped). Held out, never fitted: the distinct-adapter runs at 64, 96, 160
and 192 adapters, the client's batch-1 warm-up steps, and every Qwen2.5-7B sample (the same
coefficients priced on another model's shapes). Adapter activation times (host memory to a
device slot) fit the slot-load terms. The host cost of steps scheduled while requests wait
(`calibrate.gpu_queue_fit`), which no step sample has, is fitted on the serving runs' mean
measured steps outside the validation's table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from calibrate.fitter import (
    FitResult,
    create_calibration_profile,
    fit,
    fit_adapter_loads,
    fit_host_cache_loads,
    predict_samples,
)
from calibrate.gpu_queue_fit import FIT_RULE as QUEUE_RULE
from calibrate.gpu_queue_fit import fit_queue_terms, queue_rows, with_queue_terms
from calibrate.gpu_samples import DATA_DIR, MODELS, AgulloSamples, load_agullo_samples
from sim.cost.cost_model import CostCoeffs, adapter_disk_load_s
from sim.cost.layer_costs import LayerCosts, create_layer_costs
from sim.hardware.catalogue import get_gpu, get_model

GPU_KIND = "H100-64GB"
PROFILE_NAME = "h100-64gb-vllm085-llama-3.1-8b"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
BASE_TERMS = ("gemm_flops_efficiency", "attention_flops_efficiency",
              "memory_bandwidth_efficiency", "step_overhead_s", "per_sequence_overhead_s")
LORA_GRID_TERMS = ("lora_kernel_step_s", "lora_idle_shrink_program_s",
                   "lora_idle_expand_program_s", "lora_working_program_s")
HELD_OUT_ADAPTERS = (64, 96, 160, 192)
"""`restrict_loras` of the distinct-adapter runs kept out of the fit."""
START = CostCoeffs(lora_launch_overhead_s=0.0, lora_per_adapter_overhead_s=0.0,
                   lora_kernel_step_s=1e-4, lora_idle_shrink_program_s=1e-9,
                   lora_idle_expand_program_s=1e-9, lora_working_program_s=2e-8)
"""Starting point: the CPU path's per-adapter launch terms are off on GPUs (the kernel grid
prices what they stood for there)."""
VLLM_SETTINGS = dict(engine="vllm", version="0.8.5", scheduler="V1 (vllm.v1.core.sched)",
                     max_num_batched_tokens=2048, enable_prefix_caching=False)


def group_profiles(groups, gpu) -> dict[str, LayerCosts]:
    """Cost profile of each sample group ("<model>:base", "<model>:lora_r<rank>_ml<slots>")."""
    out = {}
    for group in groups:
        model, kind = group.split(":")
        arch = get_model(model)
        if kind == "base":
            out[group] = create_layer_costs(arch, gpu)
            continue
        rank, slots = map(int, re.fullmatch(r"lora_r(\d+)_ml(\d+)", kind).groups())
        out[group] = create_layer_costs(arch, gpu, adapter_kind="lora", adapter_rank=rank,
                                         max_loras=slots)
    return out


def split_samples(samples: AgulloSamples, model: str = "llama-3.1-8b"):
    """(train, held_out): the fitted model's samples but the held-out adapter counts and its
    warm-up steps; everything else held out."""
    train, test = [], []
    for kind, items in samples.by_kind.items():
        for s in items:
            held = (s.tags["model"] != model or kind == "lora_warmup"
                    or s.tags.get("restrict_loras") in HELD_OUT_ADAPTERS)
            (test if held else train).append(s)
    return train, test


def adapter_loads(root: Path, model: str) -> list[dict]:
    """Slot activations of `model` by adapter rank (bytes at the adapter's own rank)."""
    upstream = next(k for k, v in MODELS.items() if v == model)
    path = root / f"predictor_loading_{upstream}_constants.json"
    arch = get_model(model)
    from sim.cost.memory_model import adapter_slot_bytes_per_gpu

    loads = []
    for max_rank, by_rank in json.loads(path.read_text(encoding="utf-8")).items():
        for rank, ms in by_rank.items():
            loads.append(dict(kind="activate", seconds=ms / 1e3, max_lora_rank=int(max_rank),
                              num_bytes=adapter_slot_bytes_per_gpu(arch, 1, int(rank), 1)))
    return loads


def disk_loads(root: Path, model: str) -> list[dict]:
    """Loads of `model`'s adapters from their files into the host cache (the predictor_loading
    server logs), with the adapter's bytes at its own rank, as the slot loads count them."""
    from calibrate.gpu_data.agullo_loads import read_load_times
    from sim.cost.memory_model import adapter_slot_bytes_per_gpu

    upstream = next(k for k, v in MODELS.items() if v == model)
    arch = get_model(model)
    return [dict(kind="disk", seconds=r.seconds, load_index=r.load_index,
                 num_bytes=adapter_slot_bytes_per_gpu(arch, 1, r.adapter_rank, 1))
            for r in read_load_times(root) if r.model == upstream and r.source == "disk"]


def fit_disk_loads(root: Path, model: str = "llama-3.1-8b") -> tuple[dict, dict]:
    """The host-cache load terms fitted on `model`'s disk loads; the summary adds the first
    load of each run (its file not yet in the OS page cache: later loads re-read the same
    files) and the fit's error on every other model's loads, held out."""
    coeffs, summary = fit_host_cache_loads(disk_loads(root, model))
    if not coeffs:
        return {}, {}
    firsts = [x["seconds"] for x in disk_loads(root, model) if x["load_index"] == 1]
    summary["first_load_median_s"] = float(np.median(firsts))
    for other in sorted(set(MODELS.values()) - {model}):
        held = disk_loads(root, other)
        if held:
            y = np.array([x["seconds"] for x in held])
            p = np.array([adapter_disk_load_s(CostCoeffs(**coeffs), x["num_bytes"])
                          for x in held])
            summary[f"held_out_{other}_mape"] = float(np.mean(np.abs(p - y) / y))
            summary[f"held_out_{other}_median_s"] = float(np.median(y))
    return coeffs, summary


def error_rows(coeffs, samples, split: str, profiles) -> list[dict]:
    """Errors per (model, kind of sample) and over all of `samples`."""
    measured = np.array([s.measured_s for s in samples])
    predicted = predict_samples(coeffs, samples, profiles)
    keys = [f"{s.tags['model']}:{s.tags['kind']}" for s in samples]
    rows = []
    for group in [*sorted(set(keys)), "all"]:
        mask = np.array([group in ("all", k) for k in keys])
        y, p = measured[mask], predicted[mask]
        ape = np.abs(p - y) / y
        ss_tot = float(((y - y.mean()) ** 2).sum())
        rows.append(dict(split=split, group=group, num_samples=int(mask.sum()),
                         mape=float(ape.mean()), median_ape=float(np.median(ape)),
                         r2=1 - float(((y - p) ** 2).sum()) / ss_tot if ss_tot > 0 else 0.0))
    return rows


def fit_h100_64gb(root: Path = DATA_DIR) -> tuple[FitResult, dict, AgulloSamples]:
    """The fit of the H100-64GB profile: (result, adapter-load summary, samples)."""
    gpu = get_gpu(GPU_KIND)
    samples = load_agullo_samples(root)
    train, test = split_samples(samples)
    profiles = group_profiles({s.group for s in train + test}, gpu)
    result = fit(train, BASE_TERMS + LORA_GRID_TERMS, profiles, start=START, held_out=test)
    load_coeffs, load_summary = fit_adapter_loads(adapter_loads(root, "llama-3.1-8b"), gpu)
    disk_coeffs, disk_summary = fit_disk_loads(root)
    if disk_coeffs:
        load_coeffs, load_summary = {**load_coeffs, **disk_coeffs}, {**load_summary,
                                                                     "disk": disk_summary}
    coeffs = CostCoeffs(**result.coeffs.model_copy(update=load_coeffs).model_dump())
    # The queue's host cost, on the serving runs' measured steps (no step sample has a queue)
    _, queue_terms, _ = fit_queue_terms(queue_rows(coeffs, root))
    coeffs = with_queue_terms(coeffs, queue_terms)
    errors = error_rows(coeffs, train, "train", profiles) + error_rows(coeffs, test, "test",
                                                                        profiles)
    result = FitResult(coeffs=coeffs, terms=result.terms + tuple(load_coeffs)
                       + tuple(queue_terms),
                       stderr=result.stderr, errors=errors, term_shares=result.term_shares,
                       num_iterations=result.num_iterations)
    return result, load_summary, samples


def step_refit(root: Path = DATA_DIR):
    """mac -> this module's step fit (the fitted coefficients) with `lora_working_mac_s` held
    at mac."""
    samples = load_agullo_samples(root)
    train, test = split_samples(samples)
    profiles = group_profiles({s.group for s in train + test}, get_gpu(GPU_KIND))

    def refit(mac: float) -> CostCoeffs:
        return fit(train, BASE_TERMS + LORA_GRID_TERMS, profiles,
                   start=START.model_copy(update=dict(lora_working_mac_s=mac))).coeffs

    return refit


def create_h100_64gb_profile(root: Path = DATA_DIR):
    """The fitted profile, recording what it was fitted on and its held-out error."""
    result, loads, samples = fit_h100_64gb(root)
    train, test = split_samples(samples)
    description = (
        "vLLM 0.8.5 (V1 engine fork) on MareNostrum 5's 64 GB H100, agullo-dt "
        "(FerranAgulloLopez/GPULLMAdapterOptimization @ bae36e2d, Apache-2.0), slice "
        "data/gpu/agullo-dt. Fitted on Llama-3.1-8B: predictor_default_latency output/input "
        "sweeps (base decode and prefill steps), find_available_gpu_memory probes (batch 1, "
        "max_loras 8-384, ranks 8/16/32), predictor_latency_overhead runs at 1/32/128 and "
        f"224-300 adapters ({len(train)} samples). Held out ({len(test)} samples): the "
        f"overhead runs at {list(HELD_OUT_ADAPTERS)} adapters, the batch-1 warm-up steps, "
        "and every Qwen2.5-7B sample. Adapter loads (predictor_loading, Llama-3.1-8B): "
        "slot loads on upstream's mean activation times; host-cache (disk) loads on the "
        "300 per-load times of the server logs' start-up (Qwen2.5-7B's held out). "
        f"Queue terms (calibrate.gpu_queue_fit): {QUEUE_RULE}. "
        "Skipped rows: " + "; ".join(samples.skipped))
    return create_calibration_profile(
        result, name=PROFILE_NAME, model="llama-3.1-8b",
        engine=dict(name="vllm", version="0.8.5", settings=dict(
            max_num_batched_tokens=2048, enable_prefix_caching=False, max_lora_rank=8,
            max_loras=300, max_num_seqs=220, dataset="agullo-dt@bae36e2d")),
        hardware=dict(gpu=GPU_KIND, fingerprint=dict(
            system="MareNostrum 5 ACC (BSC)", gpu="NVIDIA H100 64GB HBM2 (SXM)")),
        packages={"vllm": "0.8.5 (fork, V1 scheduler)"}, num_samples=len(train) + len(test),
        load_average=(0.0, 0.0, 0.0), description=description,
        commands=("python data/gpu/cut_agullo_slice.py FULL_GPU_DATA",
                  "python data/gpu/cut_agullo_loads.py UPSTREAM_CHECKOUT",
                  "python -m calibrate.gpu_fit"),
        adapter_loads=loads)


def main() -> None:
    from calibrate.fitter import write_profile
    from calibrate.gpu_scaled import write_scaled_profiles
    from calibrate.gpu_vidur_fit import write_vidur_profiles

    profile = create_h100_64gb_profile()
    write_profile(profile, PROFILES_DIR / f"{PROFILE_NAME}.yaml")
    # Dense part fitted on vidur's operators, LoRA kernels scaled from this fit; then the
    # GPU kinds with no data of their own, scaled.
    write_vidur_profiles(profile, PROFILES_DIR)
    write_scaled_profiles(profile, PROFILES_DIR)
    for row in profile.fit.errors:
        if row.group == "all":
            print(f"{row.split}: {row.num_samples} samples, MAPE {row.mape:.1%}, "
                  f"median {row.median_ape:.1%}")


if __name__ == "__main__":
    main()
