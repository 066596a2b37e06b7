"""Predicted vs measured for `molcap verify`: summaries of turn records, one comparison row per
metric and percentile, and each SLO checked on what the engine did. Pure functions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.predict.intervals import DEFAULT_CONFIDENCE, ProfileErrors, metric_interval

METRICS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
           "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "output_tokens_per_s",
           "throughput_tokens_per_s")
"""Compared metrics: latency percentiles and tokens per second (output; prompt + output)."""


def _per_request(records: list[dict]) -> dict[str, np.ndarray]:
    """TTFT and end-to-end from arrival, TPOT over the tokens after the first, per request."""
    arrival = np.array([r["arrival_s"] for r in records])
    first = np.array([r["first_token_s"] for r in records]) - arrival
    e2e = np.array([r["finish_s"] for r in records]) - arrival
    num_out = np.array([r["num_output_tokens"] for r in records])
    return {"ttft": first, "tpot": (e2e - first) / np.maximum(num_out - 1, 1), "e2e": e2e}


def summarize(records: list[dict]) -> dict[str, float]:
    """Latency percentiles (p50, p90, p99) and tokens per second of turn records: output
    tokens, and prompt + output tokens, over first arrival to last finish."""
    span = max(r["finish_s"] for r in records) - min(r["arrival_s"] for r in records)
    num_out = sum(r["num_output_tokens"] for r in records)
    out = {"output_tokens_per_s": num_out / span,
           "throughput_tokens_per_s": (num_out + sum(r["num_prompt_tokens"] for r in records))
           / span}
    for name, values in _per_request(records).items():
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = float(np.percentile(values, q))
    return out


def turn_records(turns) -> list[dict]:
    """Simulated turns (`SimResult.turns`) as records like the engine's."""
    return [dict(arrival_s=a, first_token_s=f, finish_s=d, num_output_tokens=n,
                 num_prompt_tokens=c + u)
            for a, f, d, n, c, u in zip(turns["arrival_s"], turns["first_token_s"],
                                        turns["finish_s"], turns["num_output_tokens"],
                                        turns["num_context_tokens"], turns["num_user_tokens"],
                                        strict=True)]


def slo_checks(slo, records: list[dict], measured: dict) -> list[dict]:
    """Each SLO of the scenario on the measurements: the measured percentile against the limit,
    and the attainment (share of requests within the limit) next to the share it needs."""
    per_request = _per_request(records)
    out = []
    for metric, limit in slo.model_dump().items():
        if limit is None:
            continue
        family, quantile = metric.split("_")[0], int(metric.split("_p")[1].split("_")[0])
        value = measured.get(metric, math.nan)
        out.append(dict(metric=metric, limit=limit, measured=value,
                        attainment=float(np.mean(per_request[family] <= limit)),
                        needed=quantile / 100, passed=bool(value <= limit)))
    return out


def compare_rows(predicted: dict, measured: dict, plan: dict, slo,
                 errors: ProfileErrors | None = None,
                 confidence: float = DEFAULT_CONFIDENCE) -> list[dict]:
    """One row per metric: the plan's value (whole deployment), the prediction of this replay
    with its interval from the pricing profile's measured error (`low`, `high`; None without
    one), the measurement, the signed error of the prediction, the SLO limit and whether it
    holds."""
    limits = {k: v for k, v in slo.model_dump().items() if v is not None}
    rows = []
    for metric in METRICS:
        p, m = predicted.get(metric, math.nan), measured.get(metric, math.nan)
        limit = limits.get(metric)
        band = metric_interval(metric, p, p, p, errors, confidence)
        rows.append(dict(metric=metric, plan=plan.get(metric), predicted=p,
                         low=band.low if band.has_measured_error else None,
                         high=band.high if band.has_measured_error else None, measured=m,
                         error=(p - m) / m if m else math.nan, slo=limit,
                         passed=None if limit is None else bool(m <= limit)))
    return rows


@dataclass
class VerifyResult:
    """Per strategy: the comparison rows, SLO checks and how the engine ran."""

    scenario: str
    strategies: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """One line per strategy not verified, and why."""
    failed: list[str] = field(default_factory=list)
    """One line per strategy whose run raised (rerun to retry)."""

    @property
    def missed_slos(self) -> list[str]:
        """'strategy: metric measured > limit' for each SLO a promised plan missed."""
        return [f"{s['strategy']}: {c['metric']} measured {c['measured']:.4g} s > "
                f"{c['limit']:.4g} s" for s in self.strategies if s["is_promised"]
                for c in s["slo_checks"] if not c["passed"]]


def default_clock(errors: ProfileErrors | None, device: str) -> str:
    """The clock a verify run is timed on unless told: the clock of the interval it is compared
    with (the pricing profile's validation), else the one the profile's steps were measured on
    (the engine thread's CPU seconds on a CPU, wall seconds on a GPU)."""
    if errors is not None:
        return errors.clock
    return "cpu" if device == "cpu" else "wall"


def strategy_entry(record: dict, plan_metrics: dict, is_promised: bool, slo,
                   errors: ProfileErrors | None = None) -> dict:
    """A stored measurement as the result's per-strategy entry (requests and steps dropped);
    `errors`: the pricing profile's measured errors (the predictions' intervals).
    `interval_clock` is the clock those errors were measured on; `is_like_for_like` is False
    when the run was timed on another clock, so the interval says nothing about it."""
    rows = compare_rows(record["predicted"], record["measured"], plan_metrics, slo, errors)
    checks = slo_checks(slo, record["records"], record["measured"])
    keep = {k: v for k, v in record.items()
            if k not in ("records", "steps", "scenario", "layer_costs", "cost_profile",
                         "runner_s", "runner_wall_s")}
    interval_clock = None if errors is None else errors.clock
    return dict(keep, rows=rows, slo_checks=checks, is_promised=is_promised,
                interval_clock=interval_clock,
                is_like_for_like=interval_clock in (None, record["clock"]))
