"""PEFT-format save/load round trip and every bad-input error (file and tensor named)."""

from __future__ import annotations

import json

import pytest
import torch
from engine_helpers import SPECS, make_engine, tokens
from safetensors.torch import load_file, save_file

from engine_ext.lora import LoraSpec, lora_modules, random_lora
from engine_ext.peft_io import CONFIG_NAME, WEIGHTS_NAME, load_peft_adapter, save_peft_adapter
from engine_ext.registry import AdapterLoadError

KEY = "base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight"


@pytest.fixture
def saved(tmp_path):
    engine = make_engine()
    spec = SPECS["attn"].model_copy(update={"base_model": "tiny-ced"})
    weights = random_lora(engine.model, spec, torch.Generator().manual_seed(2))
    return engine, weights, save_peft_adapter(weights, tmp_path / "attn")


@torch.no_grad()
def test_round_trip_loads_the_same_adapter(saved):
    engine, weights, path = saved
    config = json.loads((path / CONFIG_NAME).read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert KEY in load_file(str(path / WEIGHTS_NAME))
    loaded = load_peft_adapter(path, engine.model, base_model="tiny-ced")
    assert loaded.spec == weights.spec
    engine.registry.add("reloaded", loaded, source=str(path))
    engine.registry.remove("ffn")
    engine.registry.add("original", weights)
    seq = tokens(10)
    a = engine.prefill(engine.new_state(), seq, "original").logits
    b = engine.prefill(engine.new_state(), seq, "reloaded").logits
    assert torch.equal(a, b)
    assert not torch.equal(a, engine.prefill(engine.new_state(), seq, "attn").logits)


def _rewrite(path, mutate_tensors=None, mutate_config=None):
    if mutate_tensors:
        tensors = load_file(str(path / WEIGHTS_NAME))
        mutate_tensors(tensors)
        save_file(tensors, str(path / WEIGHTS_NAME))
    if mutate_config:
        config = json.loads((path / CONFIG_NAME).read_text())
        mutate_config(config)
        (path / CONFIG_NAME).write_text(json.dumps(config))


BAD = {
    "wrong_shape": (lambda t: t.__setitem__(KEY, torch.zeros(4, 31)), None, KEY, "shape"),
    "missing_tensor": (lambda t: t.pop(KEY.replace("lora_A", "lora_B")), None,
                       KEY.replace("lora_A", "lora_B"), "missing"),
    "rank_mismatch": (None, lambda c: c.__setitem__("r", 8), "lora_A", "rank"),
    "base_mismatch": (None, lambda c: c.__setitem__("base_model_name_or_path", "other"),
                      "base_model_name_or_path", "other"),
    "missing_module": (lambda t: [t.pop(k) for k in list(t) if "layers.5.self_attn.v_proj" in k],
                       None, "layers.5.self_attn.v_proj", "missing"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_adapter_file_is_refused_with_file_and_tensor(saved, case):
    engine, _, path = saved
    mutate_tensors, mutate_config, tensor, reason = BAD[case]
    _rewrite(path, mutate_tensors, mutate_config)
    with pytest.raises(AdapterLoadError, match=reason) as info:
        load_peft_adapter(path, engine.model, base_model="tiny-ced")
    assert str(path) in info.value.source
    assert tensor in info.value.tensor


def test_placement_violation_in_a_file_loads_nothing(tmp_path):
    engine = make_engine()
    before = {n: m.lora_a.detach().clone() for n, m in lora_modules(engine.model).items()}
    spec = LoraSpec(rank=2, alpha=2, target_modules=("up_proj", "down_proj"), layers=(1, 4))
    path = save_peft_adapter(random_lora(engine.model, spec, torch.Generator()), tmp_path / "enc")
    weights = load_peft_adapter(path, engine.model)  # the file itself is well-formed
    with pytest.raises(AdapterLoadError, match="encoder") as info:
        engine.registry.add("enc", weights, source=str(path))
    assert info.value.tensor.startswith("model.layers.1.")
    assert "enc" not in engine.registry.slots
    after = lora_modules(engine.model)
    assert before.keys() <= after.keys()
    for name, value in before.items():
        assert torch.equal(value, after[name].lora_a)
    assert all(m.ranks[3] == 0 for m in after.values())  # the free slot stayed empty
