"""Test helpers: a tiny random CED model, adapters with distinct module sets, a tiny Llama."""

from __future__ import annotations

import torch

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import get_preset
from engine_ext.lora import LoraSpec, random_lora

# Adapters on the decoder side only (tiny preset: encoder 0-2, layer E = 3, decoder 3-5).
SPECS = {
    "attn": LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "o_proj"), layers=(4, 5)),
    "ffn": LoraSpec(rank=2, alpha=4, target_modules=("gate_proj", "up_proj", "down_proj"),
                    layers=(3, 4, 5)),
    "target": LoraSpec(rank=4, alpha=4, target_modules=("k_proj", "up_proj", "down_proj"),
                       layers=(4, 5)),
}


def make_engine(seed: int = 0, **engine_kwargs) -> CEDEngine:
    """Tiny CED model (eval mode) with the three SPECS adapters loaded."""
    torch.manual_seed(seed)
    model = CEDForCausalLM(get_preset("tiny")).eval()
    engine = CEDEngine(model, **engine_kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, spec in SPECS.items():
        engine.add_adapter(name, random_lora(model, spec, gen))
    return engine


def tiny_llama(seed: int = 0):
    """Random 4-layer HF Llama (vocabulary 100) in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def tokens(n: int, seed: int = 3, batch: int = 1) -> torch.Tensor:
    """Random token ids [batch, n] for the tiny vocabulary."""
    return torch.randint(0, 64, (batch, n), generator=torch.Generator().manual_seed(seed))
