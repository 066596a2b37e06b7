"""SmolLM2 routing-layer states, computed once and cached (the layers up to k are frozen).

The query of MoL2 and Contextual MoL is the mean-pooled output of decoder layer k over the user
turn's tokens: exactly the tokens a request sends to the engine (`turn_ids`), so the vLLM plugin
pools the same positions. Layers 0..k carry no adapter, so their output is a pure function of
the text and the model: `backbones.Backbone.pooled` caches it on disk under STATE_CACHE.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine_ext.decoder_only import DecoderOnlyEngine, load_smollm2
from engine_ext.routing import mean_pool, pad_token_lists

ROUTE_LAYER = 25
"""k on SmolLM2-135M (30 layers): the domain LoRAs of `train_smollm2` sit on layers 26-29."""
STATE_CACHE = Path(".cache/engine_ext/routers/states")
MODEL_NAME = "smollm2-135m"
"""The catalogue name (sim.hardware.catalogue) of SmolLM2-135M-Instruct: router cards carry it."""


def load_route_engine(route_layer: int = ROUTE_LAYER) -> tuple[DecoderOnlyEngine, object]:
    """SmolLM2 (float32) in engine_ext's runner with the route layer set: (engine, tokenizer)."""
    model, tokenizer = load_smollm2(torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    engine = DecoderOnlyEngine(model, max_loras=2, max_lora_rank=8, route_layer=route_layer)
    return engine, tokenizer


def turn_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a user turn as the engine receives it (no special tokens added)."""
    return tokenizer.encode(text, add_special_tokens=False)


@torch.no_grad()
def layer_states(engine: DecoderOnlyEngine, ids: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """Layer-k output of right-padded sequences: states [N, L, D] and mask [N, L].

    Right padding is exact for a causal model: a real position never attends to a later pad.
    """
    tokens, mask = pad_token_lists(ids)
    h = engine.prefill_shared(engine.new_cache(tokens.shape[0]), tokens)
    return h, mask


@torch.no_grad()
def pooled_states(engine: DecoderOnlyEngine, ids: list[list[int]], batch: int = 32) -> torch.Tensor:
    """Mean-pooled layer-k output per sequence [N, D], batched by similar length."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = torch.empty(len(ids), engine.cfg.hidden_size)
    for start in range(0, len(ids), batch):
        pick = order[start : start + batch]
        h, mask = layer_states(engine, [ids[i] for i in pick])
        out[pick] = mean_pool(h, mask)
    return out


@torch.no_grad()
def option_embeddings(engine: DecoderOnlyEngine, tokenizer, descriptions: tuple[str, ...]
                      ) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Token embeddings of each description [O, L, D], mask [O, L], and the token ids."""
    ids = [turn_ids(tokenizer, d) for d in descriptions]
    tokens, mask = pad_token_lists(ids)
    return engine.hf.model.embed_tokens(tokens), mask, ids
