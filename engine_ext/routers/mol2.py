"""MoL2: train and evaluate the pointer head on pooled routing-layer states.

The head (`engine_ext.routing.PointerHead`, the one the vLLM plugin loads) scores a query, the
mean-pooled layer-k state of the user turn, against option embeddings encoded once per option
set. One head serves any option set, so it can be trained on several settings at once (mixed) or
one after the other (staged, where the later setting can make it forget the earlier one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_ext.routing import OptionCache, PointerHead


@dataclass(frozen=True)
class PointerTask:
    """One setting's data for the pointer head."""

    queries: torch.Tensor
    """[N, D] mean-pooled layer-k states."""
    labels: torch.Tensor
    """[N] long option index."""
    option_embeds: torch.Tensor
    """[O, L, D] token embeddings of the option descriptions."""
    option_mask: torch.Tensor
    """[O, L] bool."""

    def __post_init__(self) -> None:
        if len(self.queries) == 0 or len(self.queries) != len(self.labels):
            raise ValueError(f"{len(self.queries)} queries for {len(self.labels)} labels")


def create_head(d_model: int, seed: int, d_query: int | None = None, **shape) -> PointerHead:
    """A freshly initialised pointer head (seeded) for queries of d_query (default d_model)
    features; shape: d_head, num_heads, option_depth."""
    torch.manual_seed(seed)
    return PointerHead(d_query or d_model, d_model, **shape)


def train_pointer(head: PointerHead, tasks: list[PointerTask], *, steps: int, batch: int = 64,
                  lr: float = 2e-3, seed: int = 0, fit_scale: bool = True) -> list[float]:
    """Adam on cross-entropy over each task's options, tasks taken in turn; returns the losses.

    fit_scale: first fit the query standardisation on these tasks' queries (a later stage of
    staged training keeps the statistics of the first)."""
    if fit_scale:
        head.query_scale.fit(torch.cat([t.queries for t in tasks]))
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    orders = [torch.randperm(len(t.queries), generator=gen) for t in tasks]
    cursors = [0] * len(tasks)
    losses = []
    head.train()
    for step in range(steps):
        k = step % len(tasks)
        task, order = tasks[k], orders[k]
        pick = order[(torch.arange(batch) + cursors[k]) % len(order)]
        cursors[k] += batch
        options = head.encode_options(task.option_embeds, task.option_mask)
        loss = F.cross_entropy(head(task.queries[pick], options), task.labels[pick])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    head.eval()
    return losses


@torch.no_grad()
def encode(head: PointerHead, task: PointerTask) -> OptionCache:
    """The option cache of a task (computed once, as at engine start-up)."""
    return head.encode_options(task.option_embeds, task.option_mask)


@torch.no_grad()
def predict(head: PointerHead, task: PointerTask, batch: int = 256) -> torch.Tensor:
    """Chosen option per query [N]."""
    options = encode(head, task)
    return torch.cat([head(task.queries[i : i + batch], options).argmax(-1)
                      for i in range(0, len(task.queries), batch)])


def accuracy(head: PointerHead, task: PointerTask) -> float:
    """Share of queries routed to their labelled option."""
    return float((predict(head, task) == task.labels).float().mean())


def num_params(module: torch.nn.Module) -> int:
    """Trainable parameter count."""
    return sum(p.numel() for p in module.parameters())
