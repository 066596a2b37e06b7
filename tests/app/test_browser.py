"""The dashboard in a real browser: `molcap app` on a free port, driven by Debian's headless
Chromium through chromedriver (selenium; no browser is downloaded). A knob change must update
the chart and the numbers on the page; a screenshot goes to out/app/."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.app.conftest import ROOT

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
HEADLINE = "strategies meet the SLOs"
CHART_Y = """return Array.from(document.querySelectorAll('.js-plotly-plot'))
                  .map(p => (p._fullData || []).map(t => ({name: t.name, x: Array.from(t.x || []),
                                                y: Array.from(t.y || [])})));"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, server.stdout.read()
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"molcap app did not answer on {url} within {timeout_s} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser")
    shutil.copytree(ROOT / "scenarios", folder / "scenarios")
    (folder / "data").symlink_to(ROOT / "data")  # the traces scenarios name as ../data/...
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "app", "--port", str(port), "--address",
         "127.0.0.1", "--out", str(folder / "out")], cwd=folder, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
    _assert_stopped(url)


def _assert_stopped(url: str, timeout_s: float = 30) -> None:
    """SIGTERM to `molcap app` stops the Streamlit server it started (no orphan keeps the port)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).close()
        except OSError:
            return
        time.sleep(0.5)
    raise AssertionError(f"the dashboard still answers on {url} after molcap app was stopped")


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("the dashboard's browser test needs Debian's chromium and chromium-driver "
                    "(make test installs them as root; else: apt-get install -y chromium "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1500,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _wait(driver, predicate, timeout_s: float = 180):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s, poll_frequency=0.5).until(lambda d: predicate(d))


def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _throughput(driver) -> dict[str, float]:
    """Output tokens/s per strategy, read from the first chart's first trace as drawn
    (plotly.js keeps the decoded arrays in `_fullData`)."""
    charts = driver.execute_script(CHART_Y)
    if not charts or not charts[0]:
        return {}
    trace = charts[0][0]
    return dict(zip(trace["x"], trace["y"], strict=True))


def test_a_knob_change_updates_the_chart_and_the_numbers(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(server)
    _wait(browser, lambda d: HEADLINE in _body(d) and len(_throughput(d)) == 9)
    assert "At 0.5 conversations/s" in _body(browser)
    before = _throughput(browser)
    field = browser.find_element(By.CSS_SELECTOR, 'input[aria-label="arrival rate '
                                                  '(conversations/s)"]')
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys("2", Keys.ENTER)
    _wait(browser, lambda d: "At 2 conversations/s" in _body(d)
          and _throughput(d) and _throughput(d) != before)
    after = _throughput(browser)
    assert set(after) == set(before)
    assert after["multi_lora"] > 1.3 * before["multi_lora"], (before, after)
    shots = ROOT / "out" / "app"
    shots.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shots / "browser_test_overview.png"))
