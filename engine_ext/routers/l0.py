"""MoL L0: a LoRA on SmolLM2 that decodes the domain label from a route prompt listing the options.

The route prompt is `<prefix><request>`: the prefix lists the options and is the same for every
request of one option set, so it is prefilled once, by the base model (no adapter), and its KV
in every layer is shared by all decisions (a prefix cache, like an engine's). A decision is the
prefill of the request part `" <turn>\\nDomain:"` under L0, attending to the cached prefix, then
greedy decode of the label up to a newline. L0 acts on the request and label positions only.

The LoRA sits on the layers above the routing layer k only (as the serving adapters do), so the
layers 0..k see the request without any adapter: their output is computed once per sample
(cached in memory) and training runs only layers k+1.. and the LM head at the label positions
(teacher forcing), over the cached prefix KV. The prompt has no reason field: the label alone is
decoded, and the card's decode work counts exactly those tokens.
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
class RoutePrompts:
    """Token ids of one option set's prefix, and per sample the request part and the label."""

    prefix: list[int]
    requests: list[list[int]]
    """' <text>\\nDomain:' per sample."""
    targets: list[list[int]]
    """' <option>\\n' per sample (the label continuation)."""

    def prompt(self, i: int) -> list[int]:
        """Sample i's whole route prompt."""
        return self.prefix + self.requests[i]


def route_prompts(tokenizer, option_names: tuple[str, ...], texts: tuple[str, ...],
                  labels: tuple[int, ...]) -> RoutePrompts:
    """The prompts of `texts`, tokenized piecewise (prefix, request, label)."""
    return RoutePrompts(turn_ids(tokenizer, route_prefix(option_names)),
                        [turn_ids(tokenizer, f" {t}\nDomain:") for t in texts],
                        [turn_ids(tokenizer, f" {option_names[y]}\n")
                         for y in labels[: len(texts)]])


@dataclass(frozen=True)
class PrefixCache:
    """The prefix's KV in every layer under the base model [1, H_kv, P, hd], and its ids."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    tokens: torch.Tensor

    def cache(self, batch: int, upper_from: int | None = None) -> DecoderCache:
        """A decoder cache holding the prefix for `batch` sequences (views, no copy); with
        upper_from, only layers >= upper_from hold it (the rest are left empty)."""
        kv = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
              if upper_from is None or i >= upper_from else None
              for i, (k, v) in enumerate(self.kv)]
        return DecoderCache(kv=kv, tokens=self.tokens.expand(batch, -1))


@torch.no_grad()
def prefix_cache(engine: DecoderOnlyEngine, prefix: list[int]) -> PrefixCache:
    """Prefill the prefix once, adapter-free, through every layer."""
    cache = engine.new_cache(1)
    engine.forward(cache, torch.tensor([prefix]), None, last_only=True)
    return PrefixCache(kv=list(cache.kv), tokens=cache.tokens)


@dataclass
class LowerStates:
    """Layer-k output of padded request+label sequences after the prefix, with the loss mask."""

    states: torch.Tensor
    """[N, T, D] output of layer k (adapter-free; zero beyond each sequence's length)."""
    tokens: torch.Tensor
    """[N, T] ids."""
    loss_mask: torch.Tensor
    """[N, T] True where position t predicts a label token tokens[t+1]."""
    lengths: torch.Tensor
    """[N] request+label tokens of each sequence (a batch runs up to its longest only)."""

    def batch(self, pick: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """States, ids and loss mask of samples `pick`, cut at their longest sequence (right
        padding is exact for a causal model: no real position attends to a later pad)."""
        t = int(self.lengths[pick].max())
        return self.states[pick, :t], self.tokens[pick, :t], self.loss_mask[pick, :t]


@torch.no_grad()
def lower_states(engine: DecoderOnlyEngine, prefix: PrefixCache, prompts: RoutePrompts,
                 batch: int = 16) -> LowerStates:
    """Teacher-forced request+label sequences through layers 0..k after the prefix, once
    (batched by similar length, each batch to its longest sequence)."""
    seqs = [r + t for r, t in zip(prompts.requests, prompts.targets, strict=True)]
    tokens, real = pad_token_lists(seqs)
    mask = torch.zeros_like(real)
    for i, r in enumerate(prompts.requests):
        mask[i, len(r) - 1 : len(seqs[i]) - 1] = True
    lengths = real.sum(1)
    states = torch.zeros(*tokens.shape, engine.cfg.hidden_size)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for start in range(0, len(order), batch):
        pick = torch.tensor(order[start : start + batch])
        t = int(lengths[pick].max())
        states[pick, :t] = engine.prefill_shared(prefix.cache(len(pick)), tokens[pick, :t])
    return LowerStates(states, tokens, mask, lengths)


def _upper(engine: DecoderOnlyEngine, prefix: PrefixCache, states: torch.Tensor,
           adapter: str | None, cache: DecoderCache | None = None) -> torch.Tensor:
    """Layers k+1.. under `adapter` over layer-k states [B, T, D] placed after the prefix."""
    b, t, _ = states.shape
    cache = cache or prefix.cache(b, upper_from=engine.route_layer + 1)
    p = prefix.tokens.shape[1]
    positions = torch.arange(p, p + t)
    ctx = engine.registry.context([adapter] * b, positions.expand(b, t), [p + t] * b)
    with forward_context(ctx):
        return engine._run_layers(states, cache, engine.route_layer + 1, len(engine.layers),
                                  positions)


def _label_logits(engine: DecoderOnlyEngine, prefix: PrefixCache, lower: LowerStates,
                  pick: torch.Tensor, adapter: str | None) -> tuple[torch.Tensor, ...]:
    """Logits at the label positions of samples `pick` (layers k+1.. from the cached states),
    their target ids and the loss mask of the batch [B, T-1]."""
    states, tokens, mask = lower.batch(pick)
    h = _upper(engine, prefix, states, adapter)
    logits = engine.hf.lm_head(engine.hf.model.norm(h[:, :-1][mask[:, :-1]]))
    return logits, tokens[:, 1:][mask[:, :-1]], mask[:, :-1]


def upper_label_loss(engine: DecoderOnlyEngine, prefix: PrefixCache, lower: LowerStates,
                     pick: torch.Tensor, adapter: str | None) -> torch.Tensor:
    """Cross-entropy (nats) of the label tokens, running layers k+1.. from the cached states."""
    logits, targets, _ = _label_logits(engine, prefix, lower, pick, adapter)
    return F.cross_entropy(logits, targets)


@torch.no_grad()
def label_hits(engine: DecoderOnlyEngine, prefix: PrefixCache, lower: LowerStates,
               adapter: str | None, batch: int = 32) -> torch.Tensor:
    """Per sample [N] bool: every label token, the closing newline included, is the argmax
    after the ones before it (teacher forced): greedy decoding writes exactly the label. One
    pass of layers k+1.. per sample, no decode loop (the validation accuracy)."""
    out = []
    for start in range(0, len(lower.tokens), batch):
        pick = torch.arange(start, min(start + batch, len(lower.tokens)))
        logits, targets, mask = _label_logits(engine, prefix, lower, pick, adapter)
        right = torch.ones(mask.shape, dtype=torch.bool)
        right[mask] = logits.argmax(-1) == targets
        out.append(right.all(1))
    return torch.cat(out)


@dataclass(frozen=True)
class Validation:
    """Check the label accuracy on `lower` every `every` steps (and before the first), keep the
    best state, stop after `patience` checks without a gain (0: never stop early)."""

    lower: LowerStates
    every: int
    patience: int = 0


def _sample_order(num: int, batch: int, steps: int, gen: torch.Generator) -> torch.Tensor:
    """Sample indices of every step [steps, batch]: a fresh seeded permutation per epoch."""
    need = -(-steps * batch // num)
    return torch.cat([torch.randperm(num, generator=gen) for _ in range(need)])[
        : steps * batch].view(steps, batch)


def train_l0(engine: DecoderOnlyEngine, spec: LoraSpec, prefix: PrefixCache, lower: LowerStates,
             *, steps: int, batch: int, lr: float, seed: int, val: Validation | None = None
             ) -> tuple[LoraWeights, list[float], list[tuple[int, float]]]:
    """A fresh LoRA (seeded) trained on the label loss with AdamW and a one-cycle schedule; the
    engine's registry is left as it was. Returns the weights (with `val`: the checked state of
    best validation accuracy), the loss per step and the validation curve [(step, accuracy)]."""
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
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    order = _sample_order(len(lower.tokens), batch, steps, gen)
    losses, curve, best = [], [], None
    try:
        for step in range(steps + 1):
            if val is not None and (step % val.every == 0 or step == steps):
                acc = float(label_hits(engine, prefix, val.lower, TRAIN_SLOT_NAME).float().mean())
                curve.append((step, acc))
                if best is None or acc > best[0]:
                    best = (acc, len(curve), extract_slot(model, spec, slot))
                elif val.patience and len(curve) - best[1] >= val.patience:
                    break
            if step == steps:
                break
            loss = upper_label_loss(engine, prefix, lower, order[step], TRAIN_SLOT_NAME)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        return (best[2] if best else extract_slot(model, spec, slot)), losses, curve
    finally:
        for p in params:
            p.requires_grad_(False)
        engine.registry.remove(TRAIN_SLOT_NAME)


@dataclass
class RequestLower:
    """One request's layers 0..k after the prefix (adapter-free: shared by every trained L0)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    """Layers 0..k: the request positions' own KV [1, H_kv, T, hd]."""
    states: torch.Tensor
    """[1, T, D] output of layer k."""
    tokens: torch.Tensor


@torch.no_grad()
def request_lowers(engine: DecoderOnlyEngine, prefix: PrefixCache,
                   prompts: RoutePrompts) -> list[RequestLower]:
    """Layers 0..k of each request after the prefix, keeping only the request's own KV."""
    p, out = prefix.tokens.shape[1], []
    for request in prompts.requests:
        cache = prefix.cache(1, upper_from=None)
        tokens = torch.tensor([request])
        h = engine.prefill_shared(cache, tokens)
        kv = [(k[:, :, p:].clone(), v[:, :, p:].clone())
              for k, v in cache.kv[: engine.route_layer + 1]]
        out.append(RequestLower(kv=kv, states=h, tokens=tokens))
    return out


@torch.no_grad()
def request_logits(engine: DecoderOnlyEngine, prefix: PrefixCache, lower: RequestLower,
                   adapter: str) -> tuple[torch.Tensor, DecoderCache]:
    """Logits [1, V] after the request (layers k+1.. under `adapter` from the cached states)
    and the cache holding the prefix and the request in every layer."""
    k = engine.route_layer
    kv = [(torch.cat([pk, rk], 2), torch.cat([pv, rv], 2))
          for (pk, pv), (rk, rv) in zip(prefix.kv[: k + 1], lower.kv, strict=True)]
    cache = DecoderCache(kv=kv + list(prefix.kv[k + 1 :]),
                         tokens=torch.cat([prefix.tokens, lower.tokens], 1))
    h = _upper(engine, prefix, lower.states, adapter, cache)
    return engine.hf.lm_head(engine.hf.model.norm(h[:, -1:]))[:, -1], cache


@torch.no_grad()
def decode_label(engine: DecoderOnlyEngine, prefix: PrefixCache, lower: RequestLower,
                 adapter: str, stop_id: int) -> list[int]:
    """Greedy label tokens of one request whose layers 0..k are in `lower`."""
    logits, cache = request_logits(engine, prefix, lower, adapter)
    prompt_len, out = cache.num_positions, []
    for _ in range(MAX_LABEL_TOKENS):
        nxt = int(logits.argmax(-1))
        if nxt == stop_id:
            break
        out.append(nxt)
        logits = engine.forward(cache, torch.tensor([[nxt]]), adapter, prompt_len=prompt_len,
                                last_only=True)[:, -1]
    return out


def l0_accuracy(engine: DecoderOnlyEngine, tokenizer, adapter: str, prefix: PrefixCache,
                lowers: list[RequestLower], option_names: tuple[str, ...],
                labels: tuple[int, ...]) -> float:
    """Share of requests whose decoded label is exactly the labelled option."""
    stop_id = turn_ids(tokenizer, "\n")[-1]
    hits = 0
    for lower, label in zip(lowers, labels, strict=True):
        text = tokenizer.decode(decode_label(engine, prefix, lower, adapter, stop_id)).strip()
        hits += text == option_names[label]
    return hits / len(labels)


@torch.no_grad()
def time_decision(engine: DecoderOnlyEngine, tokenizer, adapter: str, prefix: PrefixCache,
                  prompts: RoutePrompts, i: int, batch: int) -> float:
    """Seconds for `batch` copies of one full decision over the cached prefix: the request's
    prefill under L0 (every layer) + the label decode."""
    stop_id = turn_ids(tokenizer, "\n")[-1]
    start = time.perf_counter()
    cache = prefix.cache(batch)
    prompt_len = prefix.tokens.shape[1] + len(prompts.requests[i])
    logits = engine.forward(cache, torch.tensor([prompts.requests[i]] * batch), adapter,
                            last_only=True)[:, -1]
    for _ in range(len(prompts.targets[i])):
        nxt = logits.argmax(-1, keepdim=True)  # [B, 1]
        if int(nxt[0, 0]) == stop_id:
            break
        logits = engine.forward(cache, nxt, adapter, prompt_len=prompt_len,
                                last_only=True)[:, -1]
    return time.perf_counter() - start
