"""The main job for one scenario file: compare strategies, write the report and tidy tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from planner.analysis import run_comparisons, tidy
from planner.figures import COMPARISON_FIGURES
from planner.loading import load_scenario
from planner.report import ReportSection, render_html, timestamp, write_atomic, write_table
from planner.scenario import Scenario

_EXPLAIN = {
    "memory_summary": (
        "Memory of one replica, per GPU",
        "How each strategy's model splits one GPU's memory as vLLM would resolve it: weights "
        "sharded over tensor parallelism, preallocated LoRA slots, the activation reserve, and "
        "the paged KV pool that is left."),
    "kv_per_conversation": (
        "KV memory per conversation",
        "KV one conversation holds as its context grows and it visits more adapters. MoL and "
        "multi-agent keep one copy per adapter or model visited; CED strategies keep one shared "
        "global KV plus one W-token window."),
    "switch_cost": (
        "Cost of one domain switch",
        "One switch at a given context, priced alone on one replica: re-prefill under the new "
        "adapter (multi-LoRA, PreFT), handoff prefill plus summary hop (MoL), handover prefill by "
        "the next model (multi-agent), bounded replay of W tokens through the decoder (CED)."),
    "routing_vs_reply_length": (
        "Routing overhead vs reply length",
        "Share of a turn spent deciding the adapter, one decision per turn, as replies grow."),
    "routing_vs_decision_frequency": (
        "Routing overhead vs decision frequency",
        "A decision (and a switch) every k decoded tokens, as agent tool calls do: the share of "
        "time spent routing and switching rather than decoding."),
    "decode_step_vs_adapters": (
        "Decode step time vs adapter mix",
        "One decode step of the analysis batch, with its sequences spread over more distinct "
        "adapters. PreFT decode tokens run base weights, so their step does not change."),
}


@dataclass(frozen=True)
class RunResult:
    """What one run wrote."""

    scenario: Scenario
    report_path: Path
    table_paths: list[Path]
    comparisons: dict[str, pd.DataFrame]


def _sections(comparisons: dict[str, pd.DataFrame]) -> list[ReportSection]:
    sections = []
    for name, df in comparisons.items():
        title, text = _EXPLAIN[name]
        figures = [COMPARISON_FIGURES[name](df)] if name in COMPARISON_FIGURES else []
        sections.append(ReportSection(title, text, figures, [df]))
    return sections


def run_scenario_file(path: str | Path, out_root: str | Path = "out") -> RunResult:
    """Load a scenario, compare its strategies, write `out_root/<name>/report.html` and tables."""
    path = Path(path)
    scenario = load_scenario(path)
    out_dir = Path(out_root) / scenario.name
    comparisons = run_comparisons(scenario)
    tables = write_table(tidy(comparisons), out_dir / "comparisons")
    for name, df in comparisons.items():
        tables += write_table(df, out_dir / "tables" / name)
    subtitle = f"{scenario.description.strip()} Generated {timestamp()} from {path}."
    page = render_html(f"molcap: {scenario.name}", subtitle, _sections(comparisons),
                       path.read_text(encoding="utf-8"))
    report = out_dir / "report.html"
    write_atomic(report, page.encode("utf-8"))
    return RunResult(scenario, report, tables, comparisons)
