"""Importer of LLMServingSim's profiler output (casys-kaist/LLMServingSim `profiler/`): per-layer
GPU times of one transformer layer vs tokens, and attention times vs prefill chunk and decode
batch. Two layouts:

* `v0/perf_models/<hw>/<org>/<model>/tp<N>/layers.csv` (H100: Llama-3.1-8B/70B, Mixtral-8x7B):
  `layer_name,input,kv_cache,tp_size,latency(ns)`;
* `perf/<hw>/<org>/<model>/<variant>/tp<N>/{dense,per_sequence,moe,attention}.csv` with a
  `meta.yaml` (vLLM 0.19; RTX 4090, RTX PRO 6000).

Not read, and counted in the result's exclusions: `skew.csv` / `skew_fit.csv` (LLMServingSim's
batch-skew corrections, fitted by it) and the v0 `attention.csv` tables (Vidur-style statistics,
TP 4 only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from calibrate.gpu_data.base import (
    Cell,
    DatasetMissingError,
    GpuDataError,
    ImportResult,
    read_csv_rows,
    rel,
)

DATASET = "llmservingsim-profiles"
PROFILER = "raw/profiler"
TABLES = {
    # file: (count column, time column, time unit to us)
    "layers.csv": ("input", "latency(ns)", 1e-3),
    "dense.csv": ("tokens", "time_us", 1.0),
    "per_sequence.csv": ("sequences", "time_us", 1.0),
    "moe.csv": ("tokens", "time_us", 1.0),
}
ATTENTION_COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
NOT_READ = ("skew.csv", "skew_fit.csv")


@dataclass(frozen=True)
class LayerTimeRecord:
    """GPU time of one layer operator of one transformer layer (or the model's head/tail:
    embedding, lm_head, sampler) at a token or sequence count."""

    hardware: str
    """Profile's hardware folder: H100, RTX4090, RTXPRO6000."""
    model: str
    """'<org>/<model>'."""
    variant: str
    """Weights' dtype folder ('bf16'; '' for the v0 layout)."""
    engine: str
    """'vllm 0.19.0' from meta.yaml; '' when the layout records none (v0)."""
    tensor_parallel: int
    table: str
    """layers (v0), dense, per_sequence, moe."""
    layer: str
    """Operator: q_proj, qkv_proj, gate_up_proj, act_fn, lm_head, attn (v0), ..."""
    num_tokens: int
    """Tokens in the batch (sequences for per_sequence tables)."""
    kv_cache_tokens: int | None
    """KV tokens (v0 layers.csv; None elsewhere)."""
    activated_experts: int | None
    """moe.csv only."""
    time_us: float
    source_file: str
    source_line: int


@dataclass(frozen=True)
class AttentionTimeRecord:
    """Attention time of one layer for a batch of one prefill chunk plus `n_decode` decodes
    (perf layout's attention.csv)."""

    hardware: str
    model: str
    variant: str
    engine: str
    tensor_parallel: int
    prefill_chunk: int
    kv_prefill: int
    n_decode: int
    kv_decode: int
    time_us: float
    source_file: str
    source_line: int


def import_llmservingsim(root: Path) -> ImportResult:
    """`layer_time` and `attention_time` records of every profile under `root`."""
    if not root.is_dir():
        raise DatasetMissingError(f"{DATASET}: dataset folder {root} does not exist")
    base = root / PROFILER
    files = sorted(p for p in base.rglob("*.csv*") if p.is_file()) if base.is_dir() else []
    if not files:
        raise DatasetMissingError(f"{DATASET}: {root} is incomplete: no {PROFILER}/**/*.csv")
    result = ImportResult(DATASET)
    for path in files:
        name = path.name.removesuffix(".gz")
        where = _where(path, root)
        if name in TABLES:
            result.add("layer_time", read_layer_table(path, root, where, name))
        elif name == "attention.csv" and where["engine"]:
            result.add("attention_time", read_attention_table(path, root, where))
        elif name in NOT_READ or name == "attention.csv":
            result.exclude(f"files not read ({name}: see the module docstring)")
        else:
            raise GpuDataError(rel(path, root), 1, "file", path.name, "an unknown table")
    return result


def _where(path: Path, root: Path) -> dict:
    """Hardware, model, variant, TP and engine from the file's path (and meta.yaml)."""
    name = rel(path, root)
    parts = path.relative_to(root / PROFILER).parts
    tp = re.fullmatch(r"tp(\d+)", parts[-2])
    if tp is None:
        raise GpuDataError(name, 1, "path", parts[-2], "a tp<N> folder expected")
    if parts[0] == "perf":  # perf/<hw>/<org>/<model>/<variant>/tp<N>/<file>
        hardware, model, variant = parts[1], f"{parts[2]}/{parts[3]}", parts[4]
        engine = _engine(path.parent.parent / "meta.yaml", root)
    else:  # v0/perf_models/<hw>/<org>/<model>/tp<N>/<file>
        hardware, model, variant, engine = parts[2], f"{parts[3]}/{parts[4]}", "", ""
    return {"hardware": hardware, "model": model, "variant": variant, "engine": engine,
            "tensor_parallel": int(tp.group(1))}


def _engine(meta: Path, root: Path) -> str:
    if not meta.exists():
        raise GpuDataError(rel(meta, root), 1, "file", meta.name, "missing beside tp<N>/")
    info = yaml.safe_load(meta.read_text(encoding="utf-8")) or {}
    version = info.get("vllm_version")
    if not isinstance(version, str):
        raise GpuDataError(rel(meta, root), 1, "vllm_version", version, "a version string")
    return f"vllm {version}"


def read_layer_table(path: Path, root: Path, where: dict, table: str) -> list[LayerTimeRecord]:
    """One record per row of a layers/dense/per_sequence/moe table."""
    count, time_column, to_us = TABLES[table]
    layer_column = "layer_name" if table == "layers.csv" else "layer"
    columns = (count, time_column) + ((layer_column,) if table != "moe.csv" else ())
    name, out = rel(path, root), []
    for line, row in read_csv_rows(path, root, columns):
        cell = Cell(name, line, row)
        if table == "layers.csv" and cell.int("tp_size", min_value=1) != where["tensor_parallel"]:
            raise GpuDataError(name, line, "tp_size", row["tp_size"],
                               f"{where['tensor_parallel']} (the tp folder) expected")
        out.append(LayerTimeRecord(
            **where, table=table.removesuffix(".csv"),
            layer="moe" if table == "moe.csv" else cell.str(layer_column),
            num_tokens=cell.int(count, min_value=1),
            kv_cache_tokens=cell.int("kv_cache") if "kv_cache" in row else None,
            activated_experts=cell.int("activated_experts") if table == "moe.csv" else None,
            time_us=cell.float(time_column) * to_us, source_file=name, source_line=line))
    return out


def read_attention_table(path: Path, root: Path, where: dict) -> list[AttentionTimeRecord]:
    """One record per row of a perf-layout attention table."""
    name, out = rel(path, root), []
    for line, row in read_csv_rows(path, root, ATTENTION_COLUMNS):
        cell = Cell(name, line, row)
        out.append(AttentionTimeRecord(
            **where, prefill_chunk=cell.int("prefill_chunk"), kv_prefill=cell.int("kv_prefill"),
            n_decode=cell.int("n_decode"), kv_decode=cell.int("kv_decode"),
            time_us=cell.float("time_us"), source_file=name, source_line=line))
    return out
