"""Dashboard tests run the real app (Streamlit's AppTest, or `molcap app` in Chromium) in a
scratch folder holding a copy of scenarios/, with out/ there too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "app" / "main.py"
SMALL_TURNS = 100
"""Turns per strategy the AppTests simulate (the knob's smallest value): cheap on two cores."""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder with scenarios/ copied in; out/ is written there. Shared by a module so finished
    points (the store) are reused between its tests, as they are between app sessions."""
    folder = tmp_path_factory.mktemp("app")
    shutil.copytree(ROOT / "scenarios", folder / "scenarios")
    (folder / "data").symlink_to(ROOT / "data")  # the traces scenarios name as ../data/...
    return folder


@pytest.fixture
def in_workdir(workdir, monkeypatch) -> Path:
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("MOLCAP_OUT", str(workdir / "out"))
    return workdir


def open_app(page: str | None = None, *, scenario: str | None = None,
             turns: int = SMALL_TURNS) -> AppTest:
    """The app run once on `page` (a script under app/, e.g. "pages/2_latency.py")."""
    at = AppTest.from_file(str(MAIN), default_timeout=240)
    at.session_state["knob:max_turns"] = turns
    if scenario is not None:
        at.session_state["scenario_text"] = Path(scenario).read_text(encoding="utf-8")
        at.session_state["scenario_source"] = scenario
    at.run()
    if page is not None:
        at.switch_page(page).run()
    return at


def no_exceptions(at: AppTest) -> None:
    """The run showed no traceback."""
    assert not at.exception, [e.value for e in at.exception]


def texts(elements) -> list[str]:
    """The text of alerts/markdown elements."""
    return [str(e.value) for e in elements]
