"""The Scenario, Capacity plan and Saved pages, and every shipped scenario, under AppTest."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from planner.jobs.run import run_scenario_file
from planner.jobs.sweep import run_sweep
from tests.app.conftest import ROOT, no_exceptions, open_app, texts

TINY = """\
name: {name}
model: llama-3.1-8b
hardware: {{gpu: H100-SXM}}
engine: {{max_num_seqs: 16, max_loras: 2}}
strategies:
  - kind: multi_lora
    adapters: [{{name: a, rank: 8}}, {{name: b, rank: 8}}]
workload: {{kind: conversations, num_conversations: 10, num_turns: 2,
  num_initial_context_tokens: 256, num_user_tokens: 32, num_reply_tokens: 32,
  think_time_s: 1.0, arrival_rate_per_s: 2.0}}
slo: {{ttft_p99_s: {ttft}}}
search: {{gpus: [H100-SXM, H200], tensor_parallel_sizes: [1], num_seeds: 1,
  max_turns_per_evaluation: 20, max_num_replicas: 4}}
"""


def _write(folder: Path, name: str, text: str) -> str:
    (folder / "scenarios" / f"{name}.yaml").write_text(text, encoding="utf-8")
    return f"scenarios/{name}.yaml"


def _validate_cli(folder: Path, path: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "app.cli", "validate", path], cwd=folder,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    return done.stderr.strip().splitlines()


@pytest.mark.parametrize("broken", [
    ("engine:\n  max_num_seqs: 64\n", "engine:\n  max_num_seqs: 0\n  max_num_sequences: 3\n"),
    ("  arrival_rate_per_s: 0.5\n", "  arrival_rate_per_s: [0.5\n"),
], ids=["bad fields", "malformed YAML"])
def test_bad_yaml_shows_the_located_errors_exactly_as_molcap_validate(in_workdir, broken):
    text = (in_workdir / "scenarios" / "default.yaml").read_text().replace(*broken)
    path = _write(in_workdir, "broken", text)
    expected = _validate_cli(in_workdir, path)
    at = open_app()
    at.sidebar.selectbox(key="picker").set_value(path).run()
    at.switch_page("pages/1_scenario.py").run()
    no_exceptions(at)
    shown = texts(at.markdown)
    assert expected and all(f"`{line}`" in shown for line in expected), (expected, shown)
    assert any("problem(s)" in m for m in texts(at.error))
    fixed = text.replace(broken[1], broken[0])
    at.text_area(key="editor").set_value(fixed).run()
    assert any(m.startswith("valid: 9 strategies") for m in texts(at.success))


def test_an_infeasible_slo_shows_the_reason_per_candidate(in_workdir):
    path = _write(in_workdir, "tiny_infeasible", TINY.format(name="tiny_infeasible", ttft=1e-6))
    at = open_app("pages/5_plan.py", scenario=path)
    no_exceptions(at)
    at.button(key="plan_run").click().run()
    job = at.session_state["plan_job"]
    deadline = time.monotonic() + 180
    while job.is_running and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not job.is_running
    at.run()
    no_exceptions(at)
    warning = " ".join(texts(at.warning))
    assert "multi_lora: no plan." in warning
    for gpu in ("H100-SXM", "H200"):
        assert f"{gpu} TP=1 max_num_seqs=16 max_loras=2: misses the SLOs" in warning, warning


def test_a_feasible_plan_shows_the_table_for_people(in_workdir):
    path = _write(in_workdir, "tiny_people", TINY.format(name="tiny_people", ttft=10))
    at = open_app("pages/5_plan.py", scenario=path)
    at.button(key="plan_run").click().run()
    job = at.session_state["plan_job"]
    deadline = time.monotonic() + 180
    while job.is_running and time.monotonic() < deadline:
        time.sleep(0.5)
    at.run()
    no_exceptions(at)
    table = at.dataframe[0].value
    assert {"Strategy", "Deployment", "Cost ($/h)", "p99 TTFT (s)", "p99 TPOT (ms)",
            "Interval (90%)"} <= set(table.columns)
    assert not any("_" in c for c in table.columns)  # no raw snake_case names
    # The scaled H100-SXM profile has no validation and one seed: the value alone, and the
    # interval column says why.
    assert table["p99 TTFT (s)"].str.fullmatch(r"[\d.,]+").all()
    assert (table["Interval (90%)"] == "seeds only: no measured error").all()
    assert {b.label for b in at.get("download_button")} == {"plans.csv", "plans.parquet"}


def test_a_search_can_be_cancelled_and_keeps_what_finished(in_workdir):
    path = _write(in_workdir, "tiny_cancel", TINY.format(name="tiny_cancel", ttft=10))
    at = open_app("pages/5_plan.py", scenario=path)
    at.button(key="plan_run").click().run()
    job = at.session_state["plan_job"]
    assert job.is_running
    at.button(key="plan_cancel").click().run()
    assert not job.is_running
    assert job.progress() == (0, 1)  # stopped before its one strategy finished


def _chart(at, title: str) -> dict:
    """The chart whose title starts with `title`, as Plotly's JSON."""
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return next(c for c in charts if c["layout"]["title"]["text"].startswith(title))


def _error_bars(chart: dict) -> list[float]:
    return [x for t in chart["data"] for x in _array(t["error_y"]["array"])]


def _array(value) -> np.ndarray:
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value, dtype=float)


MEASURED = "seeds x measured error ("
"""The H100-64GB profile is fitted and validated on held-out runs: its intervals are measured."""


def test_saved_runs_and_sweeps_are_browsed_without_recomputing(in_workdir):
    out = in_workdir / "out"
    text = TINY.format(name="tiny_ok", ttft=10).replace("H100-SXM", "H100-64GB").replace(
        "[H100-64GB, H200]", "[H100-64GB]").replace("num_seeds: 1", "num_seeds: 2")
    path = _write(in_workdir, "tiny_ok", text)
    run_scenario_file(in_workdir / path, out, backend="inline")
    spec = in_workdir / "scenarios" / "tiny_sweep.yaml"
    spec.write_text("name: tiny_sweep\nscenario: tiny_ok.yaml\nevaluate: simulate\n"
                    "parameters:\n  - {field: workload.num_reply_tokens, values: [16, 64]}\n")
    run_sweep(spec, out, backend="inline")
    at = open_app("pages/7_saved.py")
    no_exceptions(at)
    at.text_input(key="saved_path").set_value(str(out / "tiny_ok")).run()
    no_exceptions(at)
    assert len(at.get("plotly_chart")) >= 5  # plan, p99, Pareto, throughput, latency, CDF, ...
    assert any("run at" in c for c in texts(at.caption))
    # Tables for people with the intervals `molcap run` stored; no raw table on the page.
    plan = at.dataframe[0].value
    assert not any("_" in c for c in plan.columns)
    assert plan["p99 TTFT (s)"].str.fullmatch(r"[\d.,]+ \([\d.,]+-[\d.,]+\)").all()
    assert plan["Interval (90%)"].str.startswith(MEASURED).all()
    summary = at.dataframe[-1].value  # the simulation summary
    assert summary["p99 TTFT (s)"].str.fullmatch(r"[\d.,]+ \([\d.,]+-[\d.,]+\)").all()
    assert all(not any("_" in c for c in d.value.columns) for d in at.dataframe)
    # The charts' error bars: measured bands or, for the end-to-end latency the profile's
    # validation does not measure, the two seeds' spread, which the Pareto chart says.
    for title in ("Deployments tried", "Capacity plan: p99", "Simulated latency"):
        assert max(_error_bars(_chart(at, title))) > 0, title
    assert "no measured error" in _chart(at, "Deployments tried")["layout"]["title"]["text"]
    assert {b.label for b in at.get("download_button")} >= {"comparisons.csv",
                                                            "comparisons.parquet"}
    at.text_input(key="saved_path").set_value(str(out / "tiny_sweep")).run()
    no_exceptions(at)
    assert at.selectbox(key="sweep_param").value == "workload.num_reply_tokens"
    assert len(at.get("plotly_chart")) == 1
    assert max(_error_bars(_chart(at, "p99 TTFT (s) vs num reply tokens"))) > 0
    table = at.dataframe[0].value
    assert list(table.columns[:2]) == ["num reply tokens", "Strategy"]
    assert table["p99 TTFT (s)"].str.fullmatch(r"[\d.,]+ \([\d.,]+-[\d.,]+\)").all()


@pytest.mark.parametrize("scenario", sorted(p.name for p in (ROOT / "scenarios").glob("*.yaml")))
def test_every_shipped_scenario_opens(in_workdir, scenario):
    at = open_app(scenario=f"scenarios/{scenario}")
    no_exceptions(at)
    summary = at.dataframe[0].value
    turns = summary["Turns (/s)"].str.replace(",", "").astype(float)
    assert len(summary) >= 1 and (turns > 0).all()


def test_an_uploaded_scenario_opens_with_its_results(in_workdir):
    at = open_app()
    text = TINY.format(name="uploaded", ttft=10).encode()
    at.sidebar.file_uploader(key="upload").set_value(("mine.yaml", text, "application/x-yaml"))
    at.run()
    no_exceptions(at)
    assert at.title[0].value == "molcap what-if: uploaded"
    assert list(at.dataframe[0].value["Strategy"]) == ["multi_lora"]
    assert at.session_state["scenario_source"] == "mine.yaml"
