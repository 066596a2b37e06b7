"""What one engine step computes: the scheduler (`sim.engine.scheduler`) builds it, the step pricer
(`sim.engine.step_pricer`) prices it, `Engine.commit` applies it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.engine.decode_group import DecodeGroup
from sim.engine.sequence import Sequence


@dataclass(slots=True)
class StepPlan:
    """What one engine step computes."""

    prefills: list[tuple[Sequence, int]] = field(default_factory=list)
    """(sequence, tokens computed) for prompt or recompute chunks."""
    decodes: list[Sequence] = field(default_factory=list)
    """Sequences decoding one step."""
    replays: list[Sequence] = field(default_factory=list)
    """Sequences whose bounded replay runs in this step."""
    reencodes: list[Sequence] = field(default_factory=list)
    """Sequences whose encoder window is re-encoded in this step (before their new tokens)."""
    num_routing_decisions: int = 0
    adapter_load_s: float = 0.0
    num_admitted: int = 0
    num_preempted: int = 0
    group: DecodeGroup | None = None
    num_group_decodes: int = 0
    """The first `num_group_decodes` decodes are the members of `group`, whose fields lag
    (`sim.engine.decode_group`): read their contexts from `decode_contexts`."""
    decode_contexts: np.ndarray | None = None
    """Context tokens of each decode, when the plan has group decodes."""

    @property
    def is_empty(self) -> bool:
        """Nothing to compute."""
        return not (self.prefills or self.decodes)

    @property
    def is_pure_decode(self) -> bool:
        """Only decode tokens and nothing that changes the batch: repeatable until an event."""
        return bool(self.decodes) and not (
            self.prefills or self.replays or self.num_routing_decisions or self.adapter_load_s
            or self.num_admitted or self.num_preempted)
