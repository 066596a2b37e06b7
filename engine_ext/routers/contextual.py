"""Contextual MoL: a q/k head over routing-layer states of the query and of each option.

The option descriptions are encoded after the query in one temporary pass (one sequence: the
query, then every description in a fixed order), so each option's state is read in the context
of this query; the pass leaves nothing behind (on the CED model it runs on a branch of the state,
on SmolLM2 on a throw-away cache). The head scores the pooled query state against each pooled
option state. Layers up to the routing layer are frozen, so the states are computed once per
setting (and cached on disk for SmolLM2) and only the head is trained.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from engine_ext.routing import ContextualHead, mean_pool, pad_token_lists

StateFn = Callable[[torch.Tensor], torch.Tensor]
"""Padded token ids [B, T] -> routing-layer states [B, T, D] (one pass, nothing kept)."""


def one_pass(query: list[int], options: list[list[int]]) -> tuple[list[int], list[tuple[int, int]]]:
    """The temporary-pass sequence and the (start, end) span of the query and of every option."""
    seq, spans = list(query), [(0, len(query))]
    for ids in options:
        spans.append((len(seq), len(seq) + len(ids)))
        seq += ids
    return seq, spans


@torch.no_grad()
def contextual_states(state_fn: StateFn, queries: list[list[int]], options: list[list[int]],
                      batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled query states [N, D] and pooled option states [N, O, D] (in the query's context)."""
    pooled_q, pooled_o = [], []
    for start in range(0, len(queries), batch):
        built = [one_pass(q, options) for q in queries[start : start + batch]]
        tokens, _ = pad_token_lists([seq for seq, _ in built])
        h = state_fn(tokens)  # [B, T, D]
        for row, (_, spans) in enumerate(built):
            means = torch.stack([h[row, a:b].mean(0) for a, b in spans])  # [1 + O, D]
            pooled_q.append(means[0])
            pooled_o.append(means[1:])
    return torch.stack(pooled_q), torch.stack(pooled_o)


def cached_contextual_states(state_fn: StateFn, queries: list[list[int]],
                             options: list[list[int]], path: Path | None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`contextual_states`, read from / written to `path` when given."""
    if path is not None and path.exists():
        return torch.load(path)
    result = contextual_states(state_fn, queries, options)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes may write the same states
        torch.save(result, tmp)
        tmp.replace(path)
    return result


def train_contextual(head: ContextualHead, queries: torch.Tensor, options: torch.Tensor,
                     labels: torch.Tensor, *, steps: int, batch: int = 64, lr: float = 2e-3,
                     seed: int = 0, weight_decay: float = 0.01, check_every: int = 0,
                     on_check: Callable[[int], None] | None = None) -> list[float]:
    """AdamW on cross-entropy over the options (after fitting the feature standardisation on
    the training states); returns the losses. `on_check(step)` is called, the head in eval
    mode, every `check_every` steps (a validation curve)."""
    head.fit_scales(queries, options)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    order = torch.randperm(len(queries), generator=gen)
    losses = []
    head.train()
    for step in range(steps):
        pick = order[(torch.arange(batch) + step * batch) % len(order)]
        loss = F.cross_entropy(head(queries[pick], options[pick]), labels[pick])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if on_check is not None and check_every and (step + 1) % check_every == 0:
            head.eval()
            on_check(step + 1)
            head.train()
    head.eval()
    return losses


@torch.no_grad()
def contextual_accuracy(head: ContextualHead, queries: torch.Tensor, options: torch.Tensor,
                        labels: torch.Tensor) -> float:
    """Share routed to the labelled option."""
    return float((head(queries, options).argmax(-1) == labels).float().mean())


@torch.no_grad()
def time_decision(state_fn: StateFn, head: ContextualHead, query: list[int],
                  options: list[list[int]], batch: int) -> float:
    """Seconds for `batch` copies of one decision: the temporary pass over the options (the
    query's own positions included: they are re-encoded with the options) and the head."""
    seq, spans = one_pass(query, options)
    start = time.perf_counter()
    h = state_fn(torch.tensor([seq] * batch))
    q = mean_pool(h[:, spans[0][0] : spans[0][1]])
    o = torch.stack([h[:, a:b].mean(1) for a, b in spans[1:]], dim=1)  # [B, O, D]
    head(q, o).argmax(-1)
    return time.perf_counter() - start
