"""Routing across a real prefill -> decode KV transfer: two vLLM engine processes joined by vLLM's
shared-storage connector, KV keyed by prompt and adapter; the decision travels in the request's
kv_transfer_params, counters add up across both processes."""

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
)

from calibrate.verify_routing import plugin_config
from engine_ext.vllm_plugin.counters import sum_counters
from engine_ext.vllm_plugin.hashing import adapter_hash
from engine_ext.vllm_plugin.kv_transfer import DECISIONS
from engine_ext.vllm_plugin.runtime import HASH_KEY

MAX_TOKENS = 12
NUM_ROUTED, NUM_DELIVERED = 4, 3
BLOCK = 32


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    setup = routed_setup(tmp_path_factory.mktemp("pd"))
    # The decode side knows the adapters but has no router: a decision must come across.
    decode_config = setup.root / "decode.json"
    decode_config.write_text(json.dumps({**setup.config, "router": None}))
    loras = {n: [n, i + 1, str(p)] for i, (n, p) in enumerate(setup.paths.items())}
    # Prompts of 2-3 KV blocks: the full blocks cross in files, the tail is recomputed. The first
    # prompt is also sent naming r1 and r2: one prompt, three requests, two adapters' KV.
    prompts = [prompt_ids(700 + i, 70 + 9 * i) for i in range(NUM_ROUTED)]
    requests = ([{"prompt": p, "lora": None} for p in prompts]
                + [{"prompt": prompts[0], "lora": loras[n]} for n in ("r1", "r2")])
    prefilled = run_pd_prefill(setup, requests)
    # What a P/D proxy sends to decode: prompt + first token, the kv_transfer_params, the named
    # adapter. The last routed prompt never reaches decode (undelivered); the second is also
    # sent once with its metadata dropped by the proxy.
    sent = [dict(prompt=r["prompt"] + [out["first"]], lora=r["lora"], routed=r["lora"] is None,
                 extra={"kv_transfer_params": out["kv_transfer_params"]}
                 if out["kv_transfer_params"] else None)
            for r, out in zip(requests, prefilled, strict=True)]
    sent = sent[:NUM_DELIVERED] + sent[NUM_ROUTED:] + [{**sent[1], "extra": None,
                                                        "dropped": True}]
    with plugin_config(decode_config):
        decode = create_llm(setup.root / "model", enable_prefix_caching=False,
                            max_num_batched_tokens=256,
                            kv_transfer_config=pd_transfer_config("kv_consumer",
                                                                  str(setup.root / "kv")))
        outs = pd_decode(decode, sent, MAX_TOKENS - 1)
        yield dict(setup=setup, requests=requests, prefilled=prefilled, sent=sent, outs=outs,
                   loras=loras)
        shutdown_llm(decode)


def _expected(setup, sent: dict, name: str | None) -> list[int]:
    """engine_ext's greedy continuation of the decode prompt under `name`."""
    return setup.ref.generate(sent["prompt"], name, max_new_tokens=MAX_TOKENS - 1)


def test_decode_after_the_transfer_equals_the_chosen_adapter_named_explicitly(pd):
    setup, chosen = pd["setup"], set()
    for request, out in zip(pd["requests"][:NUM_DELIVERED], pd["prefilled"], strict=False):
        name = setup.choice(request["prompt"])
        full = setup.ref.generate(request["prompt"], name, max_new_tokens=MAX_TOKENS)
        assert out["first"] == full[0]
        assert out["kv_transfer_params"] == {HASH_KEY: adapter_hash(str(setup.paths[name]))}
        chosen.add(name)
    for sent, (tokens, loaded) in zip(pd["sent"][:NUM_DELIVERED], pd["outs"], strict=False):
        name = setup.choice(sent["prompt"][:-1])
        assert tokens == _expected(setup, sent, name)
        assert loaded == (len(sent["prompt"]) - 2) // BLOCK * BLOCK  # the KV came across
    assert chosen - {None}  # an adapter was applied on the decode side


def test_one_prompt_under_different_adapters_never_shares_kv(pd):
    # The first prompt was prefilled routed and naming r1 and r2 (a routed and a named request,
    # two named adapters, one prompt): each decode loads the KV its own adapter computed.
    setup = pd["setup"]
    same = [(s, out) for s, out in zip(pd["sent"], pd["outs"], strict=True)
            if s["prompt"][:-1] == pd["requests"][0]["prompt"]]
    assert len(same) == 3 and len({s["prompt"][-1] for s, _ in same}) >= 2
    for sent, (tokens, loaded) in same:
        name = sent["lora"][0] if sent["lora"] else setup.choice(sent["prompt"][:-1])
        assert tokens == _expected(setup, sent, name), name
        assert loaded == 64  # from the transfer, not recomputed
    folders = [f for f in (setup.root / "kv").iterdir() if not f.name.startswith(".")]
    assert len(folders) == NUM_ROUTED + 1  # routed prompts, plus the adapter the router left out
    assert not list((setup.root / "kv" / DECISIONS).rglob("*.json"))  # all handed to the proxy


def test_a_request_whose_metadata_was_dropped_reads_no_routed_kv(pd):
    # Without kv_transfer_params the decode side has no decision: it runs the base model on KV
    # it computes itself, never on the routed adapter's KV stored for that prompt.
    sent, (tokens, loaded) = pd["sent"][-1], pd["outs"][-1]
    assert sent.get("dropped") and sent["lora"] is None
    assert tokens == _expected(pd["setup"], sent, None)
    assert loaded == 0


def test_counters_add_up_across_both_processes(pd):
    totals = sum_counters(pd["setup"].counters)
    by_pid = {p["pid"]: p["counts"] for p in totals.per_process}
    prefill = next(c for pid, c in by_pid.items() if pid != os.getpid())
    decode = by_pid[os.getpid()]
    assert len(by_pid) == 2
    assert prefill["written"] == NUM_ROUTED and prefill["read"] == 0
    assert decode["read"] == decode["applied"] == NUM_DELIVERED and decode["unknown"] == 0
    assert totals.undelivered == NUM_ROUTED - NUM_DELIVERED
