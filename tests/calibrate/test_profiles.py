"""Fitted profile files: the shipped CPU profile, located errors, and scenarios that name one."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.scenario.loading import ScenarioError, load_scenario
from planner.scenario.pricing import DEFAULT_PROFILES, resolve_pricing
from planner.scenario.resolved import gpu_pricing_source, pricing_sources
from sim.cost.cost_model import DEFAULT_COEFFS
from sim.cost.profile import PROFILES_DIR, load_profile, profile_path

SHIPPED = PROFILES_DIR / "cpu-vllm-tiny-llama.yaml"
SCENARIO = """\
model: vllm-tiny-llama
hardware: {{gpu: {gpu}{profile}}}
engine: {{max_num_seqs: 32, max_num_batched_tokens: 2048, block_size: 32,
         max_lora_rank: 8{version}}}
workload: {{kind: punica, num_requests: 20, num_adapters: 2, max_prompt_tokens: 200,
           num_output_tokens: 8}}
strategies:
  - kind: multi_lora
    adapters: [{{name: a, rank: 8}}, {{name: b, rank: 8}}]
"""


def scenario_file(tmp_path: Path, gpu="cpu", profile="", version="", model=None) -> Path:
    text = SCENARIO.format(gpu=gpu, profile=profile and f", profile: {profile}",
                           version=version and f", version: '{version}'")
    if model:
        text = text.replace("model: vllm-tiny-llama", f"model: {model}")
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_shipped_cpu_profile_is_valid_and_is_the_tested_cpu_default():
    profile = load_profile(SHIPPED)
    assert DEFAULT_PROFILES["cpu"] == SHIPPED.stem
    assert profile.hardware.gpu == "cpu" and profile.model == "vllm-tiny-llama"
    assert profile.engine.name == "vllm" and profile.engine.version == "0.32.0"
    # sim's own default for the cpu entry is this profile's coefficients (sim reads no files).
    assert DEFAULT_COEFFS["cpu"] == profile.coefficients
    test_rows = [r for r in profile.fit.errors if r.split == "test"]
    assert test_rows and all(r.num_samples > 0 for r in test_rows)


def test_unnamed_profile_on_cpu_uses_the_shipped_default_and_says_so(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path))
    source = resolve_pricing(scenario)
    assert source.is_default and source.profile.name == SHIPPED.stem
    line = pricing_sources(scenario)["multi_lora"]
    assert "cpu-vllm-tiny-llama" in line and "shipped default for cpu" in line


def test_gpus_without_measurements_say_scaled_from_h100(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, gpu="H200"))
    source = resolve_pricing(scenario)
    assert source.is_default and source.profile.hardware.gpu == "H200"
    assert "scaled from H100 measurements" in pricing_sources(scenario)["multi_lora"]


def test_a_gpu_kind_without_a_profile_says_its_coefficients_are_assumed(tmp_path, monkeypatch):
    monkeypatch.delitem(DEFAULT_PROFILES, "H100-SXM")
    scenario = load_scenario(scenario_file(tmp_path, gpu="H100-SXM"))
    assert resolve_pricing(scenario).profile is None
    assert "assumed" in pricing_sources(scenario)["multi_lora"]


def test_named_profile_prices_the_scenario(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, profile=SHIPPED.stem, version="0.32.0"))
    source = resolve_pricing(scenario)
    assert not source.is_default and source.coeffs == load_profile(SHIPPED).coefficients


@pytest.mark.parametrize("kwargs, needles", [
    (dict(gpu="H100-SXM"), ["GPU 'cpu'", "'H100-SXM'"]),
    (dict(model="qwen2.5-0.5b"), ["model 'vllm-tiny-llama'", "'qwen2.5-0.5b'"]),
    (dict(version="0.31.0"), ["vllm 0.32.0", "'0.31.0'"]),
])
def test_profile_for_another_model_gpu_or_engine_is_refused_naming_both(tmp_path, kwargs,
                                                                         needles):
    path = scenario_file(tmp_path, profile=SHIPPED.stem, **kwargs)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    message = "\n".join(err.value.messages)
    assert message.startswith(f"{path}:2: hardware.profile: ")
    for needle in needles:
        assert needle in message


def _broken_profile(tmp_path: Path, old: str, new: str) -> Path:
    text = SHIPPED.read_text()
    assert old in text
    path = tmp_path / "broken.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def _line(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def test_unknown_key_in_a_profile_is_a_located_error(tmp_path):
    path = _broken_profile(tmp_path, "  step_overhead_s:", "  warp_factor: 3\n  step_overhead_s:")
    with pytest.raises(ScenarioError) as err:
        load_profile(path)
    (message,) = err.value.messages
    assert message.startswith(f"{path}:{_line(path, 'warp_factor')}: coefficients.warp_factor: ")
    assert "unknown key" in message and "step_overhead_s" in message  # lists the allowed keys


def test_out_of_range_coefficient_is_a_located_error(tmp_path):
    path = _broken_profile(tmp_path, "  gemm_flops_efficiency: ", "  gemm_flops_efficiency: 7 #")
    with pytest.raises(ScenarioError) as err:
        load_profile(path)
    (message,) = err.value.messages
    line = _line(path, "gemm_flops_efficiency: 7")
    assert message.startswith(f"{path}:{line}: coefficients.gemm_flops_efficiency: ")
    assert "less than or equal to 1" in message and "7" in message


def test_scenario_naming_a_broken_or_missing_profile_fails_with_both_locations(tmp_path):
    broken = _broken_profile(tmp_path, "  step_overhead_s: ", "  step_overhead_s: -1 #")
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario_file(tmp_path, profile=str(broken)))
    (message,) = err.value.messages
    assert f"scenario.yaml:2: hardware.profile: {broken}:" in message
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario_file(tmp_path, profile="no-such-profile"))
    assert "cannot read cost profile" in err.value.messages[0]
    assert SHIPPED.stem in err.value.messages[0]


def test_profile_paths_resolve_names_and_relative_files(tmp_path):
    assert profile_path("cpu-vllm-tiny-llama") == SHIPPED
    (tmp_path / "mine.yaml").write_text("x")
    assert profile_path("mine.yaml", tmp_path) == tmp_path / "mine.yaml"


def test_a_profile_path_relative_to_the_scenario_is_anchored_to_its_folder(tmp_path, monkeypatch):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.yaml").write_text(SHIPPED.read_text())
    scenario = load_scenario(scenario_file(tmp_path, profile="profiles/mine.yaml"))
    assert scenario.hardware.profile == str((tmp_path / "profiles" / "mine.yaml").resolve())
    monkeypatch.chdir("/")  # a worker process elsewhere still finds it
    assert resolve_pricing(scenario).profile.name == SHIPPED.stem
    named = load_scenario(scenario_file(tmp_path, profile=SHIPPED.stem))
    assert named.hardware.profile == SHIPPED.stem  # names stay names


def test_each_chosen_gpu_is_named_with_the_profile_that_prices_it(tmp_path):
    # A search over other GPU kinds prices them with their own shipped profiles, and the plan's
    # "priced by" line must name that one, not the scenario GPU's.
    scenario = load_scenario(scenario_file(tmp_path, gpu="H200", model="llama-3.1-8b"))
    assert "h200-scaled" in gpu_pricing_source(scenario, "H200")
    assert "h20-scaled" in gpu_pricing_source(scenario, "H20")
    assert "h100-64gb-vllm085" in gpu_pricing_source(scenario, "H100-64GB")


def test_the_reports_cost_profile_table_names_each_chosen_gpus_profile(tmp_path):
    # The report priced the simulation on the scenario's GPU and the plans on the GPU kinds
    # they chose: each gets its own row, naming its own profile (one row per GPU kind).
    import pandas as pd

    from planner.outputs.plan_table import pricing_table
    from planner.scenario.resolved import as_resolved

    resolved = as_resolved(load_scenario(scenario_file(tmp_path, gpu="H200",
                                                       model="llama-3.1-8b")))
    plans = pd.DataFrame([dict(gpu="H20", is_feasible=True), dict(gpu="H20", is_feasible=True),
                          dict(gpu="A100-80GB", is_feasible=True),
                          dict(gpu="H100-64GB", is_feasible=False)])
    table = pricing_table(resolved, plans)
    assert list(table["numbers"]) == ["simulation and comparisons on H200", "plans on H20",
                                      "plans on A100-80GB"]
    assert ["h200-scaled" in table["priced by"][0], "h20-scaled" in table["priced by"][1],
            "a100-80gb-vidur" in table["priced by"][2]] == [True] * 3
