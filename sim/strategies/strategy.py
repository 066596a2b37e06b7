"""What every serving strategy answers (the registry is `sim.strategies.registry`).

A strategy object is stateless: the simulator asks it, passing the `StrategySpec` numbers, what
a turn's hops are (a routing pass, the answer's extra fields, a summary), how its adapters are
priced and laid out in KV, how turns are spread over replicas, and what a decision costs. The
simulator never compares kind strings; adding a strategy is one module with a subclass and one
line in `sim.strategies.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sim.cost.coeffs import CostCoeffs
from sim.cost.layer_costs import LayerCosts
from sim.hardware.specs import ModelArch
from sim.strategies.placement import KvLayout, kv_layout_of_placements


@dataclass(frozen=True)
class TurnPricing:
    """What the analytical cost of one turn's pieces is priced with."""

    coeffs: CostCoeffs
    costs: LayerCosts
    max_chunk_tokens: int
    """The engine's prefill chunk (max_num_batched_tokens)."""
    num_query_tokens: int
    """The user turn's tokens."""
    routing_last_layer: int
    """Layers a routing pass runs (through the routing layer; all of a decoder-only model)."""


class Strategy:
    """The base-model behaviour; every method is a hook a strategy may override."""

    kind: ClassVar[str] = ""
    is_routing: ClassVar[bool] = False
    """A router decides each turn's adapter (unless the client names it)."""
    is_decode_adapted: ClassVar[bool] = True
    """Decode tokens run through the adapter (False: prefill-only adapters, PreFT)."""
    uses_adapters: ClassVar[bool] = True
    """Adapters are priced and loaded (False: base model, one full model per agent)."""
    is_model_per_domain: ClassVar[bool] = False
    """Each domain is served by a model of its own, on replicas of its own (multi-agent)."""
    reprefill_name: ClassVar[str] = "re-prefill"
    """What a switch that prefills the context again under the target is called."""
    is_reference: ClassVar[bool] = False
    """The no-adapter reference the others are compared against (the base model): the
    dashboard's best adapter strategy is never this one."""
    needs_ced_model: ClassVar[bool] = False
    """The router reads a causal encoder-decoder's encoder state, so a decoder-only model is
    rejected. Whether KV is shared is decided by where the adapters sit
    (`sim.strategies.placement`), not by this flag."""
    is_verifiable: ClassVar[bool] = False
    """vLLM serves this strategy as is, so its plan can be run on the engine (`molcap verify`)."""

    def adapter_pricing_kind(self, spec) -> str:
        """How a step prices this strategy's adapters: "lora" (vLLM's LoRA slots, padded to
        max_lora_rank), "direft" (an edit at its adapter's own rank) or "none"."""
        return "lora" if self.uses_adapters else "none"

    def engine_adapter_kind(self, spec) -> str:
        """The adapter kind the engine names this strategy's requests by ("base", "lora",
        "lora_p", "direft_p"); meaningful where `is_verifiable`."""
        return "lora" if self.uses_adapters else "base"

    def kv_layout(self, arch: ModelArch, placements: list[list[tuple[int, str]]]) -> KvLayout:
        """Where KV lives given each adapter's (layer, module) placements."""
        return kv_layout_of_placements(arch, placements)

    def num_replica_groups(self, spec) -> int:
        """Groups of replicas turns are routed within (one per domain's model, or one)."""
        return spec.num_domains if self.is_model_per_domain else 1

    def route_hop(self, spec, num_prompt_tokens: int, routing_last_layer: int) -> dict | None:
        """Fields of the routing pass a routed turn runs before its answer, or None. The caller
        adds the KV namespace, the stream fields and the window replay (a routing pass's local
        KV is rolled back after the decision)."""
        return None

    def answer_fields(self, spec, *, is_routed: bool, is_switch: bool,
                      num_context_tokens: int, num_user_tokens: int) -> dict:
        """Fields this strategy changes on a turn's answer hop."""
        return {}

    def summary_tokens(self, spec, adapter: int) -> int:
        """Tokens of a summary hop after an answer by `adapter` (0: none)."""
        return 0

    def head_rides_answer(self, spec) -> bool:
        """The routing decision is made inside the answer's prefill step (no pass of its own)."""
        return False

    def extra_sequence_tokens(self, spec) -> int:
        """Tokens a routing or summary hop adds to the longest sequence of a turn."""
        return 0

    def decision_s(self, spec, pricing: TurnPricing, num_context_tokens: int) -> float:
        """Seconds one routing decision takes by the mechanism, analytically (0: no router).
        `spec` is the strategy's parameters (the scenario's or the simulator's: same names)."""
        return 0.0

    def switch_s(self, spec, pricing: TurnPricing, num_context_tokens: int,
                 kv_switch: tuple[float, str]) -> tuple[float, str]:
        """Seconds one domain switch adds to a turn, and the mechanism's name, analytically;
        `kv_switch` is what rebuilding the KV the layout implies costs (bounded replay or a
        re-prefill under the target)."""
        return kv_switch

    def decision_kv_tokens(self, spec, num_query_tokens: int) -> int:
        """Tokens of KV a decision holds for a while beside the conversation's (0: none)."""
        return 0
