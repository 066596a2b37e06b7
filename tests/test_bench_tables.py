"""docs/benchmarks.md is rendered from bench/results/*.json: a row shows its values with the
machine, load and date it was measured under, a row without them is refused, and the committed
page is what the committed results render to."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import record, tables  # noqa: E402

ROW = dict(machine="Test CPU, 2 CPUs", load_average=1.25, date="2026-01-02 03:04",
           commit="abc1234", source="written by the test",
           values=dict(workload="conversations", speed=8_612.4))


def write_results(folder: Path, rows: list[dict], name: str = "bench_x") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(dict(
        benchmark=name, title="A benchmark", about="What it measures.",
        columns=[dict(key="workload", label="workload"),
                 dict(key="speed", label="req per CPU-s")],
        rows=rows)))
    return path


def test_a_row_renders_with_its_values_machine_load_and_date(tmp_path):
    write_results(tmp_path / "results", [ROW])
    out = tmp_path / "benchmarks.md"
    assert tables.main(["--results", str(tmp_path / "results"), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| workload"))
    assert header.split(" | ")[2:5] == ["date (UTC)", "machine", "load (1 min)"]
    assert ("| conversations | 8,612 | 2026-01-02 03:04 | Test CPU, 2 CPUs | 1.25 | abc1234 "
            "| written by the test |") in lines


@pytest.mark.parametrize("field", ["machine", "load_average", "date"])
def test_a_row_without_its_conditions_is_refused(tmp_path, field, capsys):
    path = write_results(tmp_path / "results", [ROW, {k: v for k, v in ROW.items() if k != field}])
    code = tables.main(["--results", str(path.parent), "--out", str(tmp_path / "b.md")])
    assert code == 2
    message = capsys.readouterr().err
    assert f"bench_x.json: rows.1.{field}: Field required" in message
    assert not (tmp_path / "b.md").exists()


def test_an_empty_machine_or_a_value_without_a_column_is_refused(tmp_path):
    path = write_results(tmp_path / "r1", [ROW | {"machine": "  "}])
    with pytest.raises(record.ResultsError, match=r"rows\.0\.machine"):
        record.load_results(path)
    path = write_results(tmp_path / "r2", [ROW | {"values": {"workload": "x", "sped": 1}}])
    no_column = r"bench_x.json: rows\.0\.values: keys \['sped'\] have no column"
    with pytest.raises(record.ResultsError, match=no_column):
        record.load_results(path)


def test_append_rows_stamps_machine_load_date_and_keeps_earlier_rows(tmp_path, monkeypatch):
    monkeypatch.setenv(record.RESULTS_DIR_ENV, str(tmp_path))
    record.append_rows("bench_x", [dict(workload="a", speed=1.0)], source="bench_x.py")
    path = record.append_rows("bench_x", [dict(workload="b", speed=2.0, extra=3)],
                              source="bench_x.py --more")
    results = record.load_results(path)
    assert [r.values["workload"] for r in results.rows] == ["a", "b"]
    assert [c.key for c in results.columns] == ["workload", "speed", "extra"]
    for row in results.rows:
        assert row.machine and row.date and isinstance(row.load_average, float)
    assert [r.source for r in results.rows] == ["bench_x.py", "bench_x.py --more"]
    record.append_rows("bench_x", [dict(workload="c")], source="x", load_average="0.4-1.2")
    assert record.load_results(path).rows[-1].load_average == "0.4-1.2"
    assert "| b | 2 | 3 |" in tables.render(results)


def test_the_committed_page_is_what_the_committed_results_render_to():
    assert tables.main(["--check"]) == 0, "run: python bench/tables.py"
