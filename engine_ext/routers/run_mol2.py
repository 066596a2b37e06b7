"""MoL2 on a backbone (SmolLM2's layer k, the CED model's H19): heads per setting and seed,
regimes, timing, card rows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine_ext.routers.backbones import Backbone
from engine_ext.routers.datasets import RoutingSet
from engine_ext.routers.measure import measure, setting_result
from engine_ext.routers.mol2 import (
    HeadTraining,
    PointerTask,
    TrainedHead,
    accuracy,
    create_head,
    fit_head,
    num_params,
    train_pointer,
)
from engine_ext.routers.mol2_init import choose_ridge, write_linear
from engine_ext.routing import PointerHead, mean_pool
from sim.strategies.router_card import DecisionWork, SettingResult

STEPS = 100
"""Training steps of the regimes (per stage), the shuffled-label control and, by default, a
setting's heads."""
BATCH = 64
"""Pooled queries per training step."""
HEAD_SHAPE = {"d_head": 64, "num_heads": 4, "option_depth": 2}
"""The vLLM plugin's RouterConfig defaults, so a card's head loads there as is."""


def mol2_tasks(backbone: Backbone, routing_set: RoutingSet) -> dict[str, PointerTask]:
    """Pooled routing-layer queries (disk-cached) and option embeddings of every split."""
    embeds, mask = backbone.option_embeddings(routing_set.descriptions)
    return {name: PointerTask(backbone.pooled(split.texts), torch.tensor(split.labels),
                              embeds, mask)
            for name in ("train", "val", "test")
            for split in [routing_set.split(name)]}


def train_seeds(d_model: int, tasks: list[PointerTask], seeds: list[int], steps: int = STEPS,
                d_query: int | None = None) -> tuple[list[PointerHead], list[float]]:
    """One head per seed on `tasks`; returns heads and training seconds."""
    heads, seconds = [], []
    for seed in seeds:
        start = time.perf_counter()
        head = create_head(d_model, seed, d_query, **HEAD_SHAPE)
        losses = train_pointer(head, tasks, steps=steps, seed=seed, batch=BATCH)
        curve = [round(sum(losses[i : i + 25]) / len(losses[i : i + 25]), 3)
                 for i in range(0, len(losses), 25)]
        print(f"  seed {seed}: training loss per 25 steps {curve}", flush=True)
        seconds.append(time.perf_counter() - start)
        heads.append(head)
    return heads, seconds


def shuffled(task: PointerTask, seed: int) -> PointerTask:
    """The control: the same queries with their labels permuted (seeded)."""
    perm = torch.randperm(len(task.labels), generator=torch.Generator().manual_seed(seed))
    return PointerTask(task.queries, task.labels[perm], task.option_embeds, task.option_mask)


def save_head(head: PointerHead, path: Path) -> Path:
    """safetensors state dict in float16 (the plugin loads it into a float32 head)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()},
              str(path))
    return path


def choose_steps(d_model: int, tasks: dict[str, PointerTask], grid: tuple[int, ...],
                 seed: int = 0, d_query: int | None = None) -> tuple[int, dict[int, float]]:
    """The length in `grid` with the best validation accuracy of seed 0's head (ties: the
    shorter); the test split is never looked at."""
    found = {}
    for steps in grid:
        [head], _ = train_seeds(d_model, [tasks["train"]], [seed], steps, d_query)
        found[steps] = accuracy(head, tasks["val"])
    return max(found, key=lambda s: (found[s], -s)), found


@torch.no_grad()
def _feature_timers(backbone, head: PointerHead, routing_set: RoutingSet, task: PointerTask):
    """In the engine the spec's layer states come with the request's prefill: the decision
    pools each (mean, max over the turn) side by side and runs the head; out of the engine it
    first runs the prefill up to the spec's deepest layer."""
    from engine_ext.routers.layer_cache import all_layer_states, query_from_states

    spec, engine = backbone.spec, backbone.engine
    ids = [backbone.tokenize(t) for t in routing_set.test.texts[:30]]
    states = [all_layer_states(engine, torch.tensor([i]), spec.route_layer + 1) for i in ids]
    options = head.encode_options(task.option_embeds, task.option_mask)

    def decide(found: list[torch.Tensor]) -> None:
        head(query_from_states(found, spec), options).argmax(-1)

    def in_engine(i: int, batch: int) -> float:
        found = [h.expand(batch, -1, -1) for h in states[i]]
        start = time.perf_counter()
        decide(found)
        return time.perf_counter() - start

    def standalone(i: int, batch: int) -> float:
        start = time.perf_counter()
        decide(all_layer_states(engine, torch.tensor([ids[i]] * batch), spec.route_layer + 1))
        return time.perf_counter() - start

    return in_engine, standalone, len(ids)


@torch.no_grad()
def _timers(backbone: Backbone, head: PointerHead, routing_set: RoutingSet,
            task: PointerTask):
    if getattr(backbone, "spec", None) is not None:
        return _feature_timers(backbone, head, routing_set, task)
    texts = routing_set.test.texts[:30]
    ids = [backbone.tokenize(t) for t in texts]
    states = [backbone.state_fn(torch.tensor([i])) for i in ids]  # each [1, T, D]
    options = head.encode_options(task.option_embeds, task.option_mask)

    def in_engine(i: int, batch: int) -> float:
        start = time.perf_counter()
        head(mean_pool(states[i].expand(batch, -1, -1)), options).argmax(-1)
        return time.perf_counter() - start

    def standalone(i: int, batch: int) -> float:
        start = time.perf_counter()
        head(mean_pool(backbone.state_fn(torch.tensor([ids[i]] * batch))), options).argmax(-1)
        return time.perf_counter() - start

    return in_engine, standalone, len(texts)


@dataclass(frozen=True)
class HeadSearch:
    """What seed 0's validation accuracy chooses among (every combination), and the early
    stopping every run of the setting then uses."""

    max_steps: int
    eval_every: int
    lrs: tuple[float, ...] = (2e-3,)
    weight_decays: tuple[float, ...] = (0.01,)
    query_dropouts: tuple[float, ...] = (0.0,)
    patience: int = 4
    batch: int = BATCH
    start_l2s: tuple[float, ...] = ()
    """With values: every head starts as the ridge map of the training rows whose l2 (among
    these) validation prefers (mol2_init), and its step 0 competes in the early stopping."""
    start_lbfgs: int = 0
    """L-BFGS iterations of logistic regression that refine the ridge start (0: none)."""
    d_head: int | None = None
    """The head's width (None: HEAD_SHAPE's); a start from a map needs more than the options."""

    @property
    def shape(self) -> dict[str, int]:
        """The head's shape: HEAD_SHAPE, with d_head when given."""
        return HEAD_SHAPE if self.d_head is None else {**HEAD_SHAPE, "d_head": self.d_head}

    def candidates(self) -> list[HeadTraining]:
        """Every combination, in the order given (ties go to the first)."""
        return [HeadTraining(self.max_steps, lr, wd, p, self.eval_every, self.patience,
                             self.batch)
                for lr in self.lrs for wd in self.weight_decays for p in self.query_dropouts]


def _curve_text(curve) -> str:
    return " ".join(f"{step}:{100 * acc:.1f}" for step, acc in curve)


def search_heads(backbone, tasks: dict[str, PointerTask], seeds: list[int], search: HeadSearch
                 ) -> tuple[list[PointerHead], list[float], str]:
    """Choose the training on seed 0's validation accuracy, then train every seed with it
    (early-stopped on validation); returns heads, seconds per seed and what the card records."""
    d_query = getattr(backbone, "d_query", backbone.d_model)
    train = tasks["train"]
    start_s = time.perf_counter()
    start_map, start_text = (choose_ridge(train, tasks["val"], search.start_l2s,
                                          search.start_lbfgs)
                             if search.start_l2s else (None, ""))
    start_s = time.perf_counter() - start_s  # every seed's head needs the map: counted in each

    def run(how: HeadTraining, seed: int) -> tuple[TrainedHead, float]:
        start = time.perf_counter()
        head = create_head(backbone.d_model, seed, d_query, **search.shape)
        if start_map is not None:
            head.query_scale.fit(train.queries)
            write_linear(head, *start_map, train.option_embeds, train.option_mask,
                         tasks["val"].queries, tasks["val"].labels)
        done = fit_head(head, train, tasks["val"], how, seed, from_map=start_map is not None)
        print(f"  seed {seed} {how.label}: validation {_curve_text(done.curve)}; kept step "
              f"{done.best_step}", flush=True)
        return done, time.perf_counter() - start + start_s

    tried = {how: run(how, seeds[0]) for how in search.candidates()}
    chosen = max(tried, key=lambda h: tried[h][0].best_val)  # max keeps the first of ties
    found = [tried[chosen] if seed == seeds[0] else run(chosen, seed) for seed in seeds]
    num_train = len(tasks["train"].labels)
    steps = [f.best_step for f, _ in found]
    text = (f"validation {len(tasks['val'].labels)} queries (never the test rows); "
            f"{start_text}candidates (seed 0's best validation accuracy, step): "
            + ", ".join(f"{h.label} {100 * t.best_val:.1f}% @{t.best_step}"
                        for h, (t, _) in tried.items())
            + f"; chosen {chosen.label}; at most {search.max_steps} steps of {search.batch}, "
            "one-cycle, "
            f"validation every {search.eval_every} steps, the best state kept, stop after "
            f"{search.patience} checks without a gain; steps kept per seed {steps} "
            f"({min(steps) * search.batch / num_train:.1f}-"
            f"{max(steps) * search.batch / num_train:.1f} "
            f"epochs); seed 0 validation curve (step:accuracy %) "
            f"{_curve_text(found[0][0].curve)}")
    return [f.head for f, _ in found], [sec for _, sec in found], text


def mol2_setting(backbone: Backbone, routing_set: RoutingSet, seeds: list[int],
                 heads_dir: Path, grid: tuple[int, ...] = (),
                 timed: SettingResult | None = None, *, is_timed: bool = True,
                 search: HeadSearch | None = None) -> tuple[SettingResult, PointerHead, str]:
    """Train one head per seed (with `search`: the training seed 0's validation accuracy
    chooses, early-stopped; else for `grid`'s length with the best validation accuracy, its one
    length, else STEPS), test each, time seed 0's (or keep the decision times of `timed`, a
    row measured before on the same head shape and options; or, with is_timed False, leave
    them pending); returns the row, seed 0's head and how the heads were chosen ('' without a
    search)."""
    tasks = mol2_tasks(backbone, routing_set)
    d_query = getattr(backbone, "d_query", backbone.d_model)
    chosen = ""
    if search is not None:
        heads, seconds, chosen = search_heads(backbone, tasks, seeds, search)
        val, steps, batch = "chosen", search.max_steps, search.batch
    else:
        steps, val = (choose_steps(backbone.d_model, tasks, grid, d_query=d_query)
                      if len(grid) > 1 else (grid[0] if grid else STEPS, {}))
        heads, seconds = train_seeds(backbone.d_model, [tasks["train"]], seeds, steps, d_query)
        batch = BATCH
    accs = [accuracy(h, tasks["test"]) for h in heads]
    print(f"mol2 {backbone.name} {routing_set.name}: {len(tasks['train'].labels)} training "
          f"queries, validation {val}, at most {steps} steps of {batch} "
          f"({steps * batch / len(tasks['train'].labels):.1f} epochs); test accuracy per seed "
          f"{[round(a, 4) for a in accs]}", flush=True)
    save_head(heads[0], heads_dir / f"mol2_{backbone.name}_{routing_set.name}.safetensors")
    if not is_timed:
        decision = alone = None
    elif timed is None:
        decision, alone = time_decisions(backbone, heads[0], routing_set, tasks["test"])
    else:
        decision, alone = timed.decision, timed.standalone
    work = DecisionWork(num_prefill_tokens=0, num_decode_tokens=0,
                        num_head_params=num_params(heads[0]),
                        num_tokens_per_option=float(tasks["test"].option_mask.sum(1)
                                                    .float().mean()))
    row = setting_result(routing_set, len(tasks["test"].labels), accs, seconds, decision, work)
    return row.model_copy(update={"standalone": alone}), heads[0], chosen


def time_decisions(backbone, head: PointerHead, routing_set: RoutingSet, task: PointerTask):
    """(in-engine decision, out-of-engine decision) times of `head` on the setting's first
    test turns; `task` gives the options (its queries are not used)."""
    in_engine, standalone, n = _timers(backbone, head, routing_set, task)
    states = (f"the {backbone.spec.label} states" if hasattr(backbone, "spec")
              else "mean-pool of the layer-k states")
    decision = measure(in_engine, n, f"{states} the request's prefill already computed "
                       "(pooled, side by side) + pointer head over cached option embeddings")
    alone = measure(standalone, n, "prefill of the user turn to layer k + pool + pointer head")
    return decision, alone


def load_head(backbone, path: Path) -> PointerHead:
    """A head saved by save_head, in float32, for this backbone's query width."""
    from safetensors.torch import load_file

    state = {k: v.float() for k, v in load_file(str(path)).items()}
    shape = {**HEAD_SHAPE, "d_head": state["query_proj.weight"].shape[0]}  # as it was trained
    head = create_head(backbone.d_model, 0, getattr(backbone, "d_query", backbone.d_model),
                       **shape)
    head.load_state_dict(state)
    return head.eval()


def retime_setting(backbone, routing_set: RoutingSet, row: SettingResult, head_file: Path
                   ) -> SettingResult:
    """A card row with the decision times of its saved seed-0 head measured now (no training:
    the accuracy and everything else stay as the row has them)."""
    if not head_file.exists():
        raise FileNotFoundError(f"{head_file}: no saved head of {routing_set.name} to time "
                                "(train the setting first, or pass --head-cache)")
    head = load_head(backbone, head_file)
    embeds, mask = backbone.option_embeddings(routing_set.descriptions)
    task = PointerTask(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long), embeds, mask)
    decision, alone = time_decisions(backbone, head, routing_set, task)
    return row.model_copy(update={"decision": decision, "standalone": alone})


def regimes(backbone: Backbone, generic: RoutingSet, domain: RoutingSet, seeds: list[int]
            ) -> dict[str, dict[str, list[float]]]:
    """Mixed (generic and domain batches in turn) vs staged (generic, then domain only)."""
    g, d = mol2_tasks(backbone, generic), mol2_tasks(backbone, domain)
    out: dict[str, dict[str, list[float]]] = {}
    for regime in ("generic_only", "mixed", "staged"):
        accs: dict[str, list[float]] = {generic.name: [], domain.name: []}
        for seed in seeds:
            head = create_head(backbone.d_model, seed, **HEAD_SHAPE)
            if regime == "mixed":
                train_pointer(head, [g["train"], d["train"]], steps=2 * STEPS, seed=seed)
            else:
                train_pointer(head, [g["train"]], steps=STEPS, seed=seed)
                if regime == "staged":
                    train_pointer(head, [d["train"]], steps=STEPS, seed=seed, fit_scale=False)
            accs[generic.name].append(accuracy(head, g["test"]))
            accs[domain.name].append(accuracy(head, d["test"]))
        print(f"mol2 regime {regime}: {accs}", flush=True)
        out[regime] = accs
    return out
