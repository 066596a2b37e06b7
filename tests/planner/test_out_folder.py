"""Nothing escapes --out: scenario, strategy and sweep names become file names only through
`sim.io.files.file_name`, which slugs path separators, `..`, absolute paths and control
characters; a run and a sweep with hostile names write only under the output folder and rerun."""

from __future__ import annotations

import pytest
from planner_helpers import TINY, files_under, molcap, write_tiny

from planner.jobs.run import run_scenario_file
from planner.jobs.sweep import run_sweep
from planner.scenario.loading import ScenarioError
from sim.io.files import file_name

HOSTILE = ["../../x", "/etc/passwd", "a/../../b", "a\\..\\b", "..", ".", ".hidden", "x\x00y",
           "x\ny", "\x1b[31mred", "a" * 400, "~/x", "C:\\x", "nul/", " ", "é/ü"]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_file_name_keeps_every_name_one_plain_component(name, tmp_path):
    slug = file_name(name)
    assert slug and len(slug.encode()) <= 120
    assert "/" not in slug and "\\" not in slug and not slug.startswith((".", "~", "-"))
    assert all(ch.isprintable() and not ch.isspace() and ord(ch) < 128 for ch in slug)
    assert (tmp_path / slug).resolve().parent == tmp_path.resolve()
    assert file_name(name) == slug  # stable: a rerun finds the same files


def test_file_name_keeps_plain_names_and_tells_slugged_ones_apart():
    for plain in ("default", "sim_azure_preft", "mol2_in_engine", "p-1.5"):
        assert file_name(plain) == plain
    assert file_name("a/b") != file_name("a_b") != file_name("a\\b")


def test_hostile_scenario_and_strategy_names_write_only_under_out(tmp_path):
    work, out = tmp_path / "work", tmp_path / "work" / "out"
    work.mkdir()
    text = TINY.replace("name: tiny", "name: ../../escaped").replace(
        "  - kind: base", "  - kind: base\n    name: a/../../../strategy")
    path = write_tiny(work, "hostile", text)
    before = files_under(tmp_path)
    first = run_scenario_file(path, out, backend="inline")
    assert not first.errors
    written = files_under(tmp_path) - before
    assert written and all(p.resolve().is_relative_to(out.resolve()) for p in written)
    points = {p.name for p in (out / file_name("../../escaped") / "points").iterdir()}
    assert len(points) == 4
    again = run_scenario_file(path, out, backend="inline")  # resumes from the same point files
    assert not again.errors and files_under(tmp_path) - before == written


def test_hostile_sweep_name_is_refused_with_its_line_before_writing(tmp_path):
    work, out = tmp_path / "work", tmp_path / "work" / "out"
    work.mkdir()
    write_tiny(work)
    spec = work / "sweep.yaml"
    spec.write_text("scenario: tiny.yaml\nname: ../../sweep_escaped\nparameters:\n"
                    "  - {field: engine.max_num_seqs, values: [4, 8]}\n", encoding="utf-8")
    before = files_under(tmp_path)
    with pytest.raises(ScenarioError) as info:
        run_sweep(spec, out, backend="inline")
    assert info.value.messages[0].startswith(f"{spec}:2: name: ")
    assert files_under(tmp_path) == before


def test_a_sweep_named_dot_dot_stays_under_out(tmp_path):
    work, out = tmp_path / "work", tmp_path / "work" / "out"
    work.mkdir()
    write_tiny(work)
    spec = work / "sweep.yaml"
    spec.write_text("name: ..\nscenario: tiny.yaml\nparameters:\n"
                    "  - {field: engine.max_num_seqs, values: [4]}\n", encoding="utf-8")
    before = files_under(tmp_path)
    result = run_sweep(spec, out, backend="inline")
    assert not result.errors
    written = files_under(tmp_path) - before
    assert written and all(p.resolve().parent != out.resolve() for p in written)
    assert all(p.resolve().is_relative_to(out.resolve()) for p in written)


def test_the_dashboard_finds_the_points_where_run_wrote_them(tmp_path):
    from planner.jobs.dashboard import points_dir
    from planner.scenario.loading import load_scenario

    path = write_tiny(tmp_path, "hostile", TINY.replace("name: tiny", "name: ../../escaped"))
    run_scenario_file(path, tmp_path / "out", backend="inline")
    folder = points_dir(load_scenario(path), tmp_path / "out")
    assert folder.resolve().is_relative_to((tmp_path / "out").resolve())
    assert len(list(folder.glob("*.json"))) == 4


def test_a_name_with_console_markup_prints_as_typed(tmp_path):
    name = "[/bold][red]x[/nope]"
    path = write_tiny(tmp_path, "markup", TINY.replace("name: tiny", f"name: '{name}'"))
    result = molcap("run", str(path), "--out", "out", "--backend", "inline", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{name}: capacity plan" in result.stdout
