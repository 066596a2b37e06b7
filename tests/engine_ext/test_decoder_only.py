"""Decoder-only runner: equals HF forward, LoRA vs merged, MoL handoff and layer-k variant."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_helpers import tiny_llama

from engine_ext.decoder_only import DecoderOnlyEngine, chat_prompt_ids, load_smollm2
from engine_ext.lora import LoraSpec, merge_slot, random_lora
from engine_ext.registry import AdapterLoadError

UPPER = LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"), layers=(2, 3))
ALL = LoraSpec(rank=2, alpha=4, target_modules=("o_proj", "up_proj"))


def _ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_runner_matches_hf_forward_and_incremental_decoding():
    hf = tiny_llama()
    engine = DecoderOnlyEngine(hf)
    ids = _ids(20)
    ref = hf(ids).logits
    cache = engine.new_cache()
    logits = torch.cat([engine.forward(cache, ids[:, :12], None),
                        engine.forward(cache, ids[:, 12:], None)], dim=1)
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_lora_in_runner_equals_merged_hf_model():
    hf = tiny_llama()
    engine = DecoderOnlyEngine(hf)
    slot = engine.add_adapter("all", random_lora(hf, ALL, torch.Generator().manual_seed(2)))
    ids = _ids(15)
    logits = engine.forward(engine.new_cache(), ids, "all")
    merged = copy.deepcopy(hf)
    merge_slot(merged, slot)
    torch.testing.assert_close(logits, merged(ids).logits, atol=1e-5, rtol=1e-5)
    assert (logits - hf(ids).logits).abs().max() > 1e-3


@torch.no_grad()
def test_handoff_equals_the_target_merged_into_the_model_and_its_cache_continues():
    # Reference: the HF model with the target adapter merged into its weights, run over the
    # whole sequence at once: no engine code, no cache.
    hf = tiny_llama()
    engine = DecoderOnlyEngine(hf)
    gen = torch.Generator().manual_seed(3)
    engine.add_adapter("src", random_lora(hf, ALL, gen))
    dst = engine.add_adapter("dst", random_lora(hf, UPPER, gen))
    ids, nxt = _ids(18), _ids(1, seed=9)
    merged = copy.deepcopy(hf)
    merge_slot(merged, dst)
    reference = merged(torch.cat([ids, nxt], dim=1)).logits  # [1, 19, V]
    cache = engine.new_cache()
    under_source = engine.forward(cache, ids, "src")
    cache, logits = engine.handoff(cache, "dst")
    torch.testing.assert_close(logits, reference[:, :18], atol=1e-5, rtol=1e-5)
    assert (logits - under_source).abs().max() > 1e-3  # the source's history was not kept
    # The returned cache holds the target's KV: decoding on from it equals the reference.
    torch.testing.assert_close(engine.forward(cache, nxt, "dst"), reference[:, 18:],
                               atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_layer_k_handoff_keeps_shared_layers_and_matches_full_recompute():
    hf = tiny_llama()
    engine = DecoderOnlyEngine(hf, route_layer=1)
    gen = torch.Generator().manual_seed(4)
    with pytest.raises(AdapterLoadError, match="route layer 1"):
        engine.add_adapter("low", random_lora(hf, ALL, gen))
    engine.add_adapter("a", random_lora(hf, UPPER, gen))
    engine.add_adapter("b", random_lora(hf, UPPER.model_copy(update={"rank": 2}), gen))
    ids = _ids(16)
    cache = engine.new_cache()
    engine.forward(cache, ids, "a")
    shared_k = cache.kv[1][0].clone()
    logits = engine.handoff_above(cache, "b")
    assert torch.equal(cache.kv[1][0], shared_k)
    oracle = engine.forward(engine.new_cache(), ids, "b")
    torch.testing.assert_close(logits, oracle, atol=1e-5, rtol=1e-5)
    nxt = _ids(1, seed=9)
    torch.testing.assert_close(engine.forward(cache, nxt, "b"),
                               engine.forward(engine.new_cache(), torch.cat([ids, nxt], 1),
                                              "b")[:, -1:], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def smollm2():
    return load_smollm2()


@torch.no_grad()
def test_smollm2_answers_through_the_runner(smollm2):
    model, tokenizer = smollm2
    engine = DecoderOnlyEngine(model)
    prompt = chat_prompt_ids(tokenizer, [{"role": "user",
                                          "content": "What is the capital of France?"}])
    stop = tuple(tokenizer.encode("<|im_end|>", add_special_tokens=False))
    out = engine.generate(prompt, None, max_new_tokens=12, stop_ids=stop)
    assert "Paris" in tokenizer.decode(out)
