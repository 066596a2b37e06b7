"""MoL L0: a LoRA on SmolLM2 that decodes the domain label from a route prompt listing the options.

Decision = prefill of the route prompt under L0, then greedy decode of the label up to a newline.
The LoRA sits on the layers above the routing layer k only (as the serving adapters do), so the
layers 0..k see the route prompt without any adapter: their output is computed once per sample
(no gradient, cached in memory) and training runs only layers k+1.. and the LM head at the label
positions (teacher forcing). The prompt has no reason field: the label alone is decoded, and the
card's decode work counts exactly those tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_ext.decoder_only import DecoderCache, DecoderOnlyEngine
from engine_ext.forward_context import forward_context
from engine_ext.lora import LoraSpec, LoraWeights, apply_lora, extract_slot, init_slot, lora_modules
from engine_ext.routers.states import turn_ids
from engine_ext.routing import pad_token_lists

TRAIN_SLOT_NAME = "_l0_training"
MAX_LABEL_TOKENS = 8


def route_prefix(option_names: tuple[str, ...]) -> str:
    """The shared head of every route prompt of one option set."""
    return "Route the request to one of: " + ", ".join(option_names) + ".\nRequest:"


@dataclass(frozen=True)
class RouteSample:
    """Token ids of one route prompt and of its label continuation (label + newline)."""

    prompt: list[int]
    target: list[int]


def route_samples(tokenizer, option_names: tuple[str, ...], texts: tuple[str, ...],
                  labels: tuple[int, ...]) -> list[RouteSample]:
    """Prompt '<prefix> <text>\\nDomain:' and target ' <option>\\n', tokenized piecewise."""
    prefix = turn_ids(tokenizer, route_prefix(option_names))
    return [RouteSample(prefix + turn_ids(tokenizer, f" {text}\nDomain:"),
                        turn_ids(tokenizer, f" {option_names[label]}\n"))
            for text, label in zip(texts, labels, strict=True)]


@dataclass
class LowerStates:
    """Layer-k output of padded prompt+target sequences, with the label-loss mask."""

    states: torch.Tensor
    """[N, T, D] output of layer k (adapter-free)."""
    tokens: torch.Tensor
    """[N, T] ids."""
    loss_mask: torch.Tensor
    """[N, T] True where position t predicts a label token tokens[t+1]."""


@torch.no_grad()
def lower_states(engine: DecoderOnlyEngine, samples: list[RouteSample],
                 batch: int = 16) -> LowerStates:
    """Teacher-forced sequences through layers 0..k, once."""
    seqs = [s.prompt + s.target for s in samples]
    tokens, real = pad_token_lists(seqs)
    mask = torch.zeros_like(real)
    for i, s in enumerate(samples):
        mask[i, len(s.prompt) - 1 : len(s.prompt) + len(s.target) - 1] = True
    states = torch.cat([engine.prefill_shared(engine.new_cache(len(tokens[i : i + batch])),
                                              tokens[i : i + batch])
                        for i in range(0, len(tokens), batch)])
    return LowerStates(states, tokens, mask)


def upper_label_loss(engine: DecoderOnlyEngine, lower: LowerStates, pick: torch.Tensor,
                     adapter: str | None) -> torch.Tensor:
    """Cross-entropy (nats) of the label tokens, running layers k+1.. from the cached states."""
    states, tokens, mask = lower.states[pick], lower.tokens[pick], lower.loss_mask[pick]
    b, t = tokens.shape
    cache = DecoderCache(kv=[None] * len(engine.layers), tokens=tokens, boundary=states)
    positions = torch.arange(t)
    ctx = engine.registry.context([adapter] * b, positions.expand(b, t), [t] * b)
    with forward_context(ctx):
        h = engine._run_layers(states, cache, engine.route_layer + 1, len(engine.layers),
                               positions)
    logits = engine.hf.lm_head(engine.hf.model.norm(h[:, :-1][mask[:, :-1]]))
    return F.cross_entropy(logits, tokens[:, 1:][mask[:, :-1]])


def train_l0(engine: DecoderOnlyEngine, spec: LoraSpec, lower: LowerStates, *, steps: int,
             batch: int, lr: float, seed: int) -> tuple[LoraWeights, list[float]]:
    """A fresh LoRA (seeded) trained on the label loss; the engine's registry is left as it was."""
    model = engine.hf
    apply_lora(model, spec, max_loras=engine.registry.max_loras,
               max_lora_rank=engine.registry.max_lora_rank)
    slot = min(set(range(engine.registry.max_loras)) - set(engine.registry.slots.values()))
    gen = torch.Generator().manual_seed(seed)
    init_slot(model, spec, slot, gen)
    engine.registry.slots[TRAIN_SLOT_NAME] = slot
    params = [p for m in lora_modules(model).values() for p in (m.lora_a, m.lora_b)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    order = torch.randperm(len(lower.tokens), generator=gen)
    losses = []
    try:
        for step in range(steps):
            pick = order[(torch.arange(batch) + step * batch) % len(order)]
            loss = upper_label_loss(engine, lower, pick, TRAIN_SLOT_NAME)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return extract_slot(model, spec, slot), losses
    finally:
        for p in params:
            p.requires_grad_(False)
        engine.registry.remove(TRAIN_SLOT_NAME)


@torch.no_grad()
def prompt_caches(engine: DecoderOnlyEngine, samples: list[RouteSample]) -> list[DecoderCache]:
    """Layers 0..k of each route prompt (adapter-free, so shared by every trained L0)."""
    caches = []
    for s in samples:
        cache = engine.new_cache(1)
        engine.prefill_shared(cache, torch.tensor([s.prompt]))
        caches.append(cache)
    return caches


@torch.no_grad()
def decode_label(engine: DecoderOnlyEngine, lower: DecoderCache, adapter: str,
                 stop_id: int) -> list[int]:
    """Greedy label tokens after a prompt whose layers 0..k are in `lower` (left unchanged)."""
    cache = DecoderCache(kv=list(lower.kv), tokens=lower.tokens, boundary=lower.boundary)
    logits = engine.handoff_above(cache, adapter, last_only=True)[:, -1]
    prompt_len, out = cache.num_positions, []
    for _ in range(MAX_LABEL_TOKENS):
        nxt = int(logits.argmax(-1))
        if nxt == stop_id:
            break
        out.append(nxt)
        logits = engine.forward(cache, torch.tensor([[nxt]]), adapter, prompt_len=prompt_len,
                                last_only=True)[:, -1]
    return out


def l0_accuracy(engine: DecoderOnlyEngine, tokenizer, adapter: str, caches: list[DecoderCache],
                option_names: tuple[str, ...], labels: tuple[int, ...]) -> float:
    """Share of prompts whose decoded label is exactly the labelled option."""
    stop_id = turn_ids(tokenizer, "\n")[-1]
    hits = 0
    for cache, label in zip(caches, labels, strict=True):
        text = tokenizer.decode(decode_label(engine, cache, adapter, stop_id)).strip()
        hits += text == option_names[label]
    return hits / len(labels)


@torch.no_grad()
def time_decision(engine: DecoderOnlyEngine, tokenizer, adapter: str, sample: RouteSample,
                  batch: int) -> float:
    """Seconds for `batch` copies of one full decision: prompt prefill + label decode."""
    stop_id = turn_ids(tokenizer, "\n")[-1]
    start = time.perf_counter()
    cache = engine.new_cache(batch)
    prompt = torch.tensor([sample.prompt] * batch)
    logits = engine.forward(cache, prompt, adapter, last_only=True)[:, -1]
    for _ in range(len(sample.target)):
        nxt = logits.argmax(-1, keepdim=True)  # [B, 1]
        if int(nxt[0, 0]) == stop_id:
            break
        logits = engine.forward(cache, nxt, adapter, prompt_len=len(sample.prompt),
                                last_only=True)[:, -1]
    return time.perf_counter() - start
