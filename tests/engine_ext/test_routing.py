"""Routing heads: cached options, per-request independence, learnability, H19 from the CED."""

from __future__ import annotations

import torch
from engine_helpers import make_engine, tokens

from engine_ext.routing import ContextualHead, PointerHead, Router, mean_pool


def _clusters(num_options: int, dim: int, n: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_options, dim, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, num_options, (n,), generator=gen)
    return centers[labels] + 0.3 * torch.randn(n, dim, generator=gen), labels


def test_mean_pool_ignores_padding():
    h = torch.tensor([[[1.0], [3.0], [100.0]]])
    assert mean_pool(h, torch.tensor([[True, True, False]])).item() == 2.0


@torch.no_grad()
def test_pointer_head_cached_options_and_batch_independence():
    torch.manual_seed(0)
    head = PointerHead(d_query=16, d_option=8, d_head=16, num_heads=2).eval()
    embeds, mask = torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    cache = head.encode_options(embeds, mask)
    query = torch.randn(4, 16)
    logits = head(query, cache)
    assert logits.shape == (4, 3)
    torch.testing.assert_close(logits[2:3], head(query[2:3], head.encode_options(embeds, mask)))
    embeds[1, 4] = 1e3  # padding must not matter
    torch.testing.assert_close(head(query, head.encode_options(embeds, mask)), logits)


def test_pointer_and_contextual_heads_learn_a_separable_routing_task():
    torch.manual_seed(0)
    x, y = _clusters(4, 16, 128, seed=1)
    pointer = PointerHead(d_query=16, d_option=8, d_head=16, num_heads=2)
    contextual = ContextualHead(d_model=16, d_head=16)
    option_embeds, option_mask = torch.randn(4, 3, 8), torch.ones(4, 3, dtype=torch.bool)
    option_h = torch.randn(4, 16)
    params = list(pointer.parameters()) + list(contextual.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    for _ in range(60):
        p_logits = pointer(x, pointer.encode_options(option_embeds, option_mask))
        c_logits = contextual(x, option_h.expand(x.shape[0], -1, -1))
        loss = torch.nn.functional.cross_entropy(p_logits, y) + \
            torch.nn.functional.cross_entropy(c_logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    tx, ty = _clusters(4, 16, 200, seed=2)
    with torch.no_grad():
        acc_p = (pointer(tx, pointer.encode_options(option_embeds, option_mask)).argmax(-1) == ty)
        acc_c = (contextual(tx, option_h.expand(tx.shape[0], -1, -1)).argmax(-1) == ty)
    assert acc_p.float().mean() > 0.9 and acc_c.float().mean() > 0.9


@torch.no_grad()
def test_router_on_ced_h19_is_adapter_independent():
    engine = make_engine()
    head = PointerHead(d_query=32, d_option=32, d_head=16, num_heads=2).eval()
    router = Router.create(head, engine.model.model.embed_tokens, [[1, 2, 3], [4, 5]],
                           ["ffn", "target"])
    turn = tokens(9, batch=2)
    h_a = engine.prefill(engine.new_state(2), turn, ["attn", None]).encoder_hidden
    h_b = engine.prefill(engine.new_state(2), turn, ["target", "ffn"]).encoder_hidden
    assert torch.equal(h_a, h_b)
    choice = router.route(h_a)
    assert len(choice) == 2 and set(choice) <= {"ffn", "target"}
