"""Cut the parts of the agullo-dt slice that `calibrate.gpu_samples` reads beyond what
`data/cut_gpu_slices.py` ships (the whole `derived/runs_summary.csv.gz`; the step trace's first
1,000 steps per run, which for the distinct-adapter sweep are the client's warm-up only).

    python data/gpu/cut_agullo_slice.py FULL_GPU_DATA   # the folder holding agullo-dt/

Writes, under data/gpu/agullo-dt/: `overhead_steps.csv`: per run of the
`predictor_latency_overhead` sweep, the median step interval and distinct adapters per step of
the main benchmark (the steps after the client's warm-up, one request per adapter) and of the
warm-up, from the whole `derived/per_step_scheduler_trace.csv.gz`; and
`predictor_loading_<model>_constants.json` (upstream, whole: mean milliseconds of activating an
adapter from host memory into a device slot, by max_lora_rank, then adapter rank).
Rerunning reproduces the bytes.
"""

from __future__ import annotations

import csv
import gzip
import re
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent / "agullo-dt"
RUN = re.compile(r"_(\d+)_(\d+)_(\d+)__(\d+)_(\d+)_(\d+)$")


def overhead_steps(trace: Path, out_dir: Path = OUT) -> None:
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    with gzip.open(trace, "rt", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if "overhead_small/output" in row["run_id"] and row["interval_since_prev_step_ms"]:
                steps[row["run_id"]].append((float(row["interval_since_prev_step_ms"]),
                                             int(row["unique_adapters_in_batch"])))
    with open(out_dir / "overhead_steps.csv", "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(["run_id", "max_num_seqs", "max_loras", "max_lora_rank", "input_len",
                      "output_len", "restrict_loras", "num_main_steps", "median_step_ms",
                      "median_unique_adapters", "num_warmup_steps", "warmup_median_step_ms"])
        for run_id in sorted(steps):
            seqs, loras, rank, inp, outl, num = map(int, RUN.search(run_id).groups())
            # The client first sends one request per adapter, one at a time (batch 1).
            warm = num * outl if num > 1 else 0
            main, warmup = steps[run_id][warm:], steps[run_id][:warm]
            out.writerow([run_id, seqs, loras, rank, inp, outl, num, len(main),
                          round(statistics.median(s for s, _ in main), 4),
                          statistics.median(a for _, a in main), len(warmup),
                          round(statistics.median(s for s, _ in warmup), 4) if warmup else ""])


def main(full: Path, out_dir: Path = OUT) -> None:
    src = full / "agullo-dt"
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "LICENSE", out_dir / "LICENSE")
    loading = src / "raw" / "digital_twin_dynamic" / "estimators" / "predictor_loading"
    for model in ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"):
        shutil.copyfile(loading / f"{model}_constants.json",
                        out_dir / f"predictor_loading_{model}_constants.json")
    overhead_steps(src / "derived" / "per_step_scheduler_trace.csv.gz", out_dir)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
