"""Sweeps: expansion, located errors for bad specs, and Ray equal to local point by point."""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from planner.jobs.sweep import run_sweep
from planner.jobs.sweep_spec import load_sweep
from planner.scenario.loading import ScenarioError

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = """
name: tiny
model: llama-3.1-8b
hardware: {gpu: H100-SXM}
strategies:
  - kind: multi_lora
    adapters: [{name: a}, {name: b}]
  - kind: preft
    adapters: [{name: a}, {name: b}]
analysis:
  context_tokens: [512, 2048]
  decode_tokens_per_turn: [16]
"""


def _spec(tmp_path: Path, body: str) -> Path:
    (tmp_path / "base.yaml").write_text(SCENARIO)
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: s\nscenario: base.yaml\n" + body)
    return spec


def _errors(spec: Path) -> list[str]:
    with pytest.raises(ScenarioError) as err:
        load_sweep(spec)
    return err.value.messages


def test_grid_expands_every_combination(tmp_path):
    spec = _spec(tmp_path, "parameters:\n"
                 "  - {field: analysis.num_turn_context_tokens, values: [1024, 2048, 4096]}\n"
                 "  - {field: hardware.gpu, values: [H100-SXM, H200]}\n")
    _, points = load_sweep(spec)
    assert len(points) == 6 and len({p.key for p in points}) == 6
    assert {(p.params["analysis.num_turn_context_tokens"], p.params["hardware.gpu"])
            for p in points} == {
        (c, g) for c in (1024, 2048, 4096) for g in ("H100-SXM", "H200")}
    assert all(p.scenario["hardware"]["gpu"] == p.params["hardware.gpu"] for p in points)

    # Each point's scenario is validated once, at load: resolving the points reads that
    # validation and validates nothing again.
    from planner.jobs.sweep import resolve_points
    from planner.scenario.schema import Scenario

    assert all(p.model == Scenario.model_validate(p.scenario) for p in points)
    calls = []
    real = Scenario.model_validate.__func__
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Scenario, "model_validate",
                      classmethod(lambda cls, *a, **k: calls.append(1) or real(cls, *a, **k)))
        resolved = resolve_points(points)
    assert calls == [] and [r.scenario for r in resolved.values()] == [p.model for p in points]


def test_star_sets_a_field_on_every_strategy(tmp_path):
    spec = _spec(tmp_path, "parameters:\n  - {field: strategies.*.name, values: [x]}\n"
                 "combine: zip\n")
    messages = _errors(spec)  # two strategies named x: the scenario rule rejects it
    assert "parameters.0.values.0" in messages[0] and "labelled 'x'" in messages[0]


def test_bad_value_is_located_on_its_parameter(tmp_path):
    spec = _spec(tmp_path, "parameters:\n  - field: hardware.gpu\n"
                 "    values: [H200, B300]\n")
    (message,) = _errors(spec)
    assert message.startswith(f"{spec}:5: parameters.0.values.1: hardware.gpu='B300'")
    assert "not in the catalogue" in message and "H100-SXM" in message


def test_unknown_spec_key_and_unknown_field(tmp_path):
    spec = _spec(tmp_path, "parameters:\n  - {field: hardware.gpus, values: [2]}\nrepeat: 3\n")
    (message,) = _errors(spec)
    assert message.startswith(f"{spec}:5: repeat:") and "Extra inputs" in message
    spec = _spec(tmp_path, "parameters:\n  - {field: hardware.gpus, values: [2]}\n")
    (message,) = _errors(spec)
    assert "parameters.0.values.0: hardware.gpus=2" in message and "hardware.gpus" in message


def test_zip_needs_equal_lengths_and_base_must_exist(tmp_path):
    spec = _spec(tmp_path, "combine: zip\nparameters:\n"
                 "  - {field: seed, values: [1, 2]}\n  - {field: hardware.gpu, values: [H200]}\n")
    (message,) = _errors(spec)
    assert "same number of values" in message
    spec.write_text("name: s\nscenario: missing.yaml\nparameters: [{field: seed, values: [1]}]\n")
    (message,) = _errors(spec)
    assert message.startswith(f"{spec}:2: scenario: cannot read") and "missing.yaml" in message


def test_cli_rejects_bad_spec_with_exit_2_and_no_traceback(tmp_path):
    spec = _spec(tmp_path, "parameters:\n  - {field: workload.arrival_rate_per_s, "
                 "values: [1.0e+30]}\n")
    done = subprocess.run([sys.executable, "-m", "app.cli", "sweep", str(spec),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"{spec}:4: parameters.0.values.0: workload.arrival_rate_per_s=1e+30" in done.stderr
    assert "less than or equal to 1000000" in done.stderr


def test_cluster_address_runs_the_same_sweep_as_local_processes(tmp_path, monkeypatch):
    """A local Ray cluster (a head and a second node, one worker CPU each) reached by its
    address, as a real cluster would be: the same call, point-by-point the same table."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    spec = _spec(tmp_path, "parameters:\n"
                 "  - {field: analysis.num_turn_context_tokens, values: [1024, 8192]}\n"
                 "  - {field: engine.max_lora_rank, values: [16, 64]}\n")
    local = run_sweep(spec, tmp_path / "local", backend="local", num_workers=2)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    # ray.init() would find a local cluster even without the address: check it is passed on.
    addresses, init = [], ray.init
    monkeypatch.setattr(ray, "init", lambda **kw: addresses.append(kw["address"]) or init(**kw))
    try:
        cluster.add_node(num_cpus=1)
        on_ray = run_sweep(spec, tmp_path / "ray", backend="ray", ray_address=cluster.address)
        assert addresses == [cluster.address]
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert len(nodes) == 2 and sum(n["Resources"].get("CPU", 0) for n in nodes) == 2
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert not local.errors and not on_ray.errors and len(local.table) == 8
    key = ["point", "strategy"]
    pd.testing.assert_frame_equal(local.table.sort_values(key).reset_index(drop=True),
                                  on_ray.table.sort_values(key).reset_index(drop=True))
    shutil.rmtree(tmp_path / "ray")


def test_simulate_sweep_rows_follow_the_varied_field(tmp_path):
    (tmp_path / "base.yaml").write_text(SCENARIO + "workload: {kind: punica, num_requests: 60, "
                                        "num_adapters: 2, num_output_tokens: 16, "
                                        "arrival_rate_per_s: 5.0}\n")
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: sim\nscenario: base.yaml\nevaluate: simulate\nparameters:\n"
                    "  - {field: workload.num_output_tokens, values: [8, 32]}\n")
    result = run_sweep(spec, tmp_path / "out", backend="inline")
    assert not result.errors
    table = result.table.set_index(["workload.num_output_tokens", "strategy"])
    assert len(table) == 4
    # 60 requests each emitting exactly the swept number of output tokens.
    for tokens in (8, 32):
        for strategy in ("multi_lora", "preft"):
            row = table.loc[(tokens, strategy)]
            assert row["num_requests"] == 60
            assert row["output_tokens_per_s"] * row["duration_s"] == pytest.approx(60 * tokens)


def test_each_sweep_point_carries_the_interval_of_the_profile_that_priced_it(tmp_path):
    (tmp_path / "base.yaml").write_text(SCENARIO + "workload: {kind: punica, num_requests: 40, "
                                        "num_adapters: 2, num_output_tokens: 16, "
                                        "arrival_rate_per_s: 5.0}\n")
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: gpus\nscenario: base.yaml\nevaluate: simulate\nparameters:\n"
                    "  - {field: hardware.gpu, values: [H100-64GB, H100-SXM]}\n")
    run_sweep(spec, tmp_path / "out", backend="inline")
    table = pd.read_parquet(tmp_path / "out" / "gpus" / "sweep.parquet")
    measured = table[table["hardware.gpu"] == "H100-64GB"]
    scaled = table[table["hardware.gpu"] == "H100-SXM"]
    # H100-64GB's fitted profile has a held-out validation; the scaled H100-SXM one has none.
    assert measured["ttft_p99_s_measured_error"].all()
    assert (measured["ttft_p99_s_high"] > measured["ttft_p99_s"]).all()
    assert measured["interval_source"].str.startswith("seeds x measured error (").all()
    assert (measured["interval_profile"] == "h100-64gb-vllm085-llama-3.1-8b").all()
    assert not scaled["ttft_p99_s_measured_error"].any()
    assert (scaled["ttft_p99_s_high"] == scaled["ttft_p99_s"]).all()  # one seed: no spread
    assert (scaled["interval_source"] == "seeds only: no measured error").all()
    report = (tmp_path / "out" / "gpus" / "report.html").read_text()
    assert "p99 TTFT (s)" in report and "no measured error" in report
    assert '"error_y"' in report  # the sweep charts draw the intervals
