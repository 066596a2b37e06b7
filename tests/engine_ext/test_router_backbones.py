"""The CED backbone of the routers: padded batches pool exactly, pooled states are cached."""

from __future__ import annotations

import torch

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import get_preset
from engine_ext.data import encode
from engine_ext.routers.backbones import ced_backbone

TEXTS = ("i lost my credit card", "book a table for two tonight", "hi", "what is my balance")


def _engine() -> CEDEngine:
    torch.manual_seed(0)
    return CEDEngine(CEDForCausalLM(get_preset("tiny").model_copy(update={"vocab_size": 260}))
                     .eval())


def _backbone(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"stamp")  # the cache key reads its size and mtime only
    return ced_backbone(_engine(), weights, tmp_path / "states")


@torch.no_grad()
def test_ced_pooled_states_of_a_padded_batch_equal_one_text_at_a_time(tmp_path):
    backbone = _backbone(tmp_path)
    assert backbone.name == "ced-small" and backbone.layer == get_preset("tiny") \
        .first_decoder_layer - 1
    pooled = backbone.pooled(TEXTS)
    for text, row in zip(TEXTS, pooled, strict=True):
        alone = backbone.state_fn(torch.tensor([encode(text)])).mean(1)[0]
        torch.testing.assert_close(row, alone, rtol=1e-5, atol=1e-5)
    [cached] = list((tmp_path / "states").glob("pooled_*.pt"))
    torch.testing.assert_close(torch.load(cached), pooled)
    embeds, mask = backbone.option_embeddings(("chat", "legal advice"))
    assert embeds.shape == (2, 12, backbone.d_model) and mask.sum().item() == 16


@torch.no_grad()
def test_ced_routing_pass_runs_the_encoder_only_in_chunks_and_equals_the_full_pass():
    engine = _engine()
    num_encoder = engine.config.first_decoder_layer
    ran: list[int] = []
    for i, layer in enumerate(engine.model.model.layers):
        layer.self_attn.register_forward_hook(lambda *_, i=i: ran.append(i))
    tokens = torch.tensor([encode("i lost my credit card"), encode("book a table for two!")])
    full = engine.prefill(engine.new_state(2), tokens, None).encoder_hidden
    ran.clear()
    torch.testing.assert_close(engine.encode(tokens), full, rtol=0, atol=0)
    assert ran == list(range(num_encoder))  # the decoder layers are not run
    chunked = engine.encode(tokens, chunk_size=5)  # the encoder's state carries over chunks
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
    history = engine.new_state(2)
    engine.prefill(history, tokens[:, :8], None)
    before = history.num_positions
    both = engine.prefill(engine.new_state(2), tokens, None).encoder_hidden
    torch.testing.assert_close(engine.encode_on_branch(history, tokens[:, 8:]), both[:, 8:],
                               rtol=1e-5, atol=1e-5)
    assert history.num_positions == before  # the branch was a copy
