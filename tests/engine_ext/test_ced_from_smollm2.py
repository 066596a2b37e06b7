"""The CED model built from a Llama's weights: its encoder is the Llama's first layers, exactly,
as long as the sequence fits in the window W; beyond W the window is real."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import tiny_llama

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.from_smollm2 import NEW_PARTS, ced_from_llama, check_shape, load_smollm2_ced
from engine_ext.config import EngineConfig, get_preset
from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.routers.layer_cache import all_layer_states

TINY = EngineConfig(vocab_size=100, d_model=32, num_heads=4, d_ff=64, num_layers=4,
                    num_encoder_layers=2, kv_source_layers=(2,), index_layers=(2, 3), window=8,
                    d_latent=8, d_index=8, index_topk=4, rope_theta=10000.0, norm_eps=1e-6)
"""tiny_llama's shape (4 query heads over 2 KV heads), its layers 0-1 the encoder, W = 8."""


def _ids(n: int, vocab: int, seed: int = 5) -> torch.Tensor:
    return torch.randint(0, vocab, (2, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _encoder_vs_llama(ced, hf, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(CED encoder output, the Llama's output of the same layer in engine_ext's runner)."""
    ids = _ids(n, ced.config.vocab_size)
    layers = ced.config.num_encoder_layers
    ref = all_layer_states(DecoderOnlyEngine(hf), ids, layers)[-1]  # [2, n, D]
    return CEDEngine(ced).encode(ids, chunk_size=5), ref  # chunks cross W: still exact


def test_a_tiny_llama_becomes_the_encoder_exactly_within_the_window():
    hf = tiny_llama()
    ced = ced_from_llama(hf, TINY)
    out, ref = _encoder_vs_llama(ced, hf, TINY.window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out, ref = _encoder_vs_llama(ced, hf, 3 * TINY.window)
    torch.testing.assert_close(out[:, : TINY.window], ref[:, : TINY.window], rtol=1e-5, atol=1e-5)
    assert (out[:, TINY.window :] - ref[:, TINY.window :]).abs().amax() > 1e-2  # the window
    assert torch.equal(ced.lm_head.weight, hf.lm_head.weight)  # untied here, copied
    new = [n for n, _ in ced.named_parameters() if n.split(".")[-2] in NEW_PARTS]
    assert {n.split(".")[-2] for n in new} == set(NEW_PARTS)
    assert ced_from_llama(hf, TINY, seed=1).state_dict()[new[0]].ne(
        ced.state_dict()[new[0]]).any()  # seeded random, not copied


def test_a_config_that_disagrees_with_the_llama_is_refused():
    hf = tiny_llama()
    check_shape(TINY, hf.config)
    for update in ({"rope_theta": 100000.0}, {"norm_eps": 1e-5}, {"d_ff": 128},
                   {"num_heads": 2}):
        with pytest.raises(ValueError, match=next(iter(update))):
            check_shape(TINY.model_copy(update=update), hf.config)


@pytest.fixture(scope="module")
def smollm2_pair():
    from engine_ext.decoder_only import load_smollm2

    hf, _ = load_smollm2(torch.float32)
    ced, _ = load_smollm2_ced(hf_model=hf)  # check_shape: the preset is SmolLM2's shape
    return ced, hf


def test_smollm2_ced_encoder_is_smollm2_layer_8_up_to_w_tokens(smollm2_pair):
    ced, hf = smollm2_pair
    cfg = get_preset("smollm2_ced")
    assert ced.config == cfg and cfg.num_encoder_layers == 9 and cfg.index_layers[0] == 9
    assert ced.lm_head.weight is ced.model.embed_tokens.weight  # tied, as in SmolLM2
    w = cfg.window
    out, ref = _encoder_vs_llama(ced, hf, w + 72)
    assert ref.abs().amax() > 100  # SmolLM2's residual stream has large outlier dimensions
    torch.testing.assert_close(out[:, :w], ref[:, :w], rtol=1e-5, atol=5e-4)
    assert (out[:, w:] - ref[:, w:]).abs().amax() > 1.0
