"""Importer of Splitwise's performance model (Mutinifni/splitwise-sim `data/perf_model.csv`):
measured prompt (prefill) and token (decode step) times of Llama-2-70B (TP 2/4/8) and
BLOOM-176B (TP 8) on DGX-A100 and DGX-H100, vs prompt size, batch size and output tokens.
The team keeps it as `perf/splitwise_perf_model.csv`; the repository's slice as
`gpu/splitwise/splitwise_perf_model.csv`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calibrate.gpu_data.base import Cell, DatasetMissingError, ImportResult, read_csv_rows

DATASET = "splitwise"
FILE = "splitwise_perf_model.csv"
COLUMNS = ("model", "hardware", "prompt_size", "batch_size", "token_size", "peak_power",
           "average_power", "prompt_time", "token_time", "e2e_time", "tensor_parallel")
HARDWARE = ("a100-80gb", "h100-80gb", "h100-80gb-pcap")
"""Splitwise's machines: DGX-A100 and DGX-H100 (80 GB parts; pcap: power-capped)."""
MODELS = ("llama2-70b", "bloom-176b")


@dataclass(frozen=True)
class SplitwisePhaseRecord:
    """One measured request batch: `batch_size` prompts of `prompt_size` tokens prefilled in
    `prompt_time_ms`, then `token_size` tokens decoded at `token_time_ms` per step."""

    model: str
    hardware: str
    tensor_parallel: int
    prompt_size: int
    batch_size: int
    token_size: int
    prompt_time_ms: float
    token_time_ms: float
    """Time of one decode step of the batch."""
    e2e_time_ms: float
    peak_power: float
    """Normalized power (Splitwise's units)."""
    average_power: float
    source_file: str
    source_line: int


def import_splitwise(root: Path) -> ImportResult:
    """`phase_time` records of the performance-model CSV in `root`."""
    if not root.is_dir():
        raise DatasetMissingError(f"{DATASET}: dataset folder {root} does not exist")
    path = next((p for p in (root / FILE, root / f"{FILE}.gz") if p.exists()), None)
    if path is None:
        raise DatasetMissingError(f"{DATASET}: {root} is incomplete: missing {FILE}")
    result = ImportResult(DATASET)
    name = path.name
    for line, row in read_csv_rows(path, root, COLUMNS):
        cell = Cell(name, line, row)
        result.add("phase_time", [SplitwisePhaseRecord(
            model=cell.str("model", allowed=MODELS),
            hardware=cell.str("hardware", allowed=HARDWARE),
            tensor_parallel=cell.int("tensor_parallel", min_value=1),
            prompt_size=cell.int("prompt_size", min_value=1),
            batch_size=cell.int("batch_size", min_value=1),
            token_size=cell.int("token_size", min_value=1),
            prompt_time_ms=cell.float("prompt_time"), token_time_ms=cell.float("token_time"),
            e2e_time_ms=cell.float("e2e_time"), peak_power=cell.float("peak_power"),
            average_power=cell.float("average_power"), source_file=name, source_line=line)])
    return result
