"""Disk and environment errors get one clear line and a non-zero exit, never a traceback: an
output folder that cannot be written (a file in the way, read-only, full), a point file of valid
JSON but the wrong shape (named, then recomputed), `--backend ray` without Ray."""

from __future__ import annotations

import errno
import json
import os

import pytest
from planner_helpers import TINY, molcap, write_tiny
from typer.testing import CliRunner

import sim.io.files
from app.cli import app
from planner.jobs.run import run_scenario_file


def test_an_out_folder_under_a_file_is_one_line(tmp_path):
    path = write_tiny(tmp_path)
    (tmp_path / "taken").write_text("a file, not a folder", encoding="utf-8")
    result = molcap("run", str(path), "--out", "taken/out", "--backend", "inline", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if "cannot write" in ln]
    assert "taken" in line and "Not a directory" in line


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EACCES])
def test_a_read_only_or_full_disk_is_one_line(tmp_path, monkeypatch, code):
    # Root ignores permissions and no test can fill the disk: the write itself fails here, as
    # the operating system makes it fail.
    path = write_tiny(tmp_path)

    def failing_replace(src, dst):
        raise OSError(code, os.strerror(code), str(dst))

    monkeypatch.setattr(sim.io.files.os, "replace", failing_replace)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", str(path), "--out", "out", "--backend", "inline"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = result.output.strip().splitlines()[-1]
    assert "cannot write" in line and os.strerror(code) in line


@pytest.mark.parametrize("content", ["[]", '{"status": "ok"}', '"text"', '{"status": "ok", '
                                     '"result": 3}', '{"status": "maybe", "result": {}}'])
def test_a_point_file_of_the_wrong_shape_is_named_and_recomputed(tmp_path, content, caplog):
    path = write_tiny(tmp_path)
    first = run_scenario_file(path, tmp_path / "out", backend="inline")
    points = sorted((tmp_path / "out" / "tiny" / "points").glob("*.json"))
    good = json.loads(points[0].read_text(encoding="utf-8"))
    points[0].write_text(content, encoding="utf-8")
    computed = []
    again = run_scenario_file(path, tmp_path / "out", backend="inline",
                              on_progress=lambda done, total: computed.append(done))
    assert computed == [1]  # only the damaged point ran again
    assert not again.errors and again.plans.equals(first.plans)
    assert json.loads(points[0].read_text(encoding="utf-8"))["result"] == good["result"]
    assert any(points[0].name in r.getMessage() and "recomput" in r.getMessage()
               for r in caplog.records), caplog.text


def test_backend_ray_without_ray_is_one_line(tmp_path):
    blocker = tmp_path / "no_ray" / "ray"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    path = write_tiny(tmp_path, text=TINY)
    result = molcap("run", str(path), "--out", "out", "--backend", "ray", cwd=tmp_path,
                    path_first=blocker.parent)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "--backend ray" in result.stderr and "dist" in result.stderr
    assert not (tmp_path / "out").exists()
