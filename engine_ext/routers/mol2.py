"""MoL2: train and evaluate the pointer head on pooled routing-layer states.

The head (`engine_ext.routing.PointerHead`, the one the vLLM plugin loads) scores a query, the
mean-pooled layer-k state of the user turn, against option embeddings encoded once per option
set. One head serves any option set, so it can be trained on several settings at once (mixed) or
one after the other (staged, where the later setting can make it forget the earlier one).
"""

from __future__ import annotations

from collections.abc import Callable
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
                  lr: float = 2e-3, seed: int = 0, fit_scale: bool = True,
                  weight_decay: float = 0.01, query_dropout: float = 0.0,
                  on_step: Callable[[int], bool] | None = None,
                  query_only: bool = False) -> list[float]:
    """Adam on cross-entropy over each task's options, tasks taken in turn; returns the losses.

    fit_scale: first fit the query standardisation on these tasks' queries (a later stage of
    staged training keeps the statistics of the first). query_dropout: share of the
    standardised query features zeroed per training example (a dropped feature reads as its
    training mean). on_step(steps done) after every step; True stops the training there.
    query_only: only the query projection trains (a head written from a fitted map)."""
    if fit_scale:
        head.query_scale.fit(torch.cat([t.queries for t in tasks]))
    gen = torch.Generator().manual_seed(seed)
    params = head.query_proj.parameters() if query_only else head.parameters()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
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
        query = task.queries[pick]  # [batch, d_query]
        if query_dropout:
            centre = head.query_scale.mean
            query = centre + F.dropout(query - centre, query_dropout)
        loss = F.cross_entropy(pointer_logits(head, query, options), task.labels[pick])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if on_step is not None and on_step(step + 1):
            break
    head.eval()
    return losses


@dataclass(frozen=True)
class HeadTraining:
    """How one head is trained: the values validation chooses, recorded in the card."""

    max_steps: int
    """Training steps of the one-cycle schedule (early stopping may keep an earlier state)."""
    lr: float = 2e-3
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay."""
    query_dropout: float = 0.0
    eval_every: int = 0
    """Steps between validation checks; 0: no early stopping, the last state is kept."""
    patience: int = 4
    """Checks without a better validation accuracy before the run stops."""
    batch: int = 64

    @property
    def label(self) -> str:
        """'lr 0.002, wd 0.01, dropout 0'."""
        return f"lr {self.lr:g}, wd {self.weight_decay:g}, dropout {self.query_dropout:g}"


@dataclass(frozen=True)
class TrainedHead:
    """A head trained with early stopping: the kept step and the validation curve."""

    head: PointerHead
    best_step: int
    best_val: float
    curve: tuple[tuple[int, float], ...]
    """(steps done, validation accuracy) at every check."""
    losses: tuple[float, ...]


def fit_head(head: PointerHead, train: PointerTask, val: PointerTask | None,
             how: HeadTraining, seed: int, from_map: bool = False) -> TrainedHead:
    """Train `head` as `how` says; with `val` and eval_every, keep the state of the best
    validation accuracy (ties: the earlier) and stop after `patience` checks without a gain.
    from_map: a head written from a fitted linear map (mol2_init): its untrained state is
    checked too, as step 0 (the training must beat it), and only its query projection trains
    (the rest holds the map; Adam's steps of about lr per weight on the option side and the
    pointer would scramble it long before they refine it). The test split is never seen."""
    curve: list[tuple[int, float]] = []
    best: dict = {"acc": -1.0, "step": 0, "state": None, "since": 0}

    def check(step: int) -> bool:
        if val is None or not how.eval_every or (step % how.eval_every and step != how.max_steps):
            return False
        acc = accuracy(head, val, fast=True)
        head.train()
        curve.append((step, acc))
        if acc > best["acc"]:
            best.update(acc=acc, step=step, since=0,
                        state={k: v.detach().clone() for k, v in head.state_dict().items()})
        else:
            best["since"] += 1
        return best["since"] >= how.patience

    if from_map:
        check(0)
    losses = train_pointer(head, [train], steps=how.max_steps, batch=how.batch, lr=how.lr,
                           seed=seed, weight_decay=how.weight_decay,
                           query_dropout=how.query_dropout, on_step=check, query_only=from_map)
    if best["state"] is None:
        return TrainedHead(head, len(losses), -1.0, (), tuple(losses))
    head.load_state_dict(best["state"])
    return TrainedHead(head, best["step"], best["acc"], tuple(curve), tuple(losses))


@torch.no_grad()
def encode(head: PointerHead, task: PointerTask) -> OptionCache:
    """The option cache of a task (computed once, as at engine start-up)."""
    return head.encode_options(task.option_embeds, task.option_mask)


def pointer_logits(head: PointerHead, query: torch.Tensor, options: OptionCache
                   ) -> torch.Tensor:
    """head(query, options), with the options' cross-attention keys and values projected once
    per batch instead of once per query: the batch's queries are one sequence attending to
    the same memory, and each query's softmax is its own row, so the logits are the head's.
    Training spends most of its time there otherwise. query [B, d_query] -> [B, O]."""
    q = head.query_proj(head.query_scale(query)).unsqueeze(0)  # [1, B, d_head]
    memory = options.tokens[options.mask].unsqueeze(0)  # [1, M, d_head]: every option token
    ctx, _ = head.cross_attn(q, memory, memory)  # [1, B, d_head]
    q = head.pointer_q(head.query_norm(q + ctx)).squeeze(0)  # [B, d_head]
    return (q @ options.keys.T) * head.scale  # [B, O]


@torch.no_grad()
def predict(head: PointerHead, task: PointerTask, batch: int = 256, fast: bool = False
            ) -> torch.Tensor:
    """Chosen option per query [N] (fast: through pointer_logits; else the head's own
    forward, as the engine runs it)."""
    options = encode(head, task)
    score = (lambda q: pointer_logits(head, q, options)) if fast else (lambda q: head(q, options))
    return torch.cat([score(task.queries[i : i + batch]).argmax(-1)
                      for i in range(0, len(task.queries), batch)])


def accuracy(head: PointerHead, task: PointerTask, fast: bool = False) -> float:
    """Share of queries routed to their labelled option."""
    return float((predict(head, task, fast=fast) == task.labels).float().mean())


def num_params(module: torch.nn.Module) -> int:
    """Trainable parameter count."""
    return sum(p.numel() for p in module.parameters())
