"""The cluster jobs' CPU path: the Slurm batch script run by bash, and the Ray job on a local
Ray instance, each profiling the CED engine (quick grid) and fitting a profile file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sim.cost.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "calibrate" / "cluster"))

import ray_calibrate  # noqa: E402


def test_slurm_script_runs_its_cpu_path_and_writes_a_valid_profile(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DEVICE": "cpu", "ENGINE": "ced",
           "QUICK": "1", "REPEATS": "1", "OUT": str(tmp_path / "samples"),
           "PROFILES": str(tmp_path / "profiles"), "MOLCAP": f"{sys.executable} -m app.cli"}
    done = subprocess.run(["bash", str(REPO / "calibrate/cluster/slurm_calibrate.sbatch")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    profile = load_profile(tmp_path / "profiles" / "cpu-ced-ced-small.yaml")
    assert profile.model == "ced-small" and profile.engine.name == "molcap-ced"
    assert profile.num_samples > 0 and (tmp_path / "samples" / "samples").is_dir()
    # The profile records the exact profile command, flags included, to rerun it.
    assert profile.commands[0] == ("molcap calibrate measure --engine ced --device cpu "
                                   f"--gpu-kind cpu --repeats 1 --quick --out {tmp_path}/samples")


def test_ray_job_maps_accelerator_types_to_catalogue_kinds():
    resources = {"CPU": 16.0, "GPU": 8.0, "accelerator_type:H100": 1.0,
                 "accelerator_type:A100": 1.0}
    assert ray_calibrate.gpu_kinds(resources) == ["A100", "H100"]
    assert [ray_calibrate.RAY_TO_CATALOGUE[k] for k in ray_calibrate.gpu_kinds(resources)] == [
        "A100-80GB", "H100-SXM"]


def test_ray_job_profiles_a_cpu_cluster_on_a_local_ray(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    written = ray_calibrate.main(["--engine", "ced", "--device", "cpu", "--quick", "--repeats",
                                  "1", "--out", str(tmp_path / "out"), "--profiles",
                                  str(tmp_path / "profiles")])
    assert written == [tmp_path / "profiles" / "cpu-ced-ced-small.yaml"]
    assert load_profile(written[0]).hardware.gpu == "cpu"
    assert load_profile(written[0]).commands[0] == (
        "molcap calibrate measure --engine ced --device cpu --gpu-kind cpu --repeats 1 --quick "
        f"--out {tmp_path}/out/cpu")
