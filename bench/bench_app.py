"""Dashboard responsiveness: seconds from a knob change to the default scenario's new results in
a real browser (`molcap app` driven by Debian's headless Chromium), against the goal of 5 s.
Prints a table, writes out/bench/app.json and appends rows to bench/results/bench_app.json.

    .venv/bin/python bench/bench_app.py [--rates 0.75 1.0 1.5]

Each new arrival rate is a new scenario (a cache miss: every strategy re-simulated on the
what-if cut); going back to a rate already seen is a cache hit. The same changes are also timed as
the page's script run alone (AppTest, no browser) and as the what-if simulations alone (on one
process and on two, interleaved), to split simulation, page work and browser
rendering.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from planner.jobs.dashboard import WHATIF_MAX_TURNS, simulate_scenario, whatif_cut
from planner.scenario.editing import set_field
from planner.scenario.loading import scenario_from_file_text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import append_rows  # noqa: E402

GOAL_S = 5.0
KNOB = 'input[aria-label="arrival rate (conversations/s)"]'


def _serve(folder: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "app", "--port", str(port), "--address",
         "127.0.0.1", "--out", str(folder / "out")], cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("molcap app did not start")


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1500,1400"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


_STATE = """return [Array.from(document.querySelectorAll('[data-testid="stAlert"]'))
                   .map(a => a.textContent).join(' | '),
                 document.querySelectorAll('[data-testid="stProgress"]').length];"""
"""The alerts' text (the headline) and whether a progress bar is up, read in one cheap call
(reading the whole body's text each poll costs the page more than it measures)."""


def _wait_for(driver, text: str, timeout_s: float = 300) -> float:
    from selenium.webdriver.support.ui import WebDriverWait

    def done(d) -> bool:
        alerts, num_progress = d.execute_script(_STATE)
        return text in alerts and num_progress == 0

    start = time.perf_counter()
    WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(done)
    return time.perf_counter() - start


def _change(driver, rate: float) -> float:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = driver.find_element(By.CSS_SELECTOR, KNOB)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(f"{rate:g}", Keys.ENTER)
    return _wait_for(driver, f"At {rate:g} conversations/s on")


def _script_only(folder: Path, rates: list[float]) -> list[float]:
    """Seconds of the Overview page's script run after each knob change (Streamlit's AppTest:
    the server's work without a browser), on a fresh points store."""
    from streamlit.testing.v1 import AppTest

    cwd = Path.cwd()
    os.chdir(folder)
    os.environ["MOLCAP_OUT"] = str(folder / "out-script")
    try:
        at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=600)
        at.run()
        seconds = []
        for rate in rates:
            at.sidebar.number_input(key="knob:workload.arrival_rate_per_s").set_value(rate)
            start = time.perf_counter()
            at.run()
            seconds.append(time.perf_counter() - start)
            assert not at.exception, at.exception
        return seconds
    finally:
        os.chdir(cwd)


def _simulation_only(rates: list[float], num_workers: int) -> list[float]:
    """Seconds of the what-if simulation of each rate on a fresh store, no UI."""
    text = (ROOT / "scenarios" / "default.yaml").read_text(encoding="utf-8")
    seconds = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate in rates:
            edited = set_field(text, "workload.arrival_rate_per_s", rate)
            scenario = scenario_from_file_text(edited, "default.yaml", ROOT / "scenarios")
            start = time.perf_counter()
            simulate_scenario(whatif_cut(scenario), tmp, num_workers=num_workers)
            seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.75, 1.0, 1.5])
    args = parser.parse_args()
    rows = []
    (ROOT / "out" / "bench").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copytree(ROOT / "scenarios", folder / "scenarios")
        (folder / "data").symlink_to(ROOT / "data")
        process, url = _serve(folder)
        driver = _browser()
        try:
            start = time.perf_counter()
            driver.get(url)
            _wait_for(driver, "At 0.5 conversations/s on")
            rows.append(("open, first results (cold)", 0.5, time.perf_counter() - start))
            for rate in args.rates:
                rows.append(("knob change, new scenario (miss)", rate, _change(driver, rate)))
            rows.append(("knob back to a seen value (hit)", args.rates[0],
                         _change(driver, args.rates[0])))
        except Exception:
            driver.save_screenshot(str(ROOT / "out" / "bench" / "app_failure.png"))
            raise
        finally:
            driver.quit()
            process.terminate()
            process.wait(timeout=30)
        scripted = _script_only(folder, args.rates)
    rows += [("page script only (AppTest), miss", rate, s)
             for rate, s in zip(args.rates, scripted, strict=True)]
    for num_workers in (1, 2, 1, 2):  # interleaved: the machine's load drifts
        rows += [(f"simulation only, no UI, {num_workers} process(es)", rate, s)
                 for rate, s in zip(args.rates, _simulation_only(args.rates, num_workers),
                                    strict=True)]
    print(f"| step | arrival rate (conv/s) | seconds | within {GOAL_S:g} s |")
    print("|---|---|---|---|")
    for step, rate, seconds in rows:
        print(f"| {step} | {rate:g} | {seconds:.2f} | {'yes' if seconds <= GOAL_S else 'no'} |")
    out = ROOT / "out" / "bench" / "app.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        goal_s=GOAL_S, whatif_turns_per_strategy=WHATIF_MAX_TURNS,
        rows=[dict(step=s, arrival_rate_per_s=r, seconds=t) for s, r, t in rows],
        load_average=os.getloadavg(), cpu_count=os.cpu_count(),
        python=platform.python_version()), indent=2) + "\n")
    append_rows("bench_app", [dict(step=step, rate=f"{rate:g}", seconds=seconds,
                                   within_goal="yes" if seconds <= GOAL_S else "no")
                              for step, rate, seconds in rows],
                source="bench/bench_app.py " + " ".join(sys.argv[1:]))
    print(f"wrote {out}; appended to bench/results/bench_app.json")


if __name__ == "__main__":
    main()
