"""Building blocks of `engine_ext.train_smollm2` on a tiny random Llama (not the real training)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from engine_helpers import tiny_llama

from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.peft_io import load_peft_adapter, save_peft_adapter
from engine_ext.train_smollm2 import (
    TRAIN_NAME,
    held_out_loss,
    shared_states,
    top_layers_spec,
    train_adapter,
    upper_loss,
)


def _periodic_windows(num: int, length: int, seed: int) -> torch.Tensor:
    """Windows [num, length + 1] of one period-7 sequence at random offsets: easy to learn."""
    pattern = torch.tensor([3, 17, 42, 8, 99, 23, 61])
    starts = torch.randint(0, 7, (num,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([pattern[(torch.arange(length + 1) + s) % 7] for s in starts.tolist()])


def test_top_layer_split_equals_full_forward_and_adapter_learns(tmp_path):
    hf = tiny_llama()
    with torch.no_grad():  # random init logits span < 1 nat; let a confident prediction exist
        hf.lm_head.weight *= 20
    engine = DecoderOnlyEngine(hf, max_loras=2, max_lora_rank=8, route_layer=1)
    spec = top_layers_spec(num_hidden_layers=4, num_layers=2, base_model="tiny")
    assert spec.layers == (2, 3)
    train, held = _periodic_windows(8, 16, seed=0), _periodic_windows(4, 16, seed=1)
    train_states, held_states = shared_states(engine, train), shared_states(engine, held)
    with torch.no_grad():
        full = engine.forward(engine.new_cache(4), held[:, :-1], None)
        full_loss = F.cross_entropy(full.flatten(0, 1), held[:, 1:].flatten())
        torch.testing.assert_close(upper_loss(engine, held_states, held, None), full_loss)
    base = held_out_loss(engine, held_states, held, None)
    weights = train_adapter(engine, spec, train_states, train, steps=12, batch=4, lr=3e-2,
                            generator=torch.Generator().manual_seed(0))
    assert TRAIN_NAME not in engine.registry.slots
    assert held_out_loss(engine, held_states, held, None) == base  # base and slots untouched
    engine.add_adapter("pattern", load_peft_adapter(save_peft_adapter(weights, tmp_path / "a"),
                                                    hf, base_model="tiny"))
    assert held_out_loss(engine, held_states, held, "pattern") < base - 1.0
