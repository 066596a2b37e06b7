"""bench_multilora's analyses: how its cost grows with adapters, slots and queue length, how
flat its speed is across configurations (fits over one run's cases, recorded next to its
table), and a profile of one case."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def cost_growth(rows: list[dict]) -> dict | None:
    """Least-squares exponents of CPU microseconds per request in adapters, slots and
    1 + mean waiting queue (log-log), over every case; None with too few distinct cases."""
    if len(rows) < 5:
        return None
    y = np.log([1e6 * r["cpu_s"] / r["num_requests"] for r in rows])
    x = np.column_stack([np.ones(len(rows)), np.log([r["num_adapters"] for r in rows]),
                         np.log([r["max_loras"] for r in rows]),
                         np.log([1 + r["mean_waiting"] for r in rows])])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = float(np.abs(x @ coef - y).max())
    return dict(adapters_exponent=float(coef[1]), slots_exponent=float(coef[2]),
                queue_exponent=float(coef[3]), max_log_residual=residual)


def growth_row(recorded: list[dict]) -> dict | None:
    """The cost fit and the spread of speeds over one run's recorded rows (the values of
    bench/results/bench_multilora.json: configuration named "<adapters>a/<slots>s", speed in
    requests per CPU-second): the exponents of `cost_growth`, min / median / max speed, and
    the largest fastest / slowest ratio across configurations at one load (issue 25 asks for
    speed flat within 2x from 8 to 384 adapters)."""
    rows = [dict(num_adapters=int(v["config"].split("a/")[0]),
                 max_loras=int(v["config"].split("a/")[1].rstrip("s")),
                 cpu_s=v["num_requests"] / v["requests_per_cpu_s"],
                 num_requests=v["num_requests"], mean_waiting=v["mean_waiting"])
            for v in recorded]
    growth = cost_growth(rows)
    if growth is None or len({v["config"] for v in recorded}) < 3:
        return None  # two configurations cannot tell adapters from slots
    speeds = [v["requests_per_cpu_s"] for v in recorded]
    by_load: dict[float, list[float]] = {}
    for v in recorded:
        by_load.setdefault(v["load"], []).append(v["requests_per_cpu_s"])
    spread = max(max(s) / min(s) for s in by_load.values())
    sizes = sorted({v["num_requests"] for v in recorded})
    return dict(num_requests=", ".join(f"{n:,}" for n in sizes), num_cases=len(recorded),
                adapters_exponent=round(growth["adapters_exponent"], 3),
                slots_exponent=round(growth["slots_exponent"], 3),
                queue_exponent=round(growth["queue_exponent"], 3),
                max_log_residual=round(growth["max_log_residual"], 3),
                speed=f"{min(speeds):,.0f} / {float(np.median(speeds)):,.0f} / "
                      f"{max(speeds):,.0f}",
                spread_across_configs=round(spread, 2))


def profile(label: str, config, wl, top: int = 25) -> tuple[str, dict]:
    """cProfile of one case in this process: each function's share of the total (self time
    and cumulative), which stays meaningful on a loaded machine where seconds do not; and a
    row for the profiles table (Python calls per request, the largest self-time shares)."""
    import cProfile
    import pstats

    from sim.simulate import simulate

    num_requests = wl.num_turns  # single-turn workloads: one request per turn
    prof = cProfile.Profile()
    prof.runcall(simulate, config, wl, timeseries_interval_s=10.0)
    stats = pstats.Stats(prof)
    total = stats.total_tt
    lines = [f"{label}, {num_requests} requests: shares of {total:.2f} profiled s"]
    by_self = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    ours = [kv for kv in stats.stats.items() if f"{os.sep}sim{os.sep}" in kv[0][0]]
    by_cum = sorted(ours, key=lambda kv: -kv[1][3])[:top]
    for title, entries in (("by self time", by_self), ("simulator functions by cumulative "
                                                        "time", by_cum)):
        lines += ["", title, f"{'self':>6} {'cum':>6} {'calls':>10}  function"]
        for (path, line, name), (_, calls, self_s, cum_s, _) in entries:
            where = f"{Path(path).parent.name}/{Path(path).name}:{line}" if line else path
            lines.append(f"{self_s / total:>6.1%} {cum_s / total:>6.1%} {calls:>10}  {name} "
                         f"({where})")
    shares = ", ".join(f"{name} {self_s / total:.0%}"
                       for (_, _, name), (_, _, self_s, _, _) in by_self[:6])
    row = dict(workload=f"multi-LoRA {label}, {num_requests:,} requests (bench_multilora "
                        f"--profile)",
               calls_after=round(stats.total_calls / num_requests),
               where_time_goes=f"largest self-time shares (cProfile): {shares}")
    return "\n".join(lines), row
