"""`mol2`: a pointer head over the routing layer's states picks the adapter: inside the engine
(the head rides the answer's prefill) or outside it (a prefill-only request exposes the states
first)."""

from __future__ import annotations

from sim.cost.cost_model import routing_decision_s
from sim.cost.phase_costs import prefill_s
from sim.strategies.strategy import Strategy, TurnPricing


class Mol2(Strategy):
    kind = "mol2"
    needs_ced_model = True
    is_routing = True

    def head_rides_answer(self, spec) -> bool:
        return spec.routing == "in_engine"

    def route_hop(self, spec, num_prompt_tokens: int, routing_last_layer: int) -> dict | None:
        if self.head_rides_answer(spec):
            return None
        # A second request, only to expose the routing layer's states.
        return dict(hop="routing_prefill", adapter=-1, num_prompt_tokens=num_prompt_tokens,
                    num_output_tokens=0, last_layer=routing_last_layer,
                    num_routing_decisions=1)

    def answer_fields(self, spec, *, is_routed: bool, is_switch: bool,
                      num_context_tokens: int, num_user_tokens: int) -> dict:
        if is_routed and self.head_rides_answer(spec):
            return dict(num_routing_decisions=1)  # the head rides the answer's prefill
        return {}

    def decision_s(self, spec, pricing: TurnPricing, num_context_tokens: int) -> float:
        c, p = pricing.coeffs, pricing.costs
        head = routing_decision_s(c, p, 1)
        if self.head_rides_answer(spec):
            return head  # the routing layer's states come from the normal prefill
        # A second request prefills the context only to expose the routing layer's states.
        return head + prefill_s(c, p, num_context_tokens, max_chunk_tokens=pricing.max_chunk_tokens,
                                is_adapted=False, last_layer=pricing.routing_last_layer)
