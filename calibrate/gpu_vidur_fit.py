"""Fit the dense (base-model) GPU terms of the A100-80GB and the 80 GB H100 (SXM) on vidur's
operator CUDA times, and their tensor-parallel all-reduce term on vidur's all-reduce times.

    python -m calibrate.gpu_fit       # writes these profiles with the others

What is fitted, per GPU kind, on the repository's vidur slice (`data/gpu/vidur`, microsoft/vidur
@ 7d475133, MIT; `data/cut_gpu_slices.py` says which rows):
* `gemm_flops_efficiency`, `memory_bandwidth_efficiency`, `layer_overhead_s`: one layer's CUDA
  time without attention (QKV and O projections, gated MLP, norms, rope, activation, residual
  add: every per-layer operator vidur times) against the cost model's dense roofline plus a
  fixed cost per layer (the elementwise kernels' floor: without it small batches come out
  30-40% fast). Fitted on every gated model vidur profiled on the GPU but Llama-2-70B, at TP
  1/2/4/8 and 20 log-spaced token counts from 1 to 4,096 (`FIT_TOKENS`); Llama-2-70B's
  operators are held out (scored in the profile's `fit.errors`), so the Splitwise check
  (`calibrate.gpu_splitwise`, Llama-2-70B whole steps) is on a model the fit never saw.
* `communication_efficiency`, `communication_latency_s`: the DGX all-reduce times of 2 and 4
  workers against the cost model's ring all-reduce; the 8-worker times are held out. This
  prices TP degrees the table below does not list.
* `all_reduce_fits`: a latency and a bandwidth per TP degree (2, 4, 8) on the same all-reduce
  times (`calibrate.gpu_all_reduce`): what a step at those degrees is priced by.
* `communication_latency_per_gpu_s`: the latency x TP every all-reduce adds in a serving step
  (waiting for the slowest rank, which vidur's kernels timed after a barrier miss), fitted on
  Splitwise's Llama-2-70B token steps at TP 2 and 4 (`calibrate.gpu_splitwise`); TP 8 held
  out. Why this base and not the ring formula refitted: docs/validation-gpu.md.

Kept from the H100-64GB fit (`calibrate.gpu_fit`, agullo-dt, vLLM 0.8.5): attention efficiency
(vidur's attention profiles are not in the team's copy), per-sequence and adapter-load costs,
and the LoRA kernel-grid terms, those scaled by SMs x clock as `calibrate.gpu_scaled` does. The
fixed step cost is the H100-64GB fit's less the 32 layers' fixed GPU time that fit's steps held
(its model has 32 layers; the H100's layer floor fitted here), as `layer_overhead_s` now prices
that per layer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from calibrate.fitter import error_row
from calibrate.gpu_all_reduce import AllReduceTableFit, fit_all_reduce_table
from sim.cost.layer_costs import create_layer_costs
from sim.hardware.catalogue import get_gpu
from sim.hardware.specs import GpuSpec, ModelArch

VIDUR_DIR = Path(__file__).resolve().parents[1] / "data" / "gpu" / "vidur"
VIDUR_GPUS = {"A100-80GB": ("a100", "a100_dgx"), "H100-SXM": ("h100", "h100_dgx")}
"""GPU kind -> (vidur's compute device, its DGX network profile)."""
PROFILE_NAMES = {"A100-80GB": "a100-80gb-vidur-dense", "H100-SXM": "h100-sxm-vidur-dense"}
HELD_OUT_MODEL = "meta-llama/Llama-2-70b-hf"
HELD_OUT_WORKERS = 8
DENSE_TERMS = ("gemm_flops_efficiency", "memory_bandwidth_efficiency", "layer_overhead_s")
COMM_TERMS = ("communication_efficiency", "communication_latency_s")
FIT_TOKENS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
              3072, 4096)
"""Token counts the dense fit reads (the slice keeps them for every model,
`data/cut_gpu_slices.py` VIDUR_TOKENS): log-spaced, so decode-sized batches weigh as much as
prefill chunks (vidur's own grid is 8 or 32 apart, three quarters of it above 1,024 tokens),
and the full data and the slice give the same fit."""
SOURCE_NUM_LAYERS = 32
"""Layers of Llama-3.1-8B, the model the H100-64GB fixed step cost was fitted on."""
VIDUR_COMMIT = "7d475133"


@dataclass(frozen=True)
class LayerSample:
    """One layer's CUDA time without attention at one (model, TP, tokens), summed over the
    operators of one vidur row."""

    model: str
    tp: int
    num_tokens: int
    measured_s: float
    arch: ModelArch
    source: str
    """file:line of the vidur row."""


def vidur_arch(record) -> ModelArch:
    """A one-layer model with the shapes of a vidur row (its config columns)."""
    return ModelArch(
        name=record.model, num_layers=1, hidden_size=record.n_embd,
        num_attention_heads=record.n_head, num_kv_heads=record.n_kv_head,
        head_dim=record.n_embd // record.n_head, attention="gqa",
        intermediate_size=record.n_expanded_embd, vocab_size=record.vocab_size,
        max_context_tokens=4096, weight_dtype_bytes=2, kv_dtype_bytes=2,
        sources={"*": f"vidur {record.source_file} config columns"})


def layer_samples(records, device: str) -> tuple[list[LayerSample], list[str]]:
    """Per-layer samples of `device`'s operator records at `FIT_TOKENS`; models the cost
    model's shapes do not describe (a non-gated MLP) are left out and named in the second
    value."""
    times, first = defaultdict(float), {}
    for r in records:
        if (r.gpu != device or r.operator == "emb"  # the embedding runs once per step
                or r.num_tokens not in FIT_TOKENS):
            continue
        key = (r.model, r.num_tensor_parallel_workers, r.num_tokens)
        times[key] += r.median_ms / 1e3
        first.setdefault(key, r)
    samples, skipped = [], set()
    archs = {}
    for key, seconds in times.items():
        r = first[key]
        if not r.use_gated_mlp:
            skipped.add(f"{r.model} ({r.source_file}): non-gated MLP, not the cost model's "
                        "gated FFN")
            continue
        arch = archs.setdefault(r.model, vidur_arch(r))
        samples.append(LayerSample(r.model, key[1], key[2], seconds, arch,
                                   f"{r.source_file}:{r.source_line}"))
    return samples, sorted(skipped)


@dataclass(frozen=True)
class DenseDesign:
    """Per sample: dense FLOPs and weight bytes per GPU of one layer (`LayerCosts`' shapes)."""

    flops: np.ndarray
    num_bytes: np.ndarray
    gpu: GpuSpec

    @classmethod
    def of(cls, samples: list[LayerSample], gpu: GpuSpec) -> DenseDesign:
        flops, num_bytes = [], []
        for s in samples:
            p = create_layer_costs(s.arch, gpu, s.tp)
            params = float(p.dense_params_per_layer[0])
            flops.append(2 * s.num_tokens * params / p.tp)
            num_bytes.append(params * p.weight_dtype_bytes / p.tp)
        return cls(np.array(flops), np.array(num_bytes), gpu)

    def seconds(self, gemm_eff: float, bw_eff: float, layer_s: float) -> np.ndarray:
        """The cost model's dense roofline of one layer plus its fixed per-layer cost."""
        g = self.gpu
        return np.maximum(self.flops / (g.bf16_dense_flops * gemm_eff),
                          self.num_bytes / (g.hbm_bandwidth_bytes_per_s * bw_eff)) + layer_s


@dataclass(frozen=True)
class TermFit:
    """Fitted values, their standard errors, and error rows (split, group, n, MAPE, ...)."""

    values: dict[str, float]
    stderr: dict[str, float]
    errors: list[dict]


def _group_weights(groups: list) -> np.ndarray:
    """Per sample, one over the square root of its group's share: each group weighs alike
    (vidur's Llama-2-7B slice keeps every token count, the other models 20)."""
    keys, counts = np.unique(np.asarray(groups, dtype=str), return_inverse=True,
                             return_counts=True)[1:]
    return 1 / np.sqrt(counts[keys] * len(counts) / len(groups))


def _log_fit(model, x0, lo, hi, measured, names, weights) -> tuple[np.ndarray, dict]:
    """Weighted least squares of log(predicted / measured) (relative errors, every size
    alike)."""
    scale = np.asarray(x0, dtype=float)

    def residuals(x):
        return np.log(model(x * scale) / measured) * weights

    sol = least_squares(residuals, np.ones(len(x0)), bounds=(np.asarray(lo) / scale,
                                                             np.asarray(hi) / scale))
    dof = max(1, measured.size - len(x0))
    cov = np.linalg.pinv(sol.jac.T @ sol.jac) * float(sol.fun @ sol.fun) / dof
    stderr = {n: float(np.sqrt(max(cov[i, i], 0.0)) * scale[i]) for i, n in enumerate(names)}
    return sol.x * scale, stderr


def fit_dense(samples: list[LayerSample], gpu: GpuSpec,
              held_out_model: str = HELD_OUT_MODEL) -> TermFit:
    """`DENSE_TERMS` fitted on every sample but `held_out_model`'s, which are scored."""
    train = [s for s in samples if s.model != held_out_model]
    test = [s for s in samples if s.model == held_out_model]
    if not train:
        raise ValueError(f"no vidur operator samples for {gpu.name} besides {held_out_model}")
    design = DenseDesign.of(train, gpu)
    measured = np.array([s.measured_s for s in train])
    x, stderr = _log_fit(lambda v: design.seconds(*v), [0.5, 0.7, 2e-5], [1e-3, 1e-3, 0.0],
                         [1.0, 1.0, 1e-3], measured, DENSE_TERMS,
                         _group_weights([s.model for s in train]))
    errors = []
    for split, part in (("train", train), ("test", test)):
        for model in sorted({s.model for s in part}):
            chosen = [s for s in part if s.model == model]
            errors.append(error_row(split, f"vidur_layer:{model}",
                                     np.array([s.measured_s for s in chosen]),
                                     DenseDesign.of(chosen, gpu).seconds(*x)))
    return TermFit(dict(zip(DENSE_TERMS, map(float, x), strict=True)), stderr, errors)


def all_reduce_s(gpu: GpuSpec, num_workers, num_bytes, efficiency: float,
                 latency_s: float) -> np.ndarray:
    """One ring all-reduce as `sim.cost.cost_model` prices it (NVLink, else PCIe)."""
    link = gpu.nvlink_bandwidth_bytes_per_s or gpu.pcie_bandwidth_bytes_per_s
    n = np.asarray(num_workers, dtype=float)
    return 2 * (n - 1) / n * np.asarray(num_bytes, float) / (link * efficiency) + latency_s


def _one_node_all_reduces(records, network: str) -> list:
    """All-reduce rows of `network` whose workers all sit in one node (the a100_dgx profile
    also times 2-16 workers spread over nodes, over the network between them)."""
    return [r for r in records if r.network == network and r.collective == "all_reduce"
            and r.devices_per_node == r.num_workers]


def fit_communication(records, network: str, gpu: GpuSpec) -> TermFit:
    """`COMM_TERMS` on the network's all-reduce times of fewer than `HELD_OUT_WORKERS`
    workers; those of `HELD_OUT_WORKERS` scored."""
    rows = _one_node_all_reduces(records, network)
    train = [r for r in rows if r.num_workers < HELD_OUT_WORKERS]
    test = [r for r in rows if r.num_workers == HELD_OUT_WORKERS]
    if not train:
        raise ValueError(f"no all-reduce rows of {network} under {HELD_OUT_WORKERS} workers")

    def predict(part, v):
        return all_reduce_s(gpu, [r.num_workers for r in part], [r.size for r in part], *v)

    measured = np.array([r.median_ms / 1e3 for r in train])
    x, stderr = _log_fit(lambda v: predict(train, v), [0.7, 2e-5], [1e-3, 0.0], [1.0, 1e-3],
                         measured, COMM_TERMS, _group_weights([r.num_workers for r in train]))
    errors = []
    for split, part in (("train", train), ("test", test)):
        for n in sorted({r.num_workers for r in part}):
            chosen = [r for r in part if r.num_workers == n]
            errors.append(error_row(split, f"vidur_all_reduce:{network}:tp{n}",
                                     np.array([r.median_ms / 1e3 for r in chosen]),
                                     predict(chosen, x)))
    return TermFit(dict(zip(COMM_TERMS, map(float, x), strict=True)), stderr, errors)


@dataclass(frozen=True)
class VidurFit:
    """Both fits of one GPU kind, with what they read."""

    gpu: str
    dense: TermFit
    communication: TermFit
    all_reduce_table: AllReduceTableFit
    num_layer_samples: int
    num_all_reduce_rows: int
    models: tuple[str, ...]
    skipped: tuple[str, ...]


def fit_vidur(gpu_kind: str, root: Path = VIDUR_DIR) -> VidurFit:
    """Dense and all-reduce fits of `gpu_kind` from the vidur folder `root`."""
    from calibrate.gpu_data.vidur import import_vidur

    device, network = VIDUR_GPUS[gpu_kind]
    gpu = get_gpu(gpu_kind)
    result = import_vidur(Path(root))
    samples, skipped = layer_samples(result.records.get("operator_time", []), device)
    collectives = result.records.get("collective_time", [])
    dense = fit_dense(samples, gpu)
    comm = fit_communication(collectives, network, gpu)
    one_node = _one_node_all_reduces(collectives, network)
    table = fit_all_reduce_table(one_node, network, "nvlink",
                                 f"vidur@{VIDUR_COMMIT} data/gpu/vidur")
    return VidurFit(gpu_kind, dense, comm, table, len(samples), len(one_node),
                    tuple(sorted({s.model for s in samples})), tuple(skipped))


def _coefficients(source, gpu_kind: str, fit: VidurFit, h100_layer_s: float):
    """The source profile's coefficients, scaled to `gpu_kind` (`calibrate.gpu_scaled`), with
    the vidur-fitted terms and the fixed step cost less the source's layers' floor."""
    from calibrate.gpu_scaled import scale_profile

    scaled = scale_profile(source, gpu_kind, PROFILE_NAMES[gpu_kind]).coefficients
    host_s = max(0.0, source.coefficients.step_overhead_s - SOURCE_NUM_LAYERS * h100_layer_s)
    return scaled.model_copy(update={**fit.dense.values, **fit.communication.values,
                                     "all_reduce_fits": fit.all_reduce_table.fits,
                                     "step_overhead_s": host_s})


def _description(source, fit: VidurFit, host_s: float, h100_layer_s: float) -> str:
    from calibrate.gpu_scaled import program_scale

    scale = program_scale(source.hardware.gpu, fit.gpu)
    return (
        f"Dense part fitted on vidur operators, LoRA kernels scaled. Fitted on {fit.gpu} "
        f"measurements: vidur (microsoft/vidur @ {VIDUR_COMMIT}, MIT) operator CUDA times, "
        f"slice data/gpu/vidur ({fit.num_layer_samples} layer samples: every per-layer "
        f"operator but attention, TP 1/2/4/8, 1-4,096 tokens; models "
        f"{', '.join(m for m in fit.models if m != HELD_OUT_MODEL)}; {HELD_OUT_MODEL} held "
        f"out) fit gemm_flops_efficiency, memory_bandwidth_efficiency and layer_overhead_s; "
        f"its one-node DGX all-reduce times ({fit.num_all_reduce_rows} rows; 8 workers held "
        f"out) fit communication_efficiency and communication_latency_s, and per TP degree "
        f"(2, 4, 8, each on its own rows) the all_reduce_fits that price those degrees. "
        f"Engine of "
        f"the operator times: vidur's profiler (each operator timed alone in PyTorch, no "
        f"serving engine). Not measured on {fit.gpu}: attention efficiency, per-sequence and "
        f"adapter-load costs kept from profile {source.name} ({source.engine.name} "
        f"{source.engine.version} on {source.hardware.gpu}, agullo-dt); its LoRA kernel "
        f"programs scaled x{scale:.2f} by SMs x clock (calibrate/gpu_scaled.py); fixed step "
        f"cost {host_s * 1e3:.2f} ms = that profile's "
        f"{source.coefficients.step_overhead_s * 1e3:.2f} ms less its {SOURCE_NUM_LAYERS} "
        f"layers x the H100's fitted {h100_layer_s * 1e6:.0f} us layer floor, now priced "
        f"per layer. Held-out whole steps: Splitwise Llama-2-70B "
        f"prompt and token times (docs/validation-gpu.md)."
        + (f" Left out: {'; '.join(fit.skipped)}." if fit.skipped else ""))


def _per_gpu_description(per_gpu: dict, ring: dict) -> str:
    """Why the shipped all-reduce base is vidur's per-degree fits plus a latency per GPU."""
    return (
        f" communication_latency_per_gpu_s ({per_gpu['latency_per_gpu_s'] * 1e6:.1f} us x TP "
        f"added to every all-reduce) fitted on Splitwise TP 2/4 token steps "
        f"({per_gpu['rows']}); TP 8 held out. Base: vidur's per-degree all_reduce_fits "
        f"(kernel times measured on this GPU) plus this one term, RMS log error "
        f"{per_gpu['rms_log_error']:.3f} on those rows, against "
        f"{ring['rms_log_error']:.3f} for the alternative (per-degree fits dropped, ring "
        f"latency refitted as a + b x TP, calibrate/gpu_splitwise.py): chosen on principle as "
        f"not clearly worse on TP 2/4, since it keeps the measured kernels and adds one "
        f"parameter (docs/validation-gpu.md).")


def create_vidur_profile(source, gpu_kind: str, root: Path = VIDUR_DIR,
                         splitwise_root: Path | None = None):
    """The profile of `gpu_kind`: dense and all-reduce terms fitted on vidur under `root`, the
    rest carried from the H100-64GB profile `source`; its held-out errors include Splitwise's
    whole steps on this GPU (`calibrate.gpu_splitwise`)."""
    from calibrate.fitter import FitResult, create_calibration_profile
    from calibrate.gpu_splitwise import (
        FIT_TP,
        SPLITWISE_DIR,
        fit_communication_on_splitwise,
        fit_latency_per_gpu,
        load_records,
        splitwise_error_rows,
    )

    fit = fit_vidur(gpu_kind, root)
    h100 = fit if gpu_kind == "H100-SXM" else fit_vidur("H100-SXM", root)
    h100_layer_s = h100.dense.values["layer_overhead_s"]
    coeffs = _coefficients(source, gpu_kind, fit, h100_layer_s)
    splitwise_root = splitwise_root or SPLITWISE_DIR
    records = load_records(splitwise_root)
    per_gpu = fit_latency_per_gpu(coeffs, gpu_kind, records)
    ring = fit_communication_on_splitwise(coeffs, gpu_kind, records, per_gpu=True)
    coeffs = coeffs.model_copy(
        update={"communication_latency_per_gpu_s": per_gpu["latency_per_gpu_s"]})
    steps = splitwise_error_rows(coeffs, gpu_kind, splitwise_root, fit_tp=FIT_TP)
    result = FitResult(coeffs=coeffs, terms=DENSE_TERMS + COMM_TERMS + (
                           "all_reduce_fits", "communication_latency_per_gpu_s"),
                       stderr={**fit.dense.stderr, **fit.communication.stderr},
                       errors=fit.dense.errors + fit.communication.errors
                       + fit.all_reduce_table.errors + steps,
                       term_shares={}, num_iterations=0)
    settings = dict(source.engine.settings)
    settings["dataset"] = f"vidur@{VIDUR_COMMIT} (dense, all-reduce); {settings['dataset']} " \
                          "(host costs, LoRA kernels, scaled)"
    return create_calibration_profile(
        result, name=PROFILE_NAMES[gpu_kind], model=source.model,
        engine=dict(name=source.engine.name, version=source.engine.version, settings=settings),
        hardware=dict(gpu=gpu_kind, fingerprint=dict(
            system=f"vidur {VIDUR_GPUS[gpu_kind][1]} profile (DGX node)")),
        packages=dict(source.packages), num_samples=fit.num_layer_samples
        + fit.num_all_reduce_rows, load_average=(0.0, 0.0, 0.0),
        description=_description(source, fit, coeffs.step_overhead_s, h100_layer_s)
        + _per_gpu_description(per_gpu, ring),
        commands=("python data/cut_gpu_slices.py FULL_DATA  (via data/cut_slices.py)",
                  "python -m calibrate.gpu_fit"),
        adapter_loads=source.fit.adapter_loads)


def write_vidur_profiles(source, folder: Path) -> list[Path]:
    """Write the profile of every GPU kind of `VIDUR_GPUS` into `folder`."""
    from calibrate.fitter import write_profile

    paths = []
    for gpu_kind, name in PROFILE_NAMES.items():
        path = Path(folder) / f"{name}.yaml"
        write_profile(create_vidur_profile(source, gpu_kind), path)
        paths.append(path)
    return paths
