"""Multi-agent: each agent's replica count follows its share of the traffic."""

import numpy as np
from sim_configs import small_config

from sim.engine.cluster import replica_groups
from sim.simulate import simulate
from sim.workload.generate import single_turn_workload


def test_replicas_are_dealt_by_traffic_share_at_least_one_each():
    # One each, then each replica to the most loaded per replica: 70/5 = 14 beats 10.
    assert replica_groups(8, 4, [70, 10, 10, 10]) == [[0, 1, 2, 3, 4], [5], [6], [7]]
    assert replica_groups(8, 4, [4, 2, 1, 1]) == [[0, 1, 2, 3], [4, 5], [6], [7]]
    assert replica_groups(4, 4, [97, 1, 1, 1]) == [[0], [1], [2], [3]]
    assert replica_groups(6, 4) == [[0, 4], [1, 5], [2], [3]]  # no shares: round robin


def test_a_busy_agent_gets_more_replicas_in_the_simulation():
    rng = np.random.default_rng(0)
    domains = rng.choice(4, size=120, p=[0.7, 0.1, 0.1, 0.1])
    workload = single_turn_workload(np.sort(rng.uniform(0, 2, 120)), np.full(120, 64),
                                    np.full(120, 16), domains)
    result = simulate(small_config("multi_agent", num_replicas=8, router="round_robin"),
                      workload)
    turns = result.turns
    replicas = turns.groupby("domain")["replica"].apply(set)
    assert replicas[0] == {0, 1, 2, 3}
    assert len(replicas[1]) + len(replicas[2]) + len(replicas[3]) == 4
    assert all(replicas[d].isdisjoint(replicas[0]) for d in (1, 2, 3))
