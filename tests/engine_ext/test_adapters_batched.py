"""Batched heterogeneous LoRA vs merged weights; prefill-only LoRA_P / DiReFT_P masks."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_helpers import SPECS, make_engine, tokens
from torch import nn

from engine_ext.forward_context import ForwardContext, build_token_slots, forward_context
from engine_ext.lora import LoraSpec, apply_lora, merge_slot, random_lora, set_lora_mode
from engine_ext.reft import ReftSpec, random_reft
from engine_ext.registry import AdapterRegistry


def test_lora_linear_sgmv_bgmv_and_merged_agree():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 10))
    spec = LoraSpec(rank=3, alpha=6, target_modules=("0",))
    registry = AdapterRegistry(model, nn.ModuleList(), d_model=12, max_loras=3, max_lora_rank=4)
    gen = torch.Generator().manual_seed(1)
    for name in ("x", "y"):
        registry.add(name, random_lora(model, spec, gen))
    x = torch.randn(2, 5, 12)
    slots = torch.tensor([0, 1, -1, 1, 0, 0, -1, 1, 1, 0])  # [N] = B * T
    with forward_context(ForwardContext(slots)), torch.no_grad():
        grouped = model(x)
        set_lora_mode(model, "bgmv")
        gathered = model(x)
    torch.testing.assert_close(grouped, gathered, atol=1e-6, rtol=1e-6)
    for slot in (-1, 0, 1):
        merged = copy.deepcopy(model)
        if slot >= 0:
            merge_slot(merged, slot)
        with torch.no_grad():
            ref = merged[0].base(x).reshape(-1, 10)
        rows = slots == slot
        torch.testing.assert_close(grouped.reshape(-1, 10)[rows], ref[rows], atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        base = model[0].base(x).reshape(-1, 10)
    assert (grouped.reshape(-1, 10)[slots == 0] - base[slots == 0]).abs().max() > 1e-3


@torch.no_grad()
def test_batched_ced_requests_equal_per_adapter_merged_models():
    engine = make_engine()
    adapters = ["attn", "ffn", None, "target"]
    seq = tokens(21, batch=4)
    batched = engine.prefill(engine.new_state(4), seq, adapters, chunk_size=8).logits
    for i, name in enumerate(adapters):
        merged = copy.deepcopy(engine)
        if name is not None:
            merge_slot(merged.model, merged.registry.slots[name])
        ref = merged.prefill(merged.new_state(1), seq[i : i + 1], None, chunk_size=8).logits
        torch.testing.assert_close(batched[i : i + 1], ref, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(batched[0], batched[1])


def test_token_slots_follow_positions_not_chunks():
    # Request 0 is prefill-only with a prompt of 6: a chunk at positions 4..7 straddles the end.
    positions = torch.tensor([[4, 5, 6, 7], [10, 11, 12, 13]])
    slots = build_token_slots([0, 1], positions, prompt_lens=[6, 6], prefill_only=[True, False])
    assert slots.tolist() == [0, 0, -1, -1, 1, 1, 1, 1]


def _prefill_only_engine(kind: str):
    engine = make_engine(max_loras=5)
    gen = torch.Generator().manual_seed(11)
    if kind == "lora":
        spec = SPECS["target"]
        weights = random_lora(engine.model, spec, gen)
        engine.add_adapter("all", weights)
        engine.add_adapter("pre", type(weights)(spec.model_copy(update={"prefill_only": True}),
                                                weights.tensors))
    else:
        reft = random_reft(ReftSpec(rank=4, layers=(3, 5), prefill_only=False), 32, gen)
        engine.add_adapter("all", reft=reft)
        engine.add_adapter("pre", reft=type(reft)(reft.spec.model_copy(
            update={"prefill_only": True}), reft.tensors))
    return engine


@pytest.mark.parametrize("kind", ["lora", "direft"])
@torch.no_grad()
def test_prefill_only_adapter_under_chunked_prefill(kind):
    engine = _prefill_only_engine(kind)
    prompt_len, seq = 13, tokens(20)
    # Reference: prompt under the all-token adapter, decode tokens on the base weights.
    ref_state = engine.new_state()
    ref = [engine.prefill(ref_state, seq[:, :prompt_len], "all").logits,
           engine.feed_tokens(ref_state, seq[:, prompt_len:], None).logits]
    ref = torch.cat(ref, dim=1)
    # Prefill-only adapter, chunks of 5 that straddle the prompt end, one request.
    state = engine.new_state()
    out = [engine.forward(state, seq[:, i : i + 5], "pre", prompt_len=prompt_len).logits
           for i in range(0, 20, 5)]
    torch.testing.assert_close(torch.cat(out, dim=1), ref, atol=1e-5, rtol=1e-5)
    # And the decode tokens really differ from running the adapter on them.
    full = engine.prefill(engine.new_state(), seq, "all").logits
    assert (full[:, prompt_len:] - ref[:, prompt_len:]).abs().max() > 1e-4


@torch.no_grad()
def test_direft_batched_matches_single_requests():
    engine = _prefill_only_engine("direft")
    seq = tokens(12, batch=3)
    batched = engine.prefill(engine.new_state(3), seq, ["all", None, "target"]).logits
    for i, name in enumerate(["all", None, "target"]):
        single = engine.prefill(engine.new_state(1), seq[i : i + 1], name).logits
        torch.testing.assert_close(batched[i : i + 1], single, atol=1e-5, rtol=1e-5)


def test_apply_lora_is_a_drop_in_linear():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    names = apply_lora(model, LoraSpec(rank=2, alpha=2, target_modules=("2",)))
    assert names == ["2"]
    assert model[2].weight.shape == (2, 4) and model[2].out_features == 2
    x = torch.randn(3, 4)
    assert model(x).shape == (3, 2)  # no context: base weights
