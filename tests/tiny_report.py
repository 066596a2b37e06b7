"""The small scenario whose `molcap run` report the report tests read (the table layout in a
browser, the tables for people): one H100-64GB, conversations, a tiny search."""

from __future__ import annotations

from pathlib import Path

SCENARIO = """\
name: {name}
model: llama-3.1-8b
hardware: {{gpu: H100-64GB}}
engine: {{max_num_seqs: 16, max_loras: 2}}
strategies:
{strategies}
workload: {{kind: conversations, num_conversations: 6, num_turns: 2,
  num_initial_context_tokens: 256, num_user_tokens: 32, num_reply_tokens: 32,
  think_time_s: 1.0, arrival_rate_per_s: 2.0}}
slo: {{ttft_p99_s: 10}}
search: {{gpus: [H100-64GB], tensor_parallel_sizes: [1], num_seeds: {num_seeds},
  max_turns_per_evaluation: 12, max_num_replicas: 2}}
"""
STRATEGY = "  - kind: {kind}\n    adapters: [{{name: a, rank: 8}}, {{name: b, rank: 8}}]"


def tiny_report_scenario(name: str, kinds: tuple[str, ...], num_seeds: int) -> str:
    """The scenario's YAML text: each strategy kind over the same two rank-8 adapters."""
    strategies = "\n".join(STRATEGY.format(kind=kind) for kind in kinds)
    return SCENARIO.format(name=name, strategies=strategies, num_seeds=num_seeds)


def run_report(folder: Path, file: str, text: str):
    """`molcap run`'s job on `text` (written to folder/file), inline, into folder/out: its
    result, which failed no point."""
    from planner.jobs.run import run_scenario_file

    (folder / file).write_text(text, encoding="utf-8")
    result = run_scenario_file(folder / file, folder / "out", backend="inline")
    assert not result.errors
    return result
