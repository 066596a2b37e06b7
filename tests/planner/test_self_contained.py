"""The repository is self-contained: the trace slices that tests and shipped scenarios use live
in data/, the full data is optional (MOLCAP_DATA_DIR), and a scenario's relative trace path
resolves against the scenario file's folder, wherever the command runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner.jobs.strategy_points import scenario_tasks, simulate_point
from planner.scenario.loading import load_resolved, load_scenario
from sim.workload import traces

REPO = Path(__file__).resolve().parents[2]
FULL_DATA_HINT = (f"needs the full traces: set {traces.DATA_DIR_ENV} to a data folder laid out "
                  "like data/ with the upstream files (data/README.md says where to get them)")


def full_trace(relative: str) -> Path:
    """A file of the full data set, or a skip that says how to get it."""
    path = traces.TRACES_DIR / relative
    if traces.DATA_DIR == traces.REPO_DATA_DIR or not path.is_file():
        pytest.skip(FULL_DATA_HINT)
    return path


def test_nothing_outside_the_repository_is_read_at_run_time():
    """No module, shipped scenario or test points into the team data beside the clone."""
    offenders = []
    for folder in ("planner", "sim", "scenarios", "tests", "app", "calibrate", "bench"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".yaml") and path != Path(__file__):
                text = path.read_text(encoding="utf-8")
                if re.search(r"\.\./shared|/work/shared|\"shared\" / \"data\"", text):
                    offenders.append(str(path.relative_to(REPO)))
    assert not offenders


def test_readme_links_only_to_files_in_the_repository():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "/shared" not in text and "/work/" not in text  # no path into the team's data
    for target in re.findall(r"\]\(([^)#]+)\)", text):  # Markdown links and images
        assert not target.startswith(("/", "..")) and (REPO / target).exists(), target


def test_every_shipped_slice_has_its_licence_and_readme_entry():
    readme = (REPO / "data" / "README.md").read_text(encoding="utf-8")
    folders = [p for p in (REPO / "data" / "traces").iterdir() if p.is_dir()]
    assert folders
    for folder in folders:
        assert (folder / "LICENSE").is_file(), folder
        assert f"traces/{folder.name}/" in readme, folder.name


def test_the_default_data_folder_is_the_repository_and_the_setting_moves_it(tmp_path):
    assert traces.REPO_DATA_DIR == REPO / "data"
    code = "from sim.workload import traces; print(traces.TRACES_DIR)"
    env = dict(os.environ, **{traces.DATA_DIR_ENV: str(tmp_path)})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=REPO, check=True).stdout.strip()
    assert out == str(tmp_path / "traces")


def test_the_servegen_slice_gives_the_full_series_rates():
    full = full_trace("servegen_m_small/chunk-0-trace.csv").parent
    shipped = traces.servegen_client_rates(REPO / "data" / "traces" / "servegen_m_small")
    assert shipped.tolist() == traces.servegen_client_rates(full).tolist()


def test_the_full_azure_trace_has_the_documented_rows():
    path = full_trace("azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
    assert len(traces.read_trace_rows(path, "csv", None)) == 19_366


@pytest.mark.parametrize("name", ["sim_azure_preft", "sim_mooncake_punica"])
def test_shipped_trace_scenarios_stay_inside_their_slice(name):
    scenario = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    w = scenario.workload
    path = Path(w.path)
    assert path.is_absolute() and path.is_relative_to(REPO / "data")
    assert w.max_requests is not None
    assert len(traces.read_trace_rows(path, w.format, None)) >= w.max_requests


def test_a_relative_trace_path_resolves_against_the_scenario_folder(tmp_path, monkeypatch):
    folder = tmp_path / "scenarios" / "mine"
    (folder / "traces").mkdir(parents=True)
    (folder / "traces" / "t.csv").write_text(
        "timestamp,input_length,output_length\n0,100,5\n1,200,6\n", encoding="utf-8")
    (folder / "s.yaml").write_text(
        "name: rel\nmodel: qwen2.5-0.5b\nstrategies: [{kind: base}]\n"
        "workload: {kind: trace, path: traces/t.csv}\n", encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # neither the scenario's folder nor the repository
    resolved = load_resolved(Path("..") / "scenarios" / "mine" / "s.yaml")
    assert Path(resolved.scenario.workload.path) == (folder / "traces" / "t.csv").resolve()
    task = scenario_tasks(resolved, "sim")[0]
    monkeypatch.chdir(REPO)  # a worker may run anywhere: the resolved scenario holds the path
    record = simulate_point(resolved, task.payload)
    assert record["summary"]["num_turns"] == 2


def test_a_clone_of_the_repository_alone_runs_the_trace_scenarios(tmp_path):
    """The shipped trace scenarios from a copy with nothing beside it, from another folder."""
    clone = tmp_path / "clone"
    for part in ("planner", "sim", "scenarios", "data"):
        shutil.copytree(REPO / part, clone / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; from planner.scenario.loading import load_scenario; "
            "from planner.predict.simulation import simulate_strategy; "
            "s = load_scenario(sys.argv[1]); print(simulate_strategy(s, 0).summary['num_turns'])")
    env = {k: v for k, v in os.environ.items() if k != traces.DATA_DIR_ENV}
    env["PYTHONPATH"] = str(clone)
    for name, turns in (("sim_azure_preft", 300), ("sim_mooncake_punica", 120)):
        out = subprocess.run([sys.executable, "-c", code, str(clone / "scenarios" /
                                                             f"{name}.yaml")],
                             env=env, cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == str(turns)
