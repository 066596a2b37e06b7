"""Routing-decision counters: one file per process, summed in one place.

Each process counts the decisions it wrote (router on the prefill side), read (a hash taken from
the transfer), applied (a request's tokens ran under the decoded adapter) and unknown (a hash this
process's registry does not hold; the request then runs on the base model and is reported).
`sum_counters` adds the files up; `written - read` is the number of decisions that never reached
the decode side. `MetricsCollector` exposes the sums on vLLM's Prometheus endpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

KINDS = ("written", "read", "applied", "unknown", "unrouted", "rejected")
"""Decision events; `unrouted`: routing candidates the router could not decide for (base
model); `rejected`: requests refused because a feature they need is refused."""
_MAX_LOGGED = 256


def default_counter_dir() -> Path:
    """Counter folder used when the config names none."""
    return Path(tempfile.gettempdir()) / "molcap-vllm-plugin"


@dataclass
class DecisionCounters:
    """This process's counts and its most recent decisions, mirrored to `<dir>/<pid>.json`."""

    directory: Path
    role: str = "worker"
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    decisions: list[dict] = field(default_factory=list)
    """Last decisions: {request_id, kind, adapter_hash, adapter}."""
    refused: dict[str, str] = field(default_factory=dict)
    """Features refused in this process -> why (see guards.py)."""

    def add(self, kind: str, request_id: str, adapter_hash: int, adapter: str | None) -> None:
        """Count one event and record it, then rewrite this process's file."""
        self.counts[kind] += 1
        self.decisions.append(dict(request_id=request_id, kind=kind, adapter_hash=adapter_hash,
                                   adapter=adapter))
        del self.decisions[:-_MAX_LOGGED]
        self.flush()

    def flush(self) -> None:
        """Atomically write the file (tmp + rename), so a reader never sees half of it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / f"{os.getpid()}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(pid=os.getpid(), role=self.role, counts=self.counts,
                                       decisions=self.decisions, refused=self.refused)))
        os.replace(tmp, target)


@dataclass(frozen=True)
class CounterTotals:
    """Counts summed over every process that wrote into the folder."""

    counts: dict[str, int]
    per_process: list[dict]
    decisions: list[dict]

    @property
    def undelivered(self) -> int:
        """Decisions written but never read on the decode side."""
        return self.counts["written"] - self.counts["read"]

    def as_dict(self) -> dict:
        """JSON-ready summary."""
        return dict(asdict(self), undelivered=self.undelivered)


def sum_counters(directory: str | Path) -> CounterTotals:
    """Sum every process file in `directory` (missing folder: all zero)."""
    counts = dict.fromkeys(KINDS, 0)
    per_process, decisions = [], []
    folder = Path(directory)
    for file in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for kind in KINDS:
            counts[kind] += int(data["counts"].get(kind, 0))
        per_process.append(dict(pid=data["pid"], role=data["role"], counts=data["counts"],
                                refused=data.get("refused", {})))
        decisions.extend(data.get("decisions", []))
    return CounterTotals(counts=counts, per_process=per_process, decisions=decisions)


class MetricsCollector:
    """Prometheus collector: `molcap_route_decisions_total{kind=...}` summed over processes."""

    def __init__(self, directory: Callable[[], Path]) -> None:
        self.directory = directory
        """Called on every scrape: the folder may change with the config."""

    def collect(self):
        """Called by prometheus_client on every scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        totals = sum_counters(self.directory())
        family = CounterMetricFamily("molcap_route_decisions", "Routing decisions by kind, "
                                     "summed over engine processes", labels=["kind"])
        for kind, value in totals.counts.items():
            family.add_metric([kind], value)
        yield family
        gauge = GaugeMetricFamily("molcap_route_decisions_undelivered",
                                  "Decisions written on the prefill side but never read")
        gauge.add_metric([], totals.undelivered)
        yield gauge
        refused = GaugeMetricFamily("molcap_plugin_feature_refused", "Plugin features refused "
                                    "(1) per engine process, with the reason",
                                    labels=["pid", "feature", "reason"])
        for process in totals.per_process:
            for feature, reason in process["refused"].items():
                refused.add_metric([str(process["pid"]), feature, reason], 1)
        yield refused
