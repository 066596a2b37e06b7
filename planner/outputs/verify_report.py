"""How a verify result reads: a terminal table, an HTML section, a one-line verdict.

Formatting only: every number comes from `calibrate.verify` as a value.
"""

from __future__ import annotations

import math

import pandas as pd

LABELS = {
    "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "ttft_p99_s": "TTFT p99",
    "tpot_p50_s": "TPOT p50", "tpot_p90_s": "TPOT p90", "tpot_p99_s": "TPOT p99",
    "e2e_p50_s": "E2E p50", "e2e_p90_s": "E2E p90", "e2e_p99_s": "E2E p99",
    "output_tokens_per_s": "output tok/s", "throughput_tokens_per_s": "total tok/s",
}
"""Metric -> the name people read (seconds for latencies, tokens/s for throughput)."""


def fmt_value(metric: str, value) -> str:
    """A latency in s or ms, a throughput in tokens/s, to three significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric.endswith("_per_s"):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _row_cells(row: dict) -> list[str]:
    metric = row["metric"]
    error = "-" if row["error"] is None or math.isnan(row["error"]) else f"{row['error']:+.0%}"
    slo = "-" if row["slo"] is None else fmt_value(metric, row["slo"])
    verdict = "" if row["passed"] is None else ("pass" if row["passed"] else "MISS")
    band = "-" if row.get("low") is None else (
        f"{fmt_value(metric, row['low'])}-{fmt_value(metric, row['high'])}")
    return [LABELS[metric], fmt_value(metric, row["plan"]), fmt_value(metric, row["predicted"]),
            band, fmt_value(metric, row["measured"]), error, slo, verdict]


HEADER = ["metric", "plan", "predicted", "interval (90%)", "measured", "error", "SLO", ""]
CLOCKS = {"cpu": "the engine thread's CPU seconds", "wall": "what a client sees"}


def header(entry: dict) -> list[str]:
    """The table's header; the interval column names the clock it holds on."""
    clock = entry.get("interval_clock")
    return HEADER if clock is None else [
        f"interval (90%, {clock} clock)" if h == "interval (90%)" else h for h in HEADER]


def within_line(entry: dict) -> str:
    """How many measurements fell inside the prediction's interval (none: no measured error);
    a run timed on another clock than the interval's is not counted, and the line says why."""
    banded = [r for r in entry["rows"] if r.get("low") is not None]
    if not banded:
        return "  the pricing profile has no measured error: no interval on the predictions"
    clock, ran = entry.get("interval_clock"), entry["clock"]
    if not entry.get("is_like_for_like", True):
        return (f"  not a like-for-like check: the interval is of the {clock} clock "
                f"({CLOCKS.get(clock, clock)}: the clock of the pricing profile's validation) "
                f"and this run was timed on the {ran} clock ({CLOCKS.get(ran, ran)}), so "
                f"measurements are not counted against it; `--clock {clock}` gives a "
                "like-for-like check")
    inside = sum(r["low"] <= r["measured"] <= r["high"] for r in banded)
    return (f"  measured inside the predicted 90% interval: {inside} of {len(banded)} metrics "
            "(the interval is the pricing profile's held-out error on its validation, "
            f"on the {clock or ran} clock like this run)")


def strategy_table(entry: dict) -> str:
    """One strategy's comparison as aligned plain-text columns."""
    cells = [header(entry)] + [_row_cells(r) for r in entry["rows"]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(cell, widths, strict=True))).rstrip()
             for cell in cells]
    return "\n".join(lines)


def describe_run(entry: dict) -> str:
    """One line on what ran: deployment, engine limits, KV, requests, clock, host settings."""
    d, a, h = entry["deployment"], entry["engine_kwargs"], entry["host"]
    replicas = d["num_replicas"]
    share = f", 1 of {replicas} replicas at 1/{replicas} of the rate" if replicas > 1 else ""
    threads = f", torch threads {h['num_threads']}" if h.get("num_threads") else ""
    return (f"{entry['strategy']}: vLLM on {entry['device']} ({d['gpu']}, TP="
            f"{d['tensor_parallel_size']}{share}), max_num_seqs={a['max_num_seqs']} "
            f"max_num_batched_tokens={a['max_num_batched_tokens']} "
            f"max_loras={a.get('max_loras', '-')} "
            f"prefix caching {'on' if a['enable_prefix_caching'] else 'off'}; "
            f"{entry['num_kv_blocks']} KV blocks; {entry['num_requests']} requests, "
            f"{entry['clock']} clock; host allocator: {h['allocator']}{threads}; "
            f"deployment from {entry['source']}")


def steps_line(entry: dict) -> list[str]:
    """The engine's own steps priced one by one: is a latency miss the profile's price of the
    steps (mispriced steps), the host work around them, or the cores others held?"""
    check = entry.get("step_check")
    if not check or not check.get("rows"):
        return []
    kinds = ", ".join(f"{r['kind']} x{1 / (1 + r['median_error']):.2f} ({r['num_steps']} steps)"
                      for r in check["rows"])
    # Steps are timed on the engine thread's CPU clock on a CPU whatever the run's clock.
    seconds = CLOCKS["cpu"] if entry["device"] == "cpu" else "wall seconds"
    line = (f"  engine steps priced one by one (measured / the profile's price, median; "
            f"{seconds}): {kinds}; host work between steps {check['host_share']:.0%} of the "
            "engine loop")
    if entry["device"] == "cpu":
        line += (f"; the model runner's wall time {check['runner_wall_over_clock']:.2f}x its "
                 "CPU time (above 1: other processes held the cores)")
    return [line]


def routing_line(entry: dict) -> list[str]:
    """A routed strategy: where the router read, what it chose, and one decision's cost as the
    client saw it (routed minus named first-token time) against the simulator's."""
    r = entry.get("routing")
    if not r:
        return []
    planned, probe, counts = r["planned"], r["probe"], r["counts"]
    chosen = ", ".join(f"{n} {c}" for n, c in sorted(r["chosen"].items())) or "none logged"
    return [f"  routed in the engine by the molcap plugin: pointer head after layer "
            f"{planned['route_layer']} ({r['num_head_params']:,} parameters; the plan priced "
            f"{planned['num_head_params']:,}), {counts['written']} decisions for "
            f"{r['num_routed_requests']} routed requests (chosen: {chosen})",
            f"  routing decision as the client sees it: measured "
            f"{fmt_value('decision_s', probe['decision_s'])} (first-token time routed minus "
            f"with the choice named, median of {len(probe['pairs'])} prompts sent alone), "
            f"predicted {fmt_value('decision_s', planned['predicted_decision_s'])}"]


def slo_lines(entry: dict) -> list[str]:
    """Per SLO: measured vs limit, attainment vs the share the percentile needs, verdict."""
    out = []
    for c in entry["slo_checks"]:
        verdict = "pass" if c["passed"] else "MISSED"
        out.append(f"  SLO {c['metric']} <= {fmt_value(c['metric'], c['limit'])}: measured "
                   f"{fmt_value(c['metric'], c['measured'])}, {c['attainment']:.0%} of requests "
                   f"within it (needs {c['needed']:.0%}): {verdict}")
    return out


def terminal_text(result) -> str:
    """The whole result for the terminal."""
    lines = []
    for entry in result.strategies:
        lines += [describe_run(entry), strategy_table(entry), within_line(entry),
                  *steps_line(entry), *routing_line(entry), *slo_lines(entry), ""]
    lines += [f"not verified: {s}" for s in result.skipped]
    lines += [f"failed: {s}" for s in result.failed]
    lines.append("plan: the deployment's seed mean (molcap run); predicted: the simulator on "
                 "exactly these requests and the engine's KV blocks; error: predicted vs "
                 "measured")
    return "\n".join(lines)


def strategy_frame(entry: dict) -> pd.DataFrame:
    """One strategy's comparison as a table for people (the HTML section)."""
    return pd.DataFrame([_row_cells(r) for r in entry["rows"]],
                        columns=["Metric", "Plan", "Predicted", "Interval (90%)", "Measured",
                                 "Error", "SLO", "Verdict"])


def verify_section(result):
    """The report section: per strategy, what ran, the table and the SLO checks."""
    from planner.outputs.report import ReportSection

    text = " ".join(describe_run(e) + ". " + within_line(e).strip() + ". "
                    + " ".join(s.strip() + "." for s in steps_line(e) + routing_line(e)) + " "
                    + " ".join(s.strip() for s in slo_lines(e))
                    for e in result.strategies)
    if result.skipped:
        text += " Not verified: " + "; ".join(result.skipped) + "."
    return ReportSection("Verified on a real engine", text, [],
                         [strategy_frame(e).assign(Strategy=e["strategy"])
                          for e in result.strategies])


def verify_html(result, scenario) -> str:
    """A standalone page holding the verify section."""
    import yaml

    from planner.outputs.report import render_html, timestamp

    return render_html(f"molcap verify: {result.scenario}", f"Generated {timestamp()}.",
                       [verify_section(result)],
                       yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
