"""Decision-time measurement and router-card assembly shared by the three routers."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from engine_ext.routers.datasets import RoutingSet, fingerprint
from sim.strategies.router_card import DecisionTime, DecisionWork, Hardware, SettingResult

BATCH_SIZE = 16
NUM_TIMED = 30
NUM_BATCHES = 6


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (platform.processor() is often empty on Linux)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> Hardware:
    """This machine, now."""
    return Hardware(cpu=f"{cpu_name()} ({os.cpu_count()} cores)",
                    num_threads=torch.get_num_threads(),
                    load_average=tuple(round(x, 2) for x in os.getloadavg()))


def _timed(time_one: Callable[[int, int], float], item: int, batch: int) -> tuple[float, float]:
    """(wall, CPU) milliseconds per request of one call (CPU: this thread's time)."""
    cpu = time.thread_time()
    wall = time_one(item, batch)
    return 1e3 * wall / batch, 1e3 * (time.thread_time() - cpu) / batch


def measure(time_one: Callable[[int, int], float], num_items: int, includes: str, *,
            num_timed: int = NUM_TIMED, num_batches: int = NUM_BATCHES,
            batch_size: int = BATCH_SIZE) -> DecisionTime:
    """time_one(item, batch) -> wall seconds for `batch` copies of item's decision.

    Batch 1: num_timed items after two warm-up calls; batched: num_batches batches of
    batch_size, per-request time = batch time / batch_size. Wall and thread CPU time both.
    """
    time_one(0, 1), time_one(0, batch_size)  # warm-up (allocator, first-call paths)
    single = np.array([_timed(time_one, i % num_items, 1) for i in range(num_timed)])
    batched = np.array([_timed(time_one, i % num_items, batch_size)
                        for i in range(num_batches)])

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q))

    return DecisionTime(p50_ms=pct(single[:, 0], 50), p99_ms=pct(single[:, 0], 99),
                        batched_p50_ms=pct(batched[:, 0], 50),
                        batched_p99_ms=pct(batched[:, 0], 99),
                        batch_size=batch_size, num_requests=num_timed, includes=includes,
                        p50_cpu_ms=pct(single[:, 1], 50), p99_cpu_ms=pct(single[:, 1], 99),
                        batched_p50_cpu_ms=pct(batched[:, 1], 50))


def setting_result(routing_set: RoutingSet, num_test: int, accuracies: list[float],
                   train_seconds: list[float], decision: DecisionTime | None,
                   work: DecisionWork) -> SettingResult:
    """One card row from the per-seed numbers."""
    std = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    return SettingResult(setting=routing_set.name, num_options=len(routing_set.options),
                         options=routing_set.options, num_test=num_test,
                         accuracy_per_seed=tuple(accuracies),
                         accuracy_mean=statistics.fmean(accuracies), accuracy_std=std,
                         train_seconds_mean=statistics.fmean(train_seconds),
                         decision=decision, work=work,
                         data_fingerprint=fingerprint(routing_set))
