"""Cut the GPU measurement slices shipped in data/gpu from the full datasets (the team's
`shared/data/gpu/<dataset>` and `shared/data/perf`). Called by `data/cut_slices.py FULL_DATA`;
rerunning reproduces the shipped bytes (gzip written with mtime 0).

Files are copied byte for byte unless a rule below cuts rows (kept rows are byte-identical,
header on top) or gzips a file (`.gz` added to its name).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
ESTIMATORS = "raw/digital_twin_dynamic/estimators"
AGULLO_MODEL = "llama-3.1-8b-instruct"
AGULLO_SWEEPS = ("predictor_default_latency", "predictor_latency_overhead", "predictor_loading")
TEST_DATASET = "raw/benchmarks/lora/definitive_results/ml_modelling/test_dataset"
TEST_RUNS = 12  # run folders per model: the first in name order of its first rate folder
TRACE_RUNS = f"est/predictor_latency_overhead/{AGULLO_MODEL}/"
TRACE_STEPS_PER_RUN = 1000


def write_gzip(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))


def copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def cut_agullo(full: Path, out: Path) -> None:
    """runs_summary.csv whole (gzipped); the step trace's first 1,000 steps of each Llama-3.1-8B
    latency-overhead run; the raw folders (launcher.sh, client log) of the first 12 runs of the
    first rate folder of each model of ml_modelling/test_dataset; the Llama-3.1-8B folders of
    the three predictor sweeps without the client logs of runs whose result JSON is kept (logs
    of runs without one are kept)."""
    copy(full / "LICENSE", out / "LICENSE")
    write_gzip(out / "derived/runs_summary.csv.gz",
               (full / "derived/runs_summary.csv").read_bytes())
    kept, counts = [], {}
    with gzip.open(full / "derived/per_step_scheduler_trace.csv.gz", "rb") as f:
        kept.append(f.readline())
        for line in f:
            run_id = line.split(b",", 1)[0].decode()
            if run_id.startswith(TRACE_RUNS) and counts.get(run_id, 0) < TRACE_STEPS_PER_RUN:
                counts[run_id] = counts.get(run_id, 0) + 1
                kept.append(line)
    write_gzip(out / "derived/per_step_scheduler_trace.csv.gz", b"".join(kept))
    for sweep in AGULLO_SWEEPS:
        base = full / ESTIMATORS / sweep
        for path in sorted(base.glob(f"{AGULLO_MODEL}_*.json")):
            copy(path, out / ESTIMATORS / sweep / path.name)
        for path in sorted((base / AGULLO_MODEL).rglob("*")):
            if path.is_dir():
                continue
            has_json = any(path.parent.glob("openai-*.json"))
            if path.name.startswith("log_") and has_json:
                continue
            copy(path, out / path.relative_to(full))
    for model in sorted(p for p in (full / TEST_DATASET).iterdir() if p.is_dir()):
        rates = sorted(p for p in model.iterdir() if p.is_dir())[0]
        for run in sorted(p for p in rates.iterdir() if p.is_dir())[:TEST_RUNS]:
            for path in sorted(run.iterdir()):
                copy(path, out / path.relative_to(full))


def gzip_copy(source: Path, target: Path) -> None:
    write_gzip(target.with_name(target.name + ".gz"), source.read_bytes())


VIDUR_FIT_MODELS = {  # vidur GPU -> models whose operator profiles the dense fit reads
    "h100": ("Qwen/Qwen-72B", "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b",
             "meta-llama/Llama-2-70b-hf"),
    "a100": ("Qwen/Qwen-72B", "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b",
             "meta-llama/Llama-2-70b-hf", "meta-llama/Meta-Llama-3-8B",
             "meta-llama/Meta-Llama-3-70B"),
}
VIDUR_TOKENS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
                2048, 3072, 4096)
"""Token counts kept of the other models' profiles (the whole files are 0.7-1.2 MB each):
log-spaced over vidur's 1-4,096, every TP degree."""


def cut_rows(source: Path, target: Path, keep) -> None:
    """`source`'s header and the rows `keep(row_dict)` accepts, byte-identical, gzipped."""
    import csv

    lines = source.read_bytes().splitlines(keepends=True)
    header = next(csv.reader([lines[0].decode()]))
    kept = [lines[0]] + [line for line in lines[1:]
                         if keep(dict(zip(header, next(csv.reader([line.decode()])),
                                          strict=True)))]
    write_gzip(target.with_name(target.name + ".gz"), b"".join(kept))


def cut_vidur(full: Path, out: Path) -> None:
    """Llama-2-7B's operator profiles on H100 and A100 and the two DGX network profiles,
    whole, gzipped; the other models of `VIDUR_FIT_MODELS` at the `VIDUR_TOKENS` token counts
    (every TP degree), gzipped."""
    copy(full / "LICENSE", out / "LICENSE")
    base = "raw/data/profiling"
    for gpu in ("h100", "a100"):
        path = f"{base}/compute/{gpu}/meta-llama/Llama-2-7b-hf/mlp.csv"
        gzip_copy(full / path, out / path)
        for model in VIDUR_FIT_MODELS[gpu]:
            path = f"{base}/compute/{gpu}/{model}/mlp.csv"
            cut_rows(full / path, out / path,
                     lambda row: int(row["num_tokens"]) in VIDUR_TOKENS)
        for collective in ("all_reduce", "send_recv"):
            path = f"{base}/network/{gpu}_dgx/{collective}.csv"
            gzip_copy(full / path, out / path)


def cut_llmservingsim(full: Path, out: Path) -> None:
    """H100 Llama-3.1-8B TP 1 per-layer table (v0 layout) and the RTX 4090 Llama-3.1-8B
    profile (perf layout, vLLM 0.19) without its skew tables; CSVs gzipped."""
    copy(full / "LICENSE", out / "LICENSE")
    layers = "raw/profiler/v0/perf_models/H100/meta-llama/Llama-3.1-8B/tp1/layers.csv"
    gzip_copy(full / layers, out / layers)
    rtx = "raw/profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16"
    copy(full / rtx / "meta.yaml", out / rtx / "meta.yaml")
    for table in ("dense.csv", "per_sequence.csv", "attention.csv"):
        gzip_copy(full / rtx / "tp1" / table, out / rtx / "tp1" / table)


def cut_splitwise(full: Path, out: Path) -> None:
    """The whole performance-model CSV, gzipped, with the licence and the team's README."""
    for name in ("LICENSE", "README.md"):
        copy(full / name, out / name)
    gzip_copy(full / "splitwise_perf_model.csv", out / "splitwise_perf_model.csv")


MEMORY_GAP_RUNS = "raw/benchmarks/definitive_results/advisor/output_length/_130/llama-2-7b"
MEMORY_GAP_OFFLINE = ("raw/benchmarks_simple/definitive_results/analysis/prefill_vs_decode/"
                      "summary_table")


def cut_memory_gap(full: Path, out: Path) -> None:
    """Llama-2-7B's max_num_seqs sweep at output length 130 (all 10 run folders) and the
    offline prefill_vs_decode summary-table runs (4 models), whole; the licence and the
    team's SOURCE.txt (which names the engine's version)."""
    for name in ("LICENSE", "SOURCE.txt"):
        copy(full / name, out / name)
    for folder in (MEMORY_GAP_RUNS, MEMORY_GAP_OFFLINE):
        for path in sorted((full / folder).rglob("*")):
            if path.is_file() and path.parent != full / folder:
                copy(path, out / path.relative_to(full))


def main(full: Path) -> None:
    """Every GPU slice from the data root `full` (holding gpu/<dataset> and perf/)."""
    gpu = HERE / "gpu"
    cut_agullo(full / "gpu" / "agullo-dt", gpu / "agullo-dt")
    cut_vidur(full / "gpu" / "vidur", gpu / "vidur")
    cut_llmservingsim(full / "gpu" / "llmservingsim-profiles", gpu / "llmservingsim-profiles")
    cut_splitwise(full / "perf", gpu / "splitwise")
    cut_memory_gap(full / "gpu" / "memory-gap", gpu / "memory-gap")
