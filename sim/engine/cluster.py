"""Replicas behind a request router, and where a hop runs under prefill/decode disaggregation.

Policies: round robin; least outstanding requests; affinity (the replica that served the
conversation last, which holds its prefix, unless it is much busier than the least loaded one;
then a replica whose GPU slots already hold the adapter). Multi-agent deployments give each
agent (domain) its own group of replicas, sized by the agent's share of the traffic; a turn
picks within its agent's group.
"""

from __future__ import annotations

from sim.engine.replica import Replica

AFFINITY_MAX_EXTRA_OUTSTANDING = 8
"""Affinity gives up the conversation's replica when it has this many more requests queued."""


class Router:
    """Chooses a replica for a turn from a group of candidates."""

    def __init__(self, policy: str, replicas: list[Replica], groups: list[list[int]]):
        self.policy, self.replicas, self.groups = policy, replicas, groups
        self._next = [0] * len(groups)

    def choose(self, group: int, adapter: int, last_replica: int | None) -> Replica:
        """The replica for a turn of `group`'s candidates."""
        candidates = self.groups[group % len(self.groups)]
        if len(candidates) == 1:
            return self.replicas[candidates[0]]
        if self.policy == "round_robin":
            index = self._next[group] % len(candidates)
            self._next[group] += 1
            return self.replicas[candidates[index]]
        loads = {i: self.replicas[i].engine.num_outstanding for i in candidates}
        least = min(candidates, key=lambda i: (loads[i], i))
        if self.policy == "affinity":
            limit = loads[least] + AFFINITY_MAX_EXTRA_OUTSTANDING
            if last_replica in loads and loads[last_replica] <= limit:
                return self.replicas[last_replica]
            holders = [i for i in candidates
                       if self.replicas[i].engine.slots.is_resident(adapter) and loads[i] <= limit]
            if holders:
                return self.replicas[min(holders, key=lambda i: (loads[i], i))]
        return self.replicas[least]


def replica_groups(num_replicas: int, num_groups: int,
                   weights: list[float] | None = None) -> list[list[int]]:
    """Replica indices per group: dealt round robin (group g gets g, g + n, ...), or, given
    each group's share of the traffic, in proportion to it: one each, then every further
    replica to the group with the most traffic per replica (ties to the lower index), which
    makes the busiest replica's share the least any dealing can."""
    if weights is None or num_replicas <= num_groups or not sum(weights):
        return [list(range(g, num_replicas, num_groups)) for g in range(num_groups)]
    counts = [1] * num_groups
    for _ in range(num_replicas - num_groups):
        g = max(range(num_groups), key=lambda i: (weights[i] / counts[i], -i))
        counts[g] += 1
    starts = [sum(counts[:g]) for g in range(num_groups)]
    return [list(range(starts[g], starts[g] + counts[g])) for g in range(num_groups)]
