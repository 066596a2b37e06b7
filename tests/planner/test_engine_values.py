"""Engine values vLLM itself refuses, and an adapter that adapts no layer, are located errors
(`FILE:LINE: field: given value; allowed: ...`) in `molcap validate` (exit 2, no traceback),
not accepted settings the simulator then prices."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from planner_helpers import molcap

from planner.scenario.loading import ScenarioError, load_scenario

BASE = """\
model: llama-3.1-8b
hardware: {gpu: H100-SXM}
engine:
  max_num_seqs: 16
  ENGINE
strategies:
  - kind: multi_lora
    adapters:
      - {name: a, rank: 8}
      - {name: b, rank: 8LAYERS}
workload: {kind: punica, num_requests: 20, num_adapters: 2, num_output_tokens: 8,
           arrival_rate_per_s: 2}
"""

BAD_ENGINE = {  # engine line -> the line the message names, and what it must say (field,
    # given value, what is allowed); a rule between two fields is located at `engine:`
    "block_size: 24": ("block_size:", ["engine.block_size", "24", "multiple of 16"]),
    "max_lora_rank: 24": ("max_lora_rank:", ["engine.max_lora_rank", "24",
                                             "1, 8, 16, 32, 64, 128, 256, 320, 512"]),
    "max_num_batched_tokens: 8": ("engine:", ["max_num_batched_tokens", "8", "max_num_seqs"]),
    "{max_loras: 8, max_cpu_loras: 4}": ("engine:", ["max_cpu_loras", "4", "max_loras"]),
}


def _write(folder: Path, engine: str = "", layers: str = "") -> Path:
    text = BASE.replace("ENGINE", engine or "block_size: 16").replace("LAYERS", layers)
    if engine.startswith("{"):
        text = text.replace("  " + engine, "  " + engine[1:-1].replace(", ", "\n  "))
    path = folder / "s.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _line(path: Path, needle: str) -> int:
    return next(i for i, x in enumerate(path.read_text().splitlines(), 1) if needle in x)


def test_the_good_engine_loads(tmp_path):
    load_scenario(_write(tmp_path))


@pytest.mark.parametrize("engine", BAD_ENGINE)
def test_an_engine_value_vllm_refuses_is_a_located_error(tmp_path, engine):
    path = _write(tmp_path, engine)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (message,) = info.value.messages
    where, needles = BAD_ENGINE[engine]
    assert message.startswith(f"{path}:{_line(path, where)}:"), message
    for needle in needles:
        assert needle in message, message


def test_an_adapter_that_adapts_no_layer_is_a_located_error(tmp_path):
    path = _write(tmp_path, layers=", layers: []")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (message,) = info.value.messages
    assert message.startswith(f"{path}:{_line(path, 'layers: []')}:"), message
    assert "strategies.0.adapters.1.layers" in message and "[]" in message, message
    assert "at least one layer" in message, message


def test_validate_exits_2_with_one_line_per_refused_value(tmp_path):
    path = _write(tmp_path, "max_lora_rank: 24")
    done = molcap("validate", str(path), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}:" in done.stderr + done.stdout and "max_lora_rank" in done.stderr + done.stdout
