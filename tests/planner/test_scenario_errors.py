"""Bad scenario files: one located message per problem, `FILE:LINE: field.path: message`.

Each message must name the file, the line, the field path, the given value and what is allowed.
Also: the schema round trip, the JSON Schema and the shipped scenarios.
"""

from __future__ import annotations

import json
import textwrap
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from planner.scenario.loading import ScenarioError, load_scenario
from planner.scenario.schema import Scenario
from sim.hardware.catalogue import get_gpu, get_model

REPO = Path(__file__).resolve().parents[2]
CED_HARDWARE = """\
model: ced-40
hardware:
  gpu: H200
  num_gpus_per_replica: 8
  tensor_parallel_size: 8
"""


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def line_of(path: Path, needle: str, occurrence: int = 1) -> int:
    """1-based line of the `occurrence`-th line of the file containing `needle`."""
    hits = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln]
    return hits[occurrence - 1]


def messages_of(path: Path) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value) == "\n".join(info.value.messages)
    return info.value.messages


def one_message(path: Path, line: int, field: str) -> str:
    """The file's single message; it must start `FILE:LINE: field: `."""
    messages = messages_of(path)
    assert len(messages) == 1, messages
    prefix = f"{path}:{line}: {field}: "
    assert messages[0].startswith(prefix), (prefix, messages[0])
    return messages[0][len(prefix):]


def accepted(tmp_path: Path, text: str) -> Scenario:
    return load_scenario(write(tmp_path, text, "good.yaml"))


# ---- malformed YAML and duplicate keys -----------------------------------------------------

def test_malformed_yaml_unclosed_bracket(tmp_path):
    path = write(tmp_path, """\
        name: demo
        strategies: [{kind: base}
        seed: 3
        """)
    [message] = messages_of(path)
    assert message.startswith(f"{path}:3: malformed YAML: ")


def test_malformed_yaml_bad_indentation(tmp_path):
    path = write(tmp_path, """\
        engine:
          max_num_seqs: 4
           block_size: 16
        strategies: [{kind: base}]
        """)
    [message] = messages_of(path)
    assert message.startswith(f"{path}:3: malformed YAML: ")


def test_duplicate_top_level_key(tmp_path):
    path = write(tmp_path, """\
        name: first
        strategies: [{kind: base}]
        name: second
        """)
    [message] = messages_of(path)
    assert message.startswith(f"{path}:3: ")
    assert "duplicate key 'name'" in message
    assert "line 1" in message


def test_duplicate_nested_key(tmp_path):
    path = write(tmp_path, """\
        engine:
          max_num_seqs: 4
          block_size: 16
          max_num_seqs: 8
        strategies: [{kind: base}]
        """)
    [message] = messages_of(path)
    assert message.startswith(f"{path}:4: ")
    assert "duplicate key 'max_num_seqs'" in message
    assert "line 2" in message


# ---- unknown keys --------------------------------------------------------------------------

def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, "strategies: [{kind: base}]\nseeed: 3\n")
    rest = one_message(path, 2, "seeed")
    assert "unknown key 'seeed'" in rest
    assert "'seed'" in rest and "'strategies'" in rest  # the allowed keys


def test_unknown_nested_key(tmp_path):
    path = write(tmp_path, """\
        engine:
          max_num_seqs: 4
          max_num_seqz: 8
        strategies: [{kind: base}]
        """)
    rest = one_message(path, 3, "engine.max_num_seqz")
    assert "unknown key 'max_num_seqz'" in rest
    assert "'max_num_seqs'" in rest and "'block_size'" in rest


def test_unknown_key_inside_a_strategy_of_the_union(tmp_path):
    # replay_window_tokens belongs to the CED strategies, not to multi_lora: exactly one message
    # naming multi_lora's own keys (no follow-on complaint about an empty strategies list).
    path = write(tmp_path, """\
        strategies:
          - kind: multi_lora
            adapters:
              - name: chat
            replay_window_tokens: 128
        """)
    rest = one_message(path, 5, "strategies.0.replay_window_tokens")
    assert "unknown key 'replay_window_tokens'" in rest
    assert "'adapters'" in rest and "'kind'" in rest
    assert "'routing'" not in rest  # another strategy's key is not allowed here


def test_unknown_key_inside_an_adapter(tmp_path):
    path = write(tmp_path, """\
        strategies:
          - kind: multi_lora
            adapters:
              - name: chat
                rnak: 8
        """)
    rest = one_message(path, 5, "strategies.0.adapters.0.rnak")
    assert "unknown key 'rnak'" in rest and "'rank'" in rest


def test_unknown_key_inside_a_workload_of_the_union(tmp_path):
    path = write(tmp_path, """\
        workload:
          kind: conversations
          num_turnz: 4
        strategies: [{kind: base}]
        """)
    rest = one_message(path, 3, "workload.num_turnz")
    assert "unknown key 'num_turnz'" in rest and "'num_turns'" in rest


def test_unknown_strategy_kind(tmp_path):
    path = write(tmp_path, "strategies:\n  - kind: magic\n")
    messages = messages_of(path)
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}:")
    assert "strategies.0" in messages[0] and "'magic'" in messages[0]
    assert "'multi_lora'" in messages[0] and "'mol2'" in messages[0]


# ---- wrong types ---------------------------------------------------------------------------

def test_wrong_type_string_for_integer(tmp_path):
    path = write(tmp_path, "engine:\n  max_num_seqs: lots\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "engine.max_num_seqs")
    assert "valid integer" in rest and "'lots'" in rest


def test_wrong_type_fraction_for_integer(tmp_path):
    path = write(tmp_path, "engine:\n  max_num_seqs: 2.5\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "engine.max_num_seqs")
    assert "integer" in rest and "2.5" in rest


def test_wrong_type_boolean_for_integer(tmp_path):
    # `true` is not a count of sequences; silently reading it as 1 hides the mistake.
    path = write(tmp_path, "engine:\n  max_num_seqs: true\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "engine.max_num_seqs")
    assert "True" in rest or "true" in rest


def test_wrong_type_scalar_for_list(tmp_path):
    path = write(tmp_path, "name: demo\nstrategies: 5\n")
    rest = one_message(path, 2, "strategies")
    assert "tuple" in rest and "5" in rest


def test_wrong_type_for_enum(tmp_path):
    path = write(tmp_path, """\
        strategies:
          - kind: preft
            variant: lora_q
            adapters: [{name: chat}]
        """)
    rest = one_message(path, 3, "strategies.0.variant")
    assert "'lora_q'" in rest and "'lora_p'" in rest and "'direft_p'" in rest


def test_scenario_that_is_not_a_mapping(tmp_path):
    path = write(tmp_path, "- kind: base\n")
    [message] = messages_of(path)
    assert message.startswith(f"{path}:1: ") and "mapping" in message and "list" in message


def test_empty_file(tmp_path):
    path = write(tmp_path, "")
    [message] = messages_of(path)
    assert message.startswith(f"{path}:") and "mapping" in message


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    [message] = messages_of(path)
    assert message.startswith(f"{path}: ") and "cannot read" in message


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    [message] = messages_of(path)
    assert message.startswith(f"{path}:1: cannot read: byte 0xe9 at offset 9")


# ---- negative and absurd values ------------------------------------------------------------

def test_negative_block_size(tmp_path):
    path = write(tmp_path, "engine:\n  block_size: -16\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "engine.block_size")
    assert "-16" in rest and "greater than or equal to 1" in rest


def test_negative_think_time(tmp_path):
    path = write(tmp_path, """\
        workload:
          kind: conversations
          think_time_s: -2.5
        strategies: [{kind: base}]
        """)
    rest = one_message(path, 3, "workload.think_time_s")
    assert "-2.5" in rest and "greater than or equal to 0" in rest


def test_negative_seed(tmp_path):
    path = write(tmp_path, "seed: -1\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 1, "seed")
    assert "-1" in rest and "greater than or equal to 0" in rest


def test_negative_adapter_rank(tmp_path):
    path = write(tmp_path, """\
        strategies:
          - kind: multi_lora
            adapters:
              - {name: chat, rank: -4}
        """)
    messages = messages_of(path)
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}:4: strategies.0.adapters.0.rank: ")
    assert "-4" in messages[0] and "greater than or equal to 1" in messages[0]


def test_negative_gpu_price(tmp_path):
    path = write(tmp_path, "gpu_prices_per_hour_usd:\n  H20: -1.5\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "gpu_prices_per_hour_usd.H20")
    assert "-1.5" in rest and "greater than or equal to 0" in rest


def test_zero_tensor_parallel_size_in_search_space(tmp_path):
    path = write(tmp_path, "search:\n  tensor_parallel_sizes: [1, 0]\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "search.tensor_parallel_sizes.1")
    assert "0" in rest and "greater than or equal to 1" in rest


def test_negative_context_in_analysis_grid(tmp_path):
    text = "analysis:\n  context_tokens: [512, -1024]\nstrategies: [{kind: base}]\n"
    path = write(tmp_path, text)
    rest = one_message(path, 2, "analysis.context_tokens.1")
    assert "-1024" in rest and "greater than or equal to 1" in rest


RATE = """\
workload:
  kind: punica
  arrival_rate_per_s: {}
strategies: [{{kind: base}}]
"""


def test_absurd_rate_as_float(tmp_path):
    # YAML 1.1 needs a dot and a signed exponent for a float: 1.0e+30.
    path = write(tmp_path, RATE.format("1.0e+30"))
    rest = one_message(path, 3, "workload.arrival_rate_per_s")
    assert "1e+30" in rest and "less than or equal to 1000000" in rest


def test_absurd_rate_as_string(tmp_path):
    # Plain `1e30` is a string to YAML 1.1; it is still a rate of 1e30 and still absurd.
    path = write(tmp_path, RATE.format("1e30"))
    rest = one_message(path, 3, "workload.arrival_rate_per_s")
    assert "1e30" in rest and "less than or equal to 1000000" in rest


def test_infinite_rate(tmp_path):
    path = write(tmp_path, RATE.format(".inf"))
    rest = one_message(path, 3, "workload.arrival_rate_per_s")
    assert "inf" in rest and "less than or equal to 1000000" in rest


def test_absurd_request_count(tmp_path):
    path = write(tmp_path, """\
        workload:
          kind: punica
          num_requests: 1000000000000
        strategies: [{kind: base}]
        """)
    rest = one_message(path, 3, "workload.num_requests")
    assert "1000000000000" in rest and "less than or equal to 100000000" in rest


def test_prompt_longer_than_the_model_allows(tmp_path):
    # llama-3.1-8b allows 131072 tokens; 200000 prompt + 128 output = 200128.
    path = write(tmp_path, """\
        model: llama-3.1-8b
        workload:
          kind: punica
          max_prompt_tokens: 200000
          num_output_tokens: 128
        strategies: [{kind: base}]
        """)
    rest = one_message(path, 4, "workload.max_prompt_tokens")
    assert "200128" in rest and "131072" in rest and "llama-3.1-8b" in rest


def test_conversation_longer_than_the_model_allows(tmp_path):
    # qwen2.5-0.5b allows 32768; 1024 + 100 turns * (128 + 256) = 39424 tokens.
    path = write(tmp_path, """\
        model: qwen2.5-0.5b
        workload:
          kind: conversations
          num_turns: 100
        strategies: [{kind: base}]
        """)
    rest = one_message(path, 4, "workload.num_turns")
    assert "39424" in rest and "32768" in rest and "qwen2.5-0.5b" in rest


# ---- adapters and the CED placement rule ---------------------------------------------------

def test_adapter_rank_above_max_lora_rank(tmp_path):
    path = write(tmp_path, """\
        engine:
          max_lora_rank: 16
        strategies:
          - kind: multi_lora
            adapters:
              - name: chat
                rank: 8
              - name: code
                rank: 64
        """)
    rest = one_message(path, 9, "strategies.0.adapters.1.rank")
    assert rest.startswith("64 ") and "max_lora_rank=16" in rest and "1..16" in rest


def test_max_lora_rank_vllm_does_not_offer(tmp_path):
    path = write(tmp_path, "engine:\n  max_lora_rank: 24\nstrategies: [{kind: base}]\n")
    [message] = messages_of(path)
    assert message.startswith(f"{path}:2: engine.max_lora_rank: ")  # the field's own line
    assert "(given: 24)" in message and "allowed: 1, 8, 16, 32" in message


def ced_strategy(kind: str, adapter: str, extra: str = "") -> str:
    return CED_HARDWARE + f"strategies:\n  - kind: {kind}\n{extra}    adapters:\n" + adapter


@pytest.mark.parametrize("kind", ["contextual_mol", "mol2"])
def test_lora_on_the_ced_encoder(tmp_path, kind):
    path = write(tmp_path, ced_strategy(kind, "      - name: chat\n        layers: [5, 25]\n"))
    rest = one_message(path, line_of(path, "layers:"), "strategies.0.adapters.0.layers")
    assert "(5, 'q_proj')" in rest and "25" not in rest.split("breaks")[0]
    assert repr(kind) in rest and "0..19" in rest and "allow_kv_breaking_placement" in rest


@pytest.mark.parametrize("kind", ["contextual_mol", "mol2"])
@pytest.mark.parametrize("module", ["q_proj", "k_proj", "v_proj", "o_proj"])
def test_lora_on_layer_20_attention(tmp_path, kind, module):
    adapter = f"      - name: chat\n        layers: [20, 21]\n        target_modules: [{module}]\n"
    path = write(tmp_path, ced_strategy(kind, adapter))
    rest = one_message(path, line_of(path, "layers:"), "strategies.0.adapters.0.layers")
    assert f"(20, '{module}')" in rest and "(21," not in rest
    assert "[20]" in rest and "FFN" in rest


@pytest.mark.parametrize("kind", ["contextual_mol", "mol2"])
def test_layer_20_ffn_and_layers_21_to_39_are_accepted(tmp_path, kind):
    every = "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"
    adapters = (
        "      - name: ffn20\n        layers: [20]\n"
        "        target_modules: [gate_proj, up_proj, down_proj]\n"
        f"      - name: upper\n        layers: {list(range(21, 40))}\n"
        f"        target_modules: {every}\n"
        "      - name: default\n"  # layers None: every layer the rule allows
    )
    scenario = accepted(tmp_path, ced_strategy(kind, adapters))
    assert [a.name for a in scenario.strategies[0].adapters] == ["ffn20", "upper", "default"]


@pytest.mark.parametrize("kind", ["contextual_mol", "mol2"])
def test_allow_kv_breaking_placement_accepts_encoder_and_layer_20_attention(tmp_path, kind):
    text = ced_strategy(kind, "      - name: chat\n        layers: [0, 19, 20]\n",
                        extra="    allow_kv_breaking_placement: true\n")
    assert accepted(tmp_path, text).strategies[0].allow_kv_breaking_placement


def test_placement_rule_does_not_bind_multi_lora(tmp_path):
    # Multi-LoRA keeps KV per adapter anyway: an encoder adapter is its own business.
    text = ced_strategy("multi_lora", "      - name: chat\n        layers: [0, 20]\n")
    assert accepted(tmp_path, text).strategies[0].adapters[0].layers == (0, 20)


def test_adapter_layer_the_model_does_not_have(tmp_path):
    path = write(tmp_path, ced_strategy("mol2", "      - name: chat\n        layers: [30, 45]\n"))
    rest = one_message(path, line_of(path, "layers:"), "strategies.0.adapters.0.layers")
    assert "[45]" in rest and "0..39" in rest and "ced-40" in rest


def test_shared_kv_strategy_on_a_decoder_only_model(tmp_path):
    path = write(tmp_path, """\
        model: llama-3.1-8b
        strategies:
          - kind: mol2
            adapters: [{name: chat}]
        """)
    rest = one_message(path, 3, "strategies.0.kind")
    assert "'mol2'" in rest and "llama-3.1-8b" in rest and "ced-40" in rest


# ---- hardware ------------------------------------------------------------------------------

def test_model_does_not_fit_the_gpus(tmp_path):
    # llama-3.1-70b: 70.6e9 weights * 2 bytes = 131 GiB, on one 80 GB H100.
    path = write(tmp_path, """\
        model: llama-3.1-70b
        hardware:
          gpu: H100-SXM
          num_gpus_per_replica: 1
        strategies: [{kind: base}]
        """)
    rest = one_message(path, 2, "hardware")
    assert "llama-3.1-70b" in rest and "H100-SXM" in rest and "tensor_parallel_size=1" in rest
    assert "allowed" in rest and "larger tensor_parallel_size" in rest


def test_model_does_not_fit_with_default_hardware_still_names_a_line(tmp_path):
    path = write(tmp_path, "model: llama-3.1-70b\nstrategies: [{kind: base}]\n")
    [message] = messages_of(path)
    assert message.startswith(f"{path}:1: "), message
    assert "llama-3.1-70b" in message


def test_model_fits_once_sharded(tmp_path):
    text = """\
        model: llama-3.1-70b
        hardware: {gpu: H100-SXM, num_gpus_per_replica: 4, tensor_parallel_size: 4}
        strategies: [{kind: base}]
        """
    assert accepted(tmp_path, text).hardware.tensor_parallel_size == 4


def test_tensor_parallel_larger_than_gpus_per_replica(tmp_path):
    path = write(tmp_path, """\
        hardware:
          gpu: H200
          num_gpus_per_replica: 2
          tensor_parallel_size: 4
        strategies: [{kind: base}]
        """)
    [message] = messages_of(path)
    assert message.startswith((f"{path}:1: hardware", f"{path}:4: hardware")), message
    assert "tensor_parallel_size=4" in message and "num_gpus_per_replica=2" in message


# ---- unknown catalogue names ---------------------------------------------------------------

def test_unknown_model_name(tmp_path):
    path = write(tmp_path, "model: llama-9\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 1, "model")
    assert "'llama-9'" in rest and "llama-3.1-8b" in rest and "ced-40" in rest


def test_unknown_gpu_name(tmp_path):
    path = write(tmp_path, "hardware:\n  gpu: H999\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "hardware.gpu")
    assert "'H999'" in rest and "H100-SXM" in rest and "A100-80GB" in rest


def test_unknown_strategy_model_name(tmp_path):
    path = write(tmp_path, "strategies:\n  - kind: base\n    model: gpt-9\n")
    rest = one_message(path, 3, "strategies.0.model")
    assert "'gpt-9'" in rest and "moe-78" in rest


def test_unknown_gpu_in_search_space(tmp_path):
    path = write(tmp_path, "search:\n  gpus: [H200, B300]\nstrategies: [{kind: base}]\n")
    rest = one_message(path, 2, "search.gpus.1")
    assert "'B300'" in rest and "H20" in rest


def test_unknown_gpu_in_prices(tmp_path):
    path = write(tmp_path, "gpu_prices_per_hour_usd:\n  B300: 9.0\nstrategies: [{kind: base}]\n")
    [message] = messages_of(path)
    assert message.startswith(f"{path}:")
    assert "gpu_prices_per_hour_usd" in message and "'B300'" in message and "H200" in message


def test_several_problems_each_get_a_located_line(tmp_path):
    path = write(tmp_path, """\
        engine:
          block_size: 0
        workload:
          kind: punica
          zipf_alpha: -1
        strategies: [{kind: base}]
        """)
    messages = messages_of(path)
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"{path}:2: engine.block_size: ")
    assert messages[1].startswith(f"{path}:5: workload.zipf_alpha: ")


# ---- round trip, JSON Schema, shipped scenarios --------------------------------------------

def every_kind_scenario() -> Scenario:
    adapters = [{"name": "chat", "rank": 8}, {"name": "code", "rank": 16,
                                              "target_modules": ["gate_proj"], "layers": [25]}]
    gpu = get_gpu("H200").model_dump()
    return Scenario.model_validate({
        "name": "round-trip",
        "model": "ced-40",
        "hardware": {"gpu": {**gpu, "name": "my-gpu"}, "num_gpus_per_replica": 8,
                     "tensor_parallel_size": 8, "num_replicas": 2},
        "engine": {"max_num_seqs": 32, "disaggregation": {"num_prefill_workers": 2},
                   "speculative": {"num_speculative_tokens": 4, "mean_accepted_tokens": 2.5}},
        "strategies": [
            {"kind": "base"},
            {"kind": "multi_lora", "adapters": adapters},
            {"kind": "preft", "variant": "direft_p", "adapters": adapters},
            {"kind": "mol", "model": "moe-78", "adapters": adapters, "router_adapter": "code"},
            {"kind": "contextual_mol", "adapters": adapters, "measured_decision_time_s": 1.88},
            {"kind": "mol2", "routing": "outside_engine", "adapters": adapters},
            {"kind": "multi_agent", "model": "llama-3.1-8b", "adapters": adapters},
        ],
        "workload": {"kind": "conversations", "switch_probability": 0.5},
        "slo": {"ttft_p99_s": 2.0},
        "gpu_prices_per_hour_usd": {"H200": 3.0},
        "seed": 7,
    })


def test_round_trip_through_yaml(tmp_path):
    scenario = every_kind_scenario()
    path = tmp_path / "dumped.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    assert load_scenario(path) == scenario


def test_round_trip_with_custom_model(tmp_path):
    arch = get_model("qwen2.5-0.5b").model_dump()
    trace = tmp_path / "azure.csv"
    trace.write_text("timestamp,input_length,output_length\n0,10,2\n", encoding="utf-8")
    scenario = Scenario.model_validate({
        "model": {**arch, "name": "my-qwen"}, "hardware": {"gpu": "cpu"},
        "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 512, "block_size": 32},
        "strategies": [{"kind": "multi_lora", "adapters": [{"name": "a"}]}],
        "workload": {"kind": "trace", "path": str(trace), "rate_scale": 2.0},
    })
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    loaded = load_scenario(path)
    assert loaded == scenario
    assert loaded.model_arch.name == "my-qwen"


def models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def reachable_models() -> list[type[BaseModel]]:
    seen, todo = [], [Scenario]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            todo += models_in(field.annotation)
    return seen


def test_every_model_turns_docstrings_into_descriptions():
    models = reachable_models()
    assert len(models) > 15
    for model in models:
        assert model.model_config.get("use_attribute_docstrings") is True, model.__name__
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def test_json_schema_has_a_description_on_every_field():
    schema = json.loads(json.dumps(Scenario.model_json_schema()))
    defs = schema["$defs"]

    def described(prop: dict) -> bool:
        if prop.get("description"):
            return True
        ref = prop.get("$ref") or next(
            (s.get("$ref") for s in prop.get("anyOf", []) if "$ref" in s), None)
        return bool(ref and defs[ref.split("/")[-1]].get("description"))

    objects = {"Scenario": schema, **defs}
    assert {"Scenario", "EngineConfig", "Mol2Strategy", "PunicaWorkload", "GpuSpec"} <= set(objects)
    for name, obj in objects.items():
        for key, prop in obj.get("properties", {}).items():
            assert described(prop), f"{name}.{key}"
    strategies = schema["properties"]["strategies"]["items"]
    assert strategies["discriminator"]["propertyName"] == "kind"


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_scenario_validates(path):
    assert load_scenario(path).strategies
