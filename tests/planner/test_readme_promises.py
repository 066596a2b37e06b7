"""The README's reliability promises, each checked end to end through the real CLI:
resumable (a rerun after lost points recomputes only those and writes byte-identical tables),
nothing written outside --out (not the working directory, the scenario's folder or HOME), and
the README's example scenario is valid. Located errors: tests/planner/test_cli.py,
test_yaml_hostile.py, test_validation_gaps.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from planner_helpers import REPO, files_under, write_tiny

from planner.scenario.loading import load_scenario


def molcap_in(cwd, *args, home):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home), "NO_COLOR": "1"}
    env.pop("XDG_CACHE_HOME", None)
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def tables(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.csv"))}


def test_a_run_writes_nothing_outside_out(tmp_path):
    scenarios, work, home = tmp_path / "scenarios", tmp_path / "work", tmp_path / "home"
    for folder in (scenarios, work, home):
        folder.mkdir()
    path = write_tiny(scenarios)
    before = files_under(tmp_path)
    result = molcap_in(work, "run", str(path), "--out", str(tmp_path / "out"), "--workers", "2",
                       home=home)
    assert result.returncode == 0, result.stderr
    written = files_under(tmp_path) - before
    assert written and all(p.is_relative_to(tmp_path / "out") for p in written), sorted(
        str(p) for p in written if not p.is_relative_to(tmp_path / "out"))


def test_a_rerun_recomputes_only_lost_points_and_writes_identical_tables(tmp_path):
    path = write_tiny(tmp_path)
    out = tmp_path / "out"
    first = molcap_in(tmp_path, "run", str(path), "--out", str(out), home=tmp_path)
    assert first.returncode == 0, first.stderr
    before = tables(out)
    points = sorted((out / "tiny" / "points").glob("*.json"))
    kept = {p: p.stat().st_mtime_ns for p in points[::2]}
    for lost in points[1::2]:  # as if the run had been killed before these finished
        lost.unlink()
    second = molcap_in(tmp_path, "run", str(path), "--out", str(out), home=tmp_path)
    assert second.returncode == 0, second.stderr
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished points were not redone
    assert all(p.is_file() for p in points)
    assert tables(out) == before


def test_the_readme_example_scenario_is_valid(tmp_path):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(.*?)```", readme, re.DOTALL)
    assert example, "README.md: the Scenarios section shows a ```yaml example"
    path = tmp_path / "example.yaml"
    path.write_text(example.group(1), encoding="utf-8")
    scenario = load_scenario(path)
    assert scenario.name == "my_service"
    assert [s.kind for s in scenario.strategies] == ["multi_lora", "preft"]
