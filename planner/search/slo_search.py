"""Capacity search under SLOs: pure, driven by an `evaluate` function it is given.

The field's standard method: per candidate replica (GPU kind, TP, engine limits) find the
largest request rate one replica serves within the SLOs by bisection on the rate, scale out to
the target rate, then verify the scaled-out deployment (adding replicas while it misses). The
cheapest verified deployment wins; every trial is kept for the runner-ups and the Pareto front.
`search` does no I/O and knows nothing of the simulator, so a fake `evaluate` tests it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from planner.search.slo import Slo, slo_violations


@dataclass(frozen=True)
class Deployment:
    """One configuration to try: a replica's shape and how many replicas."""

    gpu: str
    tensor_parallel_size: int
    num_replicas: int = 1
    """Serving replicas in all (at least `num_model_copies`)."""
    max_num_seqs: int = 256
    max_loras: int = 4
    num_model_copies: int = 1
    """Distinct models served, one replica each at least (one per agent under multi-agent)."""
    traffic_shares: tuple[float, ...] = ()
    """Each model's share of the traffic (empty: equal shares): replicas beyond one per model
    are dealt in proportion to it, as the simulator deals them."""
    num_router_replicas: int = 0
    """Replicas of a dedicated router pool, fixed while the serving replicas scale out."""

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole deployment."""
        return self.tensor_parallel_size * (self.num_replicas + self.num_router_replicas)

    @property
    def smallest(self) -> Deployment:
        """This shape with the fewest replicas it can have: one per model."""
        return replace(self, num_replicas=self.num_model_copies)

    @property
    def shares(self) -> np.ndarray:
        """Each model's share of the traffic, summing to 1 (equal when none are given)."""
        n = self.num_model_copies
        shares = np.asarray(self.traffic_shares or (1.0,) * n, dtype=float)
        return shares / shares.sum() if shares.sum() > 0 else np.full(n, 1.0 / n)


def replicas_for_rate(d: Deployment, rate_per_s: float, capacity_per_s: float) -> int:
    """Replicas the rate needs when the smallest deployment of `d` serves `capacity_per_s`.

    With one model that is ceil(rate / capacity) replicas. With several (multi-agent), the
    smallest deployment saturates at its busiest model's single replica, so one replica serves
    capacity x the largest share of the traffic; each model then needs its own share of the
    rate over that, at least one replica."""
    shares = d.shares
    per_replica = capacity_per_s * shares.max()
    needed = np.ceil(rate_per_s * shares / per_replica)
    return int(np.maximum(needed, 1).sum())


_DESCENT_FACTOR = 16.0
_MAX_DESCENTS = 4
"""A replica that misses the SLOs at 16**-4 of its bound is declared unable to meet them."""

Metrics = Mapping[str, float]
Evaluate = Callable[[Deployment, float, int], Metrics]
"""evaluate(deployment, request rate per second, seed) -> metric name -> value."""
SloValues = Callable[[Deployment, Metrics, Metrics, Metrics], Metrics]
"""slo_values(deployment, seed mean, seed min, seed max) -> the values the SLOs are checked on
(`planner.predict.intervals.slo_values` at a confidence: each latency's upper end)."""


@dataclass(frozen=True)
class SearchSpace:
    """What the search may try and what it must reach."""

    candidates: tuple[Deployment, ...]
    target_rate_per_s: float
    price_per_gpu_hour: Mapping[str, float]
    max_num_replicas: int = 64
    seeds: tuple[int, ...] = (0, 1, 2)
    rate_upper_bounds: Mapping[Deployment, float] = field(default_factory=dict)
    """Analytical bound on one replica's rate, by candidate: bisection starts below it."""
    rate_tolerance: float = 0.05
    """Stop bisecting when the bracket's high/low ratio is within 1 + this."""
    max_bisection_steps: int = 12
    max_extra_replicas: int = 4
    """Replicas added beyond the estimate when the scaled-out deployment still misses."""
    exhaustive: bool = False
    """True searches every candidate; False skips a candidate whose cheapest possible
    deployment (the fewest replicas its rate bound allows) costs more than a verified one, and
    stops a point's seeds once one seed alone proves the seed mean misses. Either way the
    chosen deployment is the same; exhaustive also gives every candidate's capacity and
    runner-up."""
    slo_values: SloValues | None = None
    """What the SLOs are checked on (None: the seed mean, the point estimate). It must never
    return a latency below the seed mean: the one-seed early stop relies on it."""


@dataclass(frozen=True)
class Trial:
    """One evaluated point: metrics averaged over seeds, with their min and max."""

    deployment: Deployment
    rate_per_s: float
    mean: Metrics
    low: Metrics
    high: Metrics
    violations: tuple[str, ...]
    cost_per_hour_usd: float
    num_seeds: int = 0
    """Seeds simulated; fewer than the space's when one seed already proved a miss."""

    @property
    def meets_slo(self) -> bool:
        """True when the seed-averaged metrics satisfy every SLO."""
        return not self.violations


@dataclass(frozen=True)
class Plan:
    """The search's answer: the cheapest deployment meeting the SLOs, or why there is none."""

    is_feasible: bool
    reason: str
    chosen: Trial | None
    per_replica_rate_per_s: float
    """Largest verified request rate one replica carries (with several models: the busiest
    model's replica in the smallest deployment)."""
    runner_ups: tuple[Trial, ...]
    pareto_front: tuple[Trial, ...]
    trials: tuple[Trial, ...]
    capacities: Mapping[Deployment, float]
    pruned: tuple[str, ...] = ()
    """Candidates not searched because they cannot beat the chosen cost, and why."""
    point_estimate_num_gpus: int | None = None
    """GPUs the same search chooses at the point estimate, when this plan was made at a
    confidence (None: it was not, or the point estimate has no plan)."""

    @property
    def cost_per_million_tokens_usd(self) -> float:
        """Hourly cost over tokens served per hour, per million (NaN without a throughput)."""
        if self.chosen is None:
            return math.nan
        # Tokens the users receive: MoL's route labels and summaries are decoded too, but are
        # cost, not output (falls back to every output token when replies are not reported).
        mean = self.chosen.mean
        tokens_per_s = mean.get("reply_tokens_per_s", mean.get("output_tokens_per_s", math.nan))
        return self.chosen.cost_per_hour_usd / (tokens_per_s * 3600) * 1e6


class _Runner:
    """Evaluates points over every seed, once per (deployment, rate), and remembers each trial."""

    def __init__(self, space: SearchSpace, evaluate: Evaluate, slo: Slo):
        self.space, self.evaluate, self.slo = space, evaluate, slo
        self.trials: list[Trial] = []
        self._done: dict[tuple[Deployment, float], Trial] = {}

    def trial(self, deployment: Deployment, rate: float) -> Trial:
        if (deployment, rate) in self._done:  # e.g. a scale-out to one replica at a probed rate
            return self._done[(deployment, rate)]
        runs = []
        for seed in self.space.seeds:
            runs.append(self.evaluate(deployment, rate, seed))
            if not self.space.exhaustive and self._seed_mean_must_miss(runs[-1]):
                break
        keys = sorted(set.intersection(*(set(r) for r in runs)))
        values = {k: np.array([r[k] for r in runs], dtype=float) for k in keys}
        mean = {k: float(v.mean()) for k, v in values.items()}
        price = self.space.price_per_gpu_hour[deployment.gpu]
        low = {k: float(v.min()) for k, v in values.items()}
        high = {k: float(v.max()) for k, v in values.items()}
        checked = (self.space.slo_values(deployment, mean, low, high)
                   if self.space.slo_values else mean)
        trial = Trial(deployment, rate, mean, low, high,
                      tuple(slo_violations(self.slo, checked)), price * deployment.num_gpus,
                      num_seeds=len(runs))
        self.trials.append(trial)
        self._done[(deployment, rate)] = trial
        return trial

    def _seed_mean_must_miss(self, metrics: Metrics) -> bool:
        """One seed's latency above num_seeds x the limit: latencies are never negative, so the
        mean over all seeds exceeds the limit whatever the other seeds give."""
        n = len(self.space.seeds)
        return any(limit is not None and metrics.get(name, 0.0) > n * limit
                   for name, limit in self.slo.model_dump().items())


def replica_capacity(runner: _Runner, candidate: Deployment) -> float:
    """Largest verified rate one replica serves within the SLOs (0.0 if even a trickle fails).

    The fast search bisects exactly as the exhaustive one does: the plan's replica count is
    ceil(target / capacity), so another capacity within the tolerance could change the plan."""
    space = runner.space
    one = candidate.smallest
    high = space.rate_upper_bounds.get(candidate, space.target_rate_per_s)
    if runner.trial(one, high).meets_slo:
        return high  # the bound (or the whole target) fits: no need to look higher
    low = high
    for _ in range(_MAX_DESCENTS):  # step down until a rate passes, to bracket the capacity
        high, low = low, low / _DESCENT_FACTOR
        if runner.trial(one, low).meets_slo:
            break
    else:
        return 0.0
    for _ in range(space.max_bisection_steps):
        if high / low <= 1 + space.rate_tolerance:
            break
        mid = math.sqrt(low * high)  # bisect in log space: rates span orders of magnitude
        if runner.trial(one, mid).meets_slo:
            low = mid
        else:
            high = mid
    return low


def _scale_out(runner: _Runner, candidate: Deployment, capacity: float) -> Trial | None:
    """Smallest replica count verified at the target rate: from the capacity estimate up, one
    replica at a time; when the estimate itself verifies, down while fewer still verify.

    Replicas behind one router share the bursts that one replica alone must queue, so fewer
    than target / capacity can meet the SLOs. The count never goes below what the analytical
    bound allows, the floor `min_cost_per_hour` prunes by."""
    space = runner.space
    target = space.target_rate_per_s
    estimate = replicas_for_rate(candidate, target, capacity)
    last = min(space.max_num_replicas, estimate + space.max_extra_replicas)
    for num_replicas in range(estimate, last + 1):
        trial = runner.trial(replace(candidate, num_replicas=num_replicas), target)
        if trial.meets_slo:
            break
    else:
        return None
    bound = space.rate_upper_bounds.get(candidate, target)
    fewest = max(candidate.num_model_copies, replicas_for_rate(candidate, target, bound))
    while num_replicas == estimate and trial.deployment.num_replicas > fewest:
        fewer = runner.trial(replace(candidate, num_replicas=trial.deployment.num_replicas - 1),
                             target)
        if not fewer.meets_slo:
            break
        trial = fewer
    return trial


def pareto_front(trials: list[Trial], latency_key: str = "e2e_p99_s") -> tuple[Trial, ...]:
    """Trials no other trial beats on both cost per hour and p99 latency (pass trials run at the
    same rate: cost and latency only compare under the same load)."""
    points = [t for t in trials if latency_key in t.mean]
    front = [
        t for t in points
        if not any(o.cost_per_hour_usd <= t.cost_per_hour_usd
                   and o.mean[latency_key] <= t.mean[latency_key]
                   and (o.cost_per_hour_usd, o.mean[latency_key])
                   != (t.cost_per_hour_usd, t.mean[latency_key]) for o in points)
    ]
    return tuple(sorted(front, key=lambda t: t.cost_per_hour_usd))


def min_cost_per_hour(space: SearchSpace, candidate: Deployment) -> float:
    """The least a candidate can cost: the replicas its rate bound forces, at its GPU price
    (the capacity never exceeds the bound, and scale-out never goes below the estimate)."""
    bound = space.rate_upper_bounds.get(candidate, space.target_rate_per_s)
    replicas = replicas_for_rate(candidate, space.target_rate_per_s, bound)
    one = replace(candidate, num_replicas=min(replicas, space.max_num_replicas))
    return space.price_per_gpu_hour[candidate.gpu] * one.num_gpus


def search(space: SearchSpace, evaluate: Evaluate, slo: Slo) -> Plan:
    """The cheapest deployment that serves `space.target_rate_per_s` within `slo`."""
    runner = _Runner(space, evaluate, slo)
    capacities: dict[Deployment, float] = {}
    verified: list[Trial] = []
    reasons: list[str] = []
    pruned: list[str] = []
    candidates = space.candidates
    if not space.exhaustive:  # cheapest first, so that a verified plan prunes the rest
        candidates = tuple(sorted(candidates, key=lambda c: min_cost_per_hour(space, c)))
    for candidate in candidates:
        best = min((t.cost_per_hour_usd for t in verified), default=math.inf)
        floor = min_cost_per_hour(space, candidate)
        if not space.exhaustive and floor > best:  # ties still run: latency breaks them
            pruned.append(f"{_describe(candidate)}: costs at least {floor:.4g} $/h, above the "
                          f"verified {best:.4g} $/h")
            continue
        capacity = replica_capacity(runner, candidate)
        capacities[candidate.smallest] = capacity
        if capacity == 0.0:
            reasons.append(f"{_describe(candidate)}: misses the SLOs even at a trickle of load")
            continue
        trial = _scale_out(runner, candidate, capacity)
        if trial is None:
            reasons.append(f"{_describe(candidate)}: needs more than "
                           f"{space.max_num_replicas} replicas or never verifies")
        else:
            verified.append(trial)
    # The last tie-break: the order the candidates were given in.
    order = {c.smallest: i for i, c in enumerate(space.candidates)}
    ranked = sorted(verified, key=lambda t: (t.cost_per_hour_usd, t.mean.get("e2e_p99_s", 0.0),
                                             order[t.deployment.smallest]))
    at_target = [t for t in runner.trials if t.rate_per_s == space.target_rate_per_s]
    front = pareto_front(at_target)
    if not ranked:
        return Plan(False, "no deployment meets the SLOs: " + "; ".join(reasons), None, 0.0,
                    (), front, tuple(runner.trials), capacities, tuple(pruned))
    best = ranked[0]
    base = best.deployment.smallest
    # What one replica serves: the smallest deployment's capacity as its busiest model sees it.
    per_replica = capacities[base] * float(base.shares.max())
    return Plan(True, "cheapest verified deployment", best, per_replica,
                tuple(ranked[1:]), front, tuple(runner.trials), capacities, tuple(pruned))


def _describe(d: Deployment) -> str:
    return (f"{d.gpu} TP={d.tensor_parallel_size} max_num_seqs={d.max_num_seqs} "
            f"max_loras={d.max_loras}")
