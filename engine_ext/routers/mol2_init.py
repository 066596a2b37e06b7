"""MoL2's head started from a linear classifier: a probe fitted on the training rows, written
into the pointer head so that its first decisions are the probe's, then trained as usual.

Why it can be: the head scores an option as s * k_o . pointer_q(LN(query_proj(x) + ctx)). With
the cross-attention's output at zero, pointer_q and LN's affine the identity, keys centred
(so LN's mean subtraction does nothing to a query in their span) and at least as many head
dimensions as options (keys of full row rank), query_proj = pinv(s K) [W | b] gives
s K LN(u) = (W x + b) / std(u): the probe's logits times a positive number per query, so the
same argmax. Nothing of the engine's path changes: the options are still encoded once at
start-up and the query is one projection, one cross-attention and a dot product per option.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine_ext.routing import FeatureScale, PointerHead

if TYPE_CHECKING:
    from engine_ext.routers.mol2 import PointerTask

SCALE_ROWS = 1024
"""Training rows that set the scale of the written head's logits."""
TEMPERATURES = tuple(2.0**k for k in range(-4, 13))
"""Factors on the map's logits among which the least training cross-entropy is chosen."""


def fit_linear(x: torch.Tensor, labels: torch.Tensor, num_options: int, l2: float,
               max_iter: int = 200, start: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression by full-batch L-BFGS: mean cross-entropy plus
    l2/2 * |W|^2 (the bias is not shrunk). x [N, F] standardised, labels [N] -> weight [O, F],
    bias [O]; from `start` (weight, bias) when given, else from zero."""
    weight = (torch.zeros(num_options, x.shape[1]) if start is None
              else start[0].clone()).requires_grad_(True)
    bias = (torch.zeros(num_options) if start is None else start[1].clone()).requires_grad_(True)
    opt = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, history_size=20,
                            tolerance_grad=1e-6, tolerance_change=1e-9,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ weight.T + bias, labels) + 0.5 * l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return weight.detach(), bias.detach()


@torch.no_grad()
def fit_ridge(x: torch.Tensor, labels: torch.Tensor, num_options: int,
              l2s: tuple[float, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Ridge regression of one-hot labels on x [N, F] (standardised), one (weight [O, F],
    bias [O]) per l2 in `l2s` (relative to the features' unit variance): a closed form whose
    cost does not grow with the number of options, the Gram matrix shared by every l2."""
    num_rows, num_features = x.shape
    target = F.one_hot(labels, num_options).to(x.dtype)  # [N, O]
    x_mean, y_mean = x.mean(0), target.mean(0)
    centred = x - x_mean
    gram = centred.T @ centred / num_rows  # [F, F]
    moment = centred.T @ (target - y_mean) / num_rows  # [F, O]
    found = []
    for l2 in l2s:
        factor = torch.linalg.cholesky(gram + l2 * torch.eye(num_features))
        weight = torch.cholesky_solve(moment, factor).T  # [O, F]
        found.append((weight, y_mean - weight @ x_mean))
    return found


@torch.no_grad()
def write_linear(head: PointerHead, weight: torch.Tensor, bias: torch.Tensor,
                 option_embeds: torch.Tensor, option_mask: torch.Tensor,
                 queries: torch.Tensor, labels: torch.Tensor) -> None:
    """Set `head` (query_scale already fitted) so that its argmax is that of weight [O, F] @
    standardised query + bias [O], for these options. queries [N, F] (raw) and labels [N]:
    held-out rows (validation), of which the first SCALE_ROWS set the logits' size, the
    temperature of their least cross-entropy. A ridge map's own logits are far too flat (the
    cross-entropy's gradient would first undo the ranking to sharpen them); the training rows'
    best temperature is far too sharp (they are fitted: every step's loss is then a few
    huge outliers)."""
    queries, labels = queries[:SCALE_ROWS], labels[:SCALE_ROWS]
    d_head, num_options = head.pointer_q.out_features, weight.shape[0]
    if d_head <= num_options:
        raise ValueError(f"a head of d_head {d_head} cannot hold a linear map over "
                         f"{num_options} options: d_head must exceed the number of options")
    centre = torch.eye(d_head) - 1.0 / d_head
    head.key_proj.weight.copy_(centre @ head.key_proj.weight)
    head.key_proj.bias.copy_(centre @ head.key_proj.bias)
    head.pointer_q.weight.copy_(torch.eye(d_head))
    head.pointer_q.bias.zero_()
    head.query_norm.weight.fill_(1.0)
    head.query_norm.bias.zero_()
    head.cross_attn.out_proj.weight.zero_()
    head.cross_attn.out_proj.bias.zero_()
    target = head.query_scale(queries) @ weight.T + bias  # [N, O]
    sharpen = min(TEMPERATURES, key=lambda t: float(F.cross_entropy(t * target, labels)))
    target = sharpen * target
    for _ in range(2):  # the second pass fixes the scale found by the first
        keys = head.encode_options(option_embeds, option_mask).keys  # [O, d_head]
        inverse = torch.linalg.pinv(keys * head.scale)  # [d_head, O]
        # LN divides the scale out of the query: set it to a fresh layer's, so that the
        # optimiser's steps (about lr per weight) are as small against it as they are there
        proj = inverse @ weight  # [d_head, F]
        size = weight.shape[1] ** -0.5 / proj.pow(2).mean().sqrt().clamp(min=1e-12)
        head.query_proj.weight.copy_(proj * size)
        head.query_proj.bias.copy_(inverse @ bias * size)
        options = head.encode_options(option_embeds, option_mask)
        got = head(queries, options)  # [N, O]
        ratio = float(target.abs().median() / got.abs().median().clamp(min=1e-12))
        head.key_proj.weight.mul_(ratio)
        head.key_proj.bias.mul_(ratio)


@torch.no_grad()
def choose_ridge(train: PointerTask, val: PointerTask, l2s: tuple[float, ...],
                 refine_iters: int = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], str]:
    """The ridge map of the training rows (queries standardised as the head does) with the l2
    of the best validation accuracy (ties: the first); with refine_iters, then refined by that
    many L-BFGS iterations of logistic regression in the span of its rows (l2 1/N, the probe's
    C = 1) and kept if validation does not prefer the ridge map; and what the card records."""
    scale = FeatureScale(train.queries.shape[1])
    scale.fit(train.queries)
    num_options = train.option_embeds.shape[0]
    fits = fit_ridge(scale(train.queries), train.labels, num_options, l2s)
    val_x = scale(val.queries)
    accs = [float(((val_x @ w.T + b).argmax(-1) == val.labels).float().mean()) for w, b in fits]
    best = max(range(len(l2s)), key=lambda i: (accs[i], -i))
    refined = ""
    if refine_iters:
        found = _refine(scale(train.queries), train.labels, fits[best], val_x, val.labels,
                        refine_iters)
        refined = (f"; refined by {refine_iters} L-BFGS iterations of logistic regression in "
                   f"the span of its rows: "
                   f"validation {100 * found[1]:.1f}%, "
                   + ("kept" if found[1] >= accs[best] else "not kept"))
        if found[1] >= accs[best]:
            fits[best] = found[0]
    text = ("the head started as a ridge map of the training rows written into it (l2 "
            "candidates, the map's validation accuracy: "
            + ", ".join(f"{l2:g} {100 * a:.1f}%" for l2, a in zip(l2s, accs, strict=True))
            + f"; chosen {l2s[best]:g}{refined}), its untrained state checked as step 0; ")
    return fits[best], text


def _refine(x: torch.Tensor, labels: torch.Tensor, start: tuple[torch.Tensor, torch.Tensor],
            val_x: torch.Tensor, val_labels: torch.Tensor, iters: int):
    """Logistic regression in the span of the ridge map's rows (an orthonormal basis: the
    features shrink from F to O, so each iteration costs O/F of a full one), from the ridge map
    at the temperature validation prefers; returns ((weight, bias), validation accuracy)."""
    basis, _ = torch.linalg.qr(start[0].T)  # [F, O]
    x_r, val_r = x @ basis, val_x @ basis  # [N, O], [N_val, O]
    logits = val_x @ start[0].T + start[1]
    sharpen = min(TEMPERATURES, key=lambda t: float(F.cross_entropy(t * logits, val_labels)))
    with torch.enable_grad():
        weight, bias = fit_linear(x_r, labels, start[0].shape[0], 1.0 / len(x), iters,
                                  (sharpen * start[0] @ basis, sharpen * start[1]))
    acc = float(((val_r @ weight.T + bias).argmax(-1) == val_labels).float().mean())
    return (weight @ basis.T, bias), acc
