"""Cut the small trace slices shipped in data/traces from the full upstream files.

    python data/cut_slices.py /path/to/full/data   # holding traces/, gpu/ and perf/

The GPU measurement slices (data/gpu) are cut by `data/cut_gpu_slices.py`, called from here.

Rows are copied byte for byte (the first N data rows, the header kept); ServeGen's per-client
rate series are reduced to one mean rate per client, computed exactly as
`sim.workload.traces.servegen_client_rates` computes it from the full files. Licence files are
copied beside the data. Rerunning it reproduces the shipped files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import cut_gpu_slices  # beside this script (data/ is on sys.path when it runs)

HERE = Path(__file__).resolve().parent
SLICES = {
    # dataset folder, file, data rows kept (the header of a CSV is kept on top)
    "azure_llm_2023": ("AzureLLMInferenceTrace_conv.csv", 4000),
    "mooncake_fast25": ("conversation_trace.jsonl", 1000),
    "length_distributions": ("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 4000),
}


def cut_rows(source: Path, target: Path, rows: int, header: bool) -> None:
    """The first `rows` data lines of `source`, byte for byte, without a trailing newline when
    the source has none at that point (the upstream Azure file has no final newline)."""
    with source.open("rb") as f:
        lines = [f.readline() for _ in range(rows + int(header))]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"".join(lines))


def cut_servegen(source: Path, target: Path) -> None:
    """One row per ServeGen client: its id and mean request rate over the 14 days."""
    sys.path.insert(0, str(HERE.parent))
    from sim.workload.traces import servegen_client_rates

    files = sorted(source.glob("chunk-*-trace.csv"), key=lambda p: int(p.stem.split("-")[1]))
    rates = servegen_client_rates(source)
    lines = ["client,mean_rate_rps"] + [f"{p.stem.split('-')[1]},{float(r)!r}"
                                         for p, r in zip(files, rates, strict=True)]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(full: Path) -> None:
    for folder, (name, rows) in SLICES.items():
        cut_rows(full / "traces" / folder / name, HERE / "traces" / folder / name, rows,
                 header=name.endswith(".csv"))
        shutil.copyfile(full / "traces" / folder / "LICENSE", HERE / "traces" / folder / "LICENSE")
    servegen = full / "traces" / "servegen_m_small"
    cut_servegen(servegen, HERE / "traces" / "servegen_m_small" / "client_rates.csv")
    shutil.copyfile(servegen / "LICENSE", HERE / "traces" / "servegen_m_small" / "LICENSE")
    cut_gpu_slices.main(full)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
