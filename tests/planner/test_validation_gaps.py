"""`molcap validate` catches what `run` would fail on, each with a located line: trace files
(opened and checked row by row, FILE:LINE of the bad row), custom GPU specs, tensor parallel
sizes, empty lists, block sizes and the prefill token budget."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from planner_helpers import molcap

from planner.scenario.loading import ScenarioError, load_scenario

TRACE_SCENARIO = """\
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB}
strategies: [{kind: base}]
workload:
  kind: trace
  path: trace.csv
"""
HEADER = "timestamp,input_length,output_length\n"


def messages(path: Path) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return info.value.messages


def scenario_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# name -> (trace file text, or None for no file; line of the bad row; words)
TRACES = {
    "missing": (None, None, "no such trace file"),
    "no_rows": (HEADER, None, "no rows"),
    "missing_column": ("timestamp,input_length\n0,5\n", 2, "output_length"),
    "text_cell": (HEADER + "0,5,1\n1,ten,1\n", 3, "'ten'"),
    "nan_length": (HEADER + "0,5,1\n1,nan,1\n", 3, "nan"),
    "inf_length": (HEADER + "0,5,1\n1,inf,1\n", 3, "inf"),
    "negative_length": (HEADER + "0,5,1\n1,5,-2\n", 3, "-2"),
    "nan_time": (HEADER + "0,5,1\nnan,5,1\n", 3, "nan"),
    "inf_time": (HEADER + "0,5,1\ninf,5,1\n", 3, "inf"),
    "negative_time": (HEADER + "0,5,1\n-4,5,1\n", 3, "-4"),
    "longer_than_the_context": (HEADER + "0,5,1\n1,40000,10\n", 3, "32768"),
}


@pytest.mark.parametrize("case", sorted(TRACES))
def test_a_bad_trace_is_caught_by_validation_with_its_row(tmp_path, case):
    text, row, words = TRACES[case]
    trace = tmp_path / "trace.csv"
    if text is not None:
        trace.write_text(text, encoding="utf-8")
    path = scenario_file(tmp_path, TRACE_SCENARIO)
    (message,) = messages(path)
    if row:  # a bad row: its own location first, then the scenario field that named the file
        assert message.startswith(f"{trace}:{row}: "), message
        assert message.endswith(f"(workload.path, {path}:6)"), message
    else:  # the file itself: the scenario's line
        assert message.startswith(f"{path}:6: workload.path: {trace}: "), message
    assert words in message, message


def test_a_trace_path_that_is_a_folder(tmp_path):
    (tmp_path / "trace.csv").mkdir()
    (message,) = messages(scenario_file(tmp_path, TRACE_SCENARIO))
    assert "is not a file" in message


def test_a_good_trace_validates(tmp_path):
    (tmp_path / "trace.csv").write_text(HEADER + "0,5,1\n1,7,2\n", encoding="utf-8")
    assert load_scenario(scenario_file(tmp_path, TRACE_SCENARIO)).workload.path.endswith(
        "trace.csv")


CUSTOM_GPU = """\
model: qwen2.5-0.5b
hardware:
  gpu:
    name: my-gpu
    bf16_dense_flops: 1.0e+15
    hbm_bytes: 8.0e+10
    hbm_bandwidth_bytes_per_s: 3.0e+12
    nvlink_bandwidth_bytes_per_s: 0
    pcie_bandwidth_bytes_per_s: 3.2e+10
    price_per_hour_usd: 2
    sources: {"*": "assumed: a test GPU"}
strategies: [{kind: base}]
"""


@pytest.mark.parametrize("field,value", [
    ("hbm_bytes", ".inf"), ("bf16_dense_flops", ".nan"), ("hbm_bandwidth_bytes_per_s", "true"),
    ("bf16_dense_flops", "1.0e+40"), ("hbm_bytes", "1.0e+30"), ("price_per_hour_usd", ".inf")])
def test_a_custom_gpu_rejects_non_finite_boolean_and_absurd_values(tmp_path, field, value):
    text = "\n".join(f"    {field}: {value}" if line.startswith(f"    {field}:") else line
                     for line in CUSTOM_GPU.splitlines()) + "\n"
    path = scenario_file(tmp_path, text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith(f"    {field}"))
    found = messages(path)
    assert any(m.startswith(f"{path}:{line}: hardware.gpu.{field}: ") for m in found), found


def test_the_custom_gpu_itself_is_valid(tmp_path):
    assert load_scenario(scenario_file(tmp_path, CUSTOM_GPU)).hardware.gpu_spec.name == "my-gpu"


BASE = """\
model: qwen2.5-0.5b
hardware: {gpu: A100-80GB, num_gpus_per_replica: 4, tensor_parallel_size: 4}
strategies:
  - kind: multi_lora
    adapters: [{name: a, rank: 8}]
"""


@pytest.mark.parametrize("extra,line,field,words", [
    ("", 2, "hardware.tensor_parallel_size", "14 attention heads"),  # qwen2.5-0.5b: 14 heads
    ("search: {tensor_parallel_sizes: [1, 3]}\n", 6, "search.tensor_parallel_sizes",
     "14 attention heads"),
    ("search: {gpus: []}\n", 6, "search.gpus", "at least 1"),
    ("search: {tensor_parallel_sizes: []}\n", 6, "search.tensor_parallel_sizes", "at least 1"),
    ("analysis: {context_tokens: []}\n", 6, "analysis.context_tokens", "at least 1"),
])
def test_tensor_parallel_and_empty_lists(tmp_path, extra, line, field, words):
    text = BASE if not extra else BASE.replace("num_gpus_per_replica: 4, tensor_parallel_size: 4",
                                               "num_gpus_per_replica: 2, tensor_parallel_size: 2")
    found = messages(scenario_file(tmp_path, text + extra))
    assert any(m.split(": ", 1)[0].endswith(f":{line}") and f": {field}" in m and words in m
               for m in found), found


def test_an_empty_module_list(tmp_path):
    text = BASE.replace("num_gpus_per_replica: 4, tensor_parallel_size: 4",
                        "num_gpus_per_replica: 1").replace(
        "{name: a, rank: 8}", "{name: a, rank: 8, target_modules: []}")
    found = messages(scenario_file(tmp_path, text))
    assert any(":5: strategies.0.adapters.0.target_modules" in m for m in found), found


BLOCK = """\
model: llama-3.1-8b
hardware: {gpu: A100-80GB}
engine: {block_size: 4096, gpu_memory_utilization: 0.218}
strategies: [{kind: base}]
workload: {kind: punica, max_prompt_tokens: 1000, num_output_tokens: 10}
"""


def test_a_block_size_the_pool_cannot_hold(tmp_path):
    (message,) = messages(scenario_file(tmp_path, BLOCK))
    assert ":3: engine.block_size: " in message and "4096" in message


def test_a_request_longer_than_the_pool_holds(tmp_path):
    text = BLOCK.replace("block_size: 4096", "block_size: 16").replace(
        "max_prompt_tokens: 1000", "max_prompt_tokens: 30000")
    (message,) = messages(scenario_file(tmp_path, text))
    assert ":5: workload.max_prompt_tokens: " in message and "KV pool" in message


def test_chunked_prefill_off_needs_a_budget_for_the_longest_prompt(tmp_path):
    text = """\
    model: qwen2.5-0.5b
    hardware: {gpu: A100-80GB}
    engine: {enable_chunked_prefill: false, max_num_batched_tokens: 512}
    strategies: [{kind: base}]
    workload: {kind: punica, max_prompt_tokens: 2048}
    """
    (message,) = messages(scenario_file(tmp_path, text))
    assert ":3: engine.max_num_batched_tokens: " in message and "2048" in message
    ok = text.replace("max_num_batched_tokens: 512", "max_num_batched_tokens: 4096")
    assert load_scenario(scenario_file(tmp_path, ok)).engine.max_num_batched_tokens == 4096


def test_a_scenario_without_an_arrival_rate_is_valid(tmp_path):
    text = BASE.replace("num_gpus_per_replica: 4, tensor_parallel_size: 4",
                        "num_gpus_per_replica: 1")
    scenario = load_scenario(scenario_file(tmp_path, text + "workload: {kind: punica}\n"))
    assert scenario.workload.arrival_rate_per_s is None


def test_a_file_that_is_not_a_trace_is_not_echoed(tmp_path):
    (tmp_path / "trace.csv").write_text("password:x:hunter2:/root\nmore:secret\n")
    path = scenario_file(tmp_path, TRACE_SCENARIO)
    result = molcap("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2 and "missing column(s)" in result.stderr
    assert "hunter2" not in result.stderr and "password" not in result.stderr
    assert "\N{CROSS MARK}" not in result.stderr  # no emoji for ":x:"-like text either


def test_a_value_that_looks_like_an_emoji_code_prints_as_typed(tmp_path):
    path = scenario_file(tmp_path, "name: x\nmodel: ':x:'\nstrategies: [{kind: base}]\n")
    result = molcap("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2 and "':x:'" in result.stderr, result.stderr
