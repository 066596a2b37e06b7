"""Cut `data/gpu/agullo-dt/engine_metrics.csv`: what vLLM's own counters said during each
serving run of `ml_modelling/test_dataset`, summarised per run.

    python data/gpu/cut_agullo_engine_metrics.py UPSTREAM_CHECKOUT

UPSTREAM_CHECKOUT is a checkout of FerranAgulloLopez/GPULLMAdapterOptimization at bae36e2d (the
commit `agullo-dt` was copied from; the team's copy left these files out). Its benchmark client
polled the server's Prometheus endpoint every 2 s for the whole hour
(`benchmarks/lora/concurrent_metrics_checker.py`) and saved each series as `.npy` beside the
run: running and waiting requests, KV cache usage (a fraction), cumulative preemptions, and
cumulative finished requests, prompt and generated tokens. Only the first four are kept: the
checker reads the first Prometheus line that matches a name, and the token and finished
counters have several labelled lines whose order changes between polls (the series jump
between them: at times down to zero).

One row per run that has the series (829 of the 990 runs; the others' client did not save
them). Columns: the run id as `derived/runs_summary.csv` spells it; `num_samples` (a poll
takes longer than 2 s on a loaded server: about 250 polls in an overloaded hour); over the
polls from 900 s after the first to 60 s before the last (the hour's steady part: the client
stops 15 s after the hour, and its requests are cancelled at the hour's end), the median of
`running`, `waiting` and `kv_usage`, the largest `waiting`, and the preemptions per second.
Rerunning reproduces the bytes.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "agullo-dt" / "engine_metrics.csv"
GROUP = Path("benchmarks/lora/definitive_results/ml_modelling/test_dataset")
RUN_ID_PREFIX = "br/ml_modelling/test_dataset"
SERIES = ("time", "num_running", "num_waiting", "gpu_cache_usage_perc", "num_preempted")
SKIP_START_S, SKIP_END_S = 900.0, 60.0
COLUMNS = ("run_id", "num_samples", "running_median", "waiting_median", "waiting_max",
           "kv_usage_median", "preemptions_per_s")


def summarize_run(series: dict[str, np.ndarray]) -> dict[str, float] | None:
    """The row of one run from its series (None when its steady span holds under 10 samples).
    The series are cut to the shortest: the client appends the time last, so a poll cut short
    by the end of the run can leave one series a sample longer."""
    size = min(map(len, series.values()))
    series = {name: values[:size] for name, values in series.items()}
    t = series["time"] - series["time"][0]
    span = (t >= SKIP_START_S) & (t <= t[-1] - SKIP_END_S)
    if span.sum() < 10:
        return None
    first, last = np.flatnonzero(span)[[0, -1]]
    preempted = series["num_preempted"]
    return dict(num_samples=len(t),
                running_median=float(np.median(series["num_running"][span])),
                waiting_median=float(np.median(series["num_waiting"][span])),
                waiting_max=float(series["num_waiting"][span].max()),
                kv_usage_median=round(float(np.median(series["gpu_cache_usage_perc"][span])), 4),
                preemptions_per_s=round(float(preempted[last] - preempted[first])
                                        / (t[last] - t[first]), 4))


def main(upstream: Path, out: Path = OUT) -> int:
    rows = []
    for run_dir in sorted(p.parent for p in (upstream / GROUP).glob("*/*/*/time.npy")):
        series = {name: np.load(run_dir / f"{name}.npy") for name in SERIES}
        row = summarize_run(series)
        if row is not None:
            rel = run_dir.relative_to(upstream / GROUP).as_posix()
            rows.append(dict(run_id=f"{RUN_ID_PREFIX}/{rel}", **row))
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{out.name}: {len(rows)} runs")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
