"""Importer of Vidur's operator profiles (microsoft/vidur `data/profiling`): CUDA time of each
transformer operator vs tokens and tensor parallelism on A100, A40 and H100, and all-reduce /
send-recv times vs size. Attention profiles are not in the team's copy.

    result = import_vidur(Path("shared/data/gpu/vidur"))
    result.records["operator_time"]   # VidurOperatorRecord, one per operator per CSV row
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from calibrate.gpu_data.base import (
    Cell,
    DatasetMissingError,
    GpuDataError,
    ImportResult,
    read_csv_rows,
    rel,
)

DATASET = "vidur"
PROFILING = "raw/data/profiling"
CONFIG_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                  "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers")
STATS = ("min", "max", "mean", "median", "std")
NETWORK_COLUMNS = ("rank", "num_workers", "size", "collective", "devices_per_node",
                   "max_devices_per_node")
COLLECTIVES = ("all_reduce", "send_recv")


@dataclass(frozen=True)
class VidurOperatorRecord:
    """CUDA time statistics of one operator of one layer, at one token count and TP degree
    (one row of `compute/<gpu>/<org>/<model>/mlp.csv`, one of its operators)."""

    gpu: str
    """Vidur's device name: a100, a40, h100."""
    model: str
    """'<org>/<model>' as in the path (meta-llama/Llama-2-7b-hf)."""
    operator: str
    """emb, input_layernorm, attn_pre_proj (QKV), attn_rope, attn_post_proj (O),
    post_attention_layernorm, mlp_up_proj, mlp_act, mlp_down_proj, add."""
    num_tokens: int
    num_tensor_parallel_workers: int
    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    vocab_size: int
    use_gated_mlp: bool
    min_ms: float
    max_ms: float
    mean_ms: float
    median_ms: float
    std_ms: float
    source_file: str
    source_line: int


@dataclass(frozen=True)
class VidurCollectiveRecord:
    """Time of one collective at one size and worker count (`network/<net>/<collective>.csv`)."""

    network: str
    """Vidur's network profile: a100_dgx, h100_dgx, a100_pairwise_nvlink, ..."""
    collective: str
    """all_reduce or send_recv."""
    num_workers: int
    devices_per_node: int
    max_devices_per_node: int
    rank: int
    size: int
    """Message size as Vidur's collective profiler logged it (its `size` column)."""
    min_ms: float
    max_ms: float
    mean_ms: float
    median_ms: float
    std_ms: float
    source_file: str
    source_line: int


def import_vidur(root: Path) -> ImportResult:
    """`operator_time` and `collective_time` records of every profile under `root`."""
    base = root / PROFILING
    if not root.is_dir():
        raise DatasetMissingError(f"{DATASET}: dataset folder {root} does not exist")
    compute = sorted(base.glob("compute/*/*/*/mlp.csv*"))
    network = sorted(base.glob("network/*/*.csv*"))
    if not compute and not network:
        raise DatasetMissingError(
            f"{DATASET}: {root} is incomplete: no {PROFILING}/compute/<gpu>/<org>/<model>/mlp.csv"
            f" and no {PROFILING}/network/<net>/<collective>.csv")
    result = ImportResult(DATASET)
    for path in compute:
        result.add("operator_time", read_operator_profile(path, root))
    for path in network:
        result.add("collective_time", read_collective_profile(path, root))
    if not compute:
        result.absent_parts.append(f"{PROFILING}/compute")
    if not network:
        result.absent_parts.append(f"{PROFILING}/network")
    return result


def _operators(header: list[str], name: str) -> list[str]:
    ops = []
    for column in header:
        match = re.fullmatch(r"time_stats\.(\w+)\.(min|max|mean|median|std)", column)
        if match and match.group(1) not in ops:
            ops.append(match.group(1))
        elif not match and column not in CONFIG_COLUMNS and column != "":
            raise GpuDataError(name, 1, "header", column, "an unknown column")
    if not ops:
        raise GpuDataError(name, 1, "header", ",".join(header), "no time_stats.* columns")
    return ops


def read_operator_profile(path: Path, root: Path) -> list[VidurOperatorRecord]:
    """One record per operator per row of a compute profile."""
    name = rel(path, root)
    parts = path.relative_to(root / PROFILING).parts  # compute, gpu, org, model, file
    gpu, model = parts[1], f"{parts[2]}/{parts[3]}"
    out, ops = [], None
    for line, row in read_csv_rows(path, root, CONFIG_COLUMNS):
        ops = ops or _operators(list(row), name)
        cell = Cell(name, line, row)
        config = dict(
            num_tokens=cell.int("num_tokens", min_value=1),
            num_tensor_parallel_workers=cell.int("num_tensor_parallel_workers", min_value=1),
            n_head=cell.int("n_head"), n_kv_head=cell.int("n_kv_head"),
            n_embd=cell.int("n_embd"), n_expanded_embd=cell.int("n_expanded_embd"),
            vocab_size=cell.int("vocab_size"),
            use_gated_mlp=cell.str("use_gated_mlp", allowed=("True", "False")) == "True")
        for op in ops:
            stats = {f"{s}_ms": cell.float(f"time_stats.{op}.{s}") for s in STATS}
            out.append(VidurOperatorRecord(gpu=gpu, model=model, operator=op, **config,
                                           **stats, source_file=name, source_line=line))
    return out


def read_collective_profile(path: Path, root: Path) -> list[VidurCollectiveRecord]:
    """One record per row of a network profile."""
    name = rel(path, root)
    network = path.parent.name
    collective = path.name.split(".")[0]
    if collective not in COLLECTIVES:
        raise GpuDataError(name, 1, "file", path.name, f"allowed: {', '.join(COLLECTIVES)}")
    out = []
    for line, row in read_csv_rows(path, root, NETWORK_COLUMNS):
        cell = Cell(name, line, row)
        cell.str("collective", allowed=(collective,))
        stats = {f"{s}_ms": cell.float(f"time_stats.{collective}.{s}") for s in STATS}
        out.append(VidurCollectiveRecord(
            network=network, collective=collective,
            num_workers=cell.int("num_workers", min_value=1),
            devices_per_node=cell.int("devices_per_node", min_value=1),
            max_devices_per_node=cell.int("max_devices_per_node", min_value=1),
            rank=cell.int("rank"), size=cell.int("size", min_value=1), **stats,
            source_file=name, source_line=line))
    return out
