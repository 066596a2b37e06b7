"""The three routers on SmolLM2 and real text, at test size: mechanics, equivalences, learning."""

from __future__ import annotations

import pytest
import torch

from engine_ext.data import REPO_TEXT_DIR
from engine_ext.decoder_only import DecoderCache, DecoderOnlyEngine
from engine_ext.routers import l0
from engine_ext.routers.contextual import contextual_states, one_pass
from engine_ext.routers.datasets import clinc_sets
from engine_ext.routers.mol2 import PointerTask, accuracy, create_head, train_pointer
from engine_ext.routers.run_l0 import l0_spec
from engine_ext.routers.run_mol2 import shuffled
from engine_ext.routers.settings import short_names
from engine_ext.routers.states import load_route_engine, option_embeddings, pooled_states, turn_ids

LOW_LAYER = 3
"""Routing layer of the cheap test engine (the trained routers read layer 25)."""


@pytest.fixture(scope="module")
def smollm2():
    engine, tokenizer = load_route_engine()
    low = DecoderOnlyEngine(engine.hf, max_loras=1, max_lora_rank=8, route_layer=LOW_LAYER)
    # The slice: 3 train and 1 test utterance per intent (45 and 15 per domain).
    domains, _ = clinc_sets(REPO_TEXT_DIR, {"test": 1}, seed=0)
    return dict(engine=engine, low=low, tokenizer=tokenizer, domains=domains)


def _tasks(s) -> dict[str, PointerTask]:
    low, tok, domains = s["low"], s["tokenizer"], s["domains"]
    embeds, mask, _ = option_embeddings(low, tok, domains.descriptions)
    return {name: PointerTask(pooled_states(low, [turn_ids(tok, t) for t in split.texts]),
                              torch.tensor(split.labels), embeds, mask)
            for name in ("train", "test") for split in [domains.split(name)]}


def test_mol2_head_learns_real_domains_and_a_shuffled_control_does_not(smollm2):
    tasks = _tasks(smollm2)
    shape = dict(d_head=32, num_heads=2, option_depth=1)
    trained, control = (create_head(576, 0, **shape) for _ in range(2))
    train_pointer(trained, [tasks["train"]], steps=80, seed=0)
    train_pointer(control, [shuffled(tasks["train"], 1)], steps=80, seed=0)
    acc, acc_control = accuracy(trained, tasks["test"]), accuracy(control, tasks["test"])
    print(f"test accuracy {acc:.3f}, shuffled-label control {acc_control:.3f}")
    assert acc > 0.5 and acc_control < 0.25, (acc, acc_control)  # chance: 0.1


@torch.no_grad()
def test_contextual_pass_reads_options_in_the_query_context(smollm2):
    low, tok = smollm2["low"], smollm2["tokenizer"]
    options = [turn_ids(tok, " " + n) for n in short_names(smollm2["domains"])]
    queries = [turn_ids(tok, "i lost my credit card"), turn_ids(tok, "play some jazz music")]
    seq, spans = one_pass(queries[0], options)
    assert spans[0] == (0, len(queries[0])) and spans[-1][1] == len(seq)
    q, o = contextual_states(lambda t: low.prefill_shared(low.new_cache(t.shape[0]), t),
                             queries, options)
    assert q.shape == (2, 576) and o.shape == (2, 10, 576)
    alone = pooled_states(low, [queries[0]])  # causal: the query part ignores the options
    torch.testing.assert_close(q[0], alone[0], rtol=1e-4, atol=1e-4)
    assert (o[0] - o[1]).abs().max() > 1e-2  # option states depend on the query before them


def _fork(cache: DecoderCache) -> DecoderCache:
    """A cache that can be extended without touching `cache` (KV tensors are replaced, never
    written in place)."""
    return DecoderCache(kv=list(cache.kv), tokens=cache.tokens)


def _plain_decode(engine, prompts, i: int, adapter: str, stop: int) -> tuple[torch.Tensor, list]:
    """The reference: the option list through the base model, then the request and each label
    token through every layer under L0, no cached states. (logits after the request and after
    each teacher-forced label token [1 + L, V], greedy label tokens)"""
    cache = engine.new_cache(1)
    engine.forward(cache, torch.tensor([prompts.prefix]), None)
    logits = engine.forward(cache, torch.tensor([prompts.requests[i]]), adapter)[:, -1]
    forced = torch.cat([logits, engine.forward(_fork(cache),
                                               torch.tensor([prompts.targets[i]]), adapter)[0]])
    out: list[int] = []
    while len(out) < l0.MAX_LABEL_TOKENS and int(logits.argmax(-1)) != stop:
        out.append(int(logits.argmax(-1)))
        logits = engine.forward(cache, torch.tensor([[out[-1]]]), adapter)[:, -1]
    return forced, out


def test_l0_trains_on_label_tokens_and_cached_decode_equals_plain_decode(smollm2):
    engine, tok, domains = smollm2["engine"], smollm2["tokenizer"], smollm2["domains"]
    names = short_names(domains)
    prompts = l0.route_prompts(tok, names, domains.train.texts[:4], domains.train.labels[:4])
    assert prompts.prompt(0)[: len(prompts.prefix)] == turn_ids(tok, l0.route_prefix(names))
    prefix = l0.prefix_cache(engine, prompts.prefix)
    lower = l0.lower_states(engine, prefix, prompts)
    for i, target in enumerate(prompts.targets):  # the loss covers exactly the label tokens
        assert lower.tokens[i, 1:][lower.loss_mask[i, :-1]].tolist() == target
    slots_before = dict(engine.registry.slots)
    val = l0.Validation(lower, every=3)
    weights, losses, curve = l0.train_l0(engine, l0_spec(30), prefix, lower, steps=6, batch=4,
                                         lr=5e-3, seed=0, val=val)
    assert engine.registry.slots == slots_before and losses[-1] < losses[0]
    assert [step for step, _ in curve] == [0, 3, 6]
    engine.add_adapter("l0_test", weights)
    try:
        stop = turn_ids(tok, "\n")[-1]
        [lower_0] = l0.request_lowers(engine, prefix, prompts)[:1]
        cached = l0.decode_label(engine, prefix, lower_0, "l0_test", stop)
        forced, plain = _plain_decode(engine, prompts, 0, "l0_test", stop)
        # the shared prefix and the adapter-free lower half are reused exactly
        logits, cache = l0.request_logits(engine, prefix, lower_0, "l0_test")
        label = engine.forward(cache, torch.tensor([prompts.targets[0]]), "l0_test")[0]
        torch.testing.assert_close(torch.cat([logits, label]), forced, rtol=1e-4, atol=1e-4)
        assert cached == plain and cached
        # the validation accuracy (teacher forced) is the greedy decode's exact-label hit
        lowers = l0.request_lowers(engine, prefix, prompts)
        decoded = [tok.decode(l0.decode_label(engine, prefix, r, "l0_test", stop)).strip()
                   == names[y] for r, y in zip(lowers, domains.train.labels[:4], strict=True)]
        assert l0.label_hits(engine, prefix, lower, "l0_test").tolist() == decoded
        # kept: the checked state of best validation accuracy
        assert max(acc for _, acc in curve) == sum(decoded) / 4
    finally:
        engine.registry.remove("l0_test")
