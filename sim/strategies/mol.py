"""`mol`: mixture of LoRAs routed by adapter L0, which prefills a route prompt and decodes a label
and reason; an answer by another adapter is followed by a summary hop under it."""

from __future__ import annotations

from sim.cost.phase_costs import decode_run_s, prefill_s
from sim.strategies.strategy import Strategy, TurnPricing


class MixtureOfLoras(Strategy):
    kind = "mol"
    is_routing = True
    reprefill_name = "handoff prefill"

    def route_hop(self, spec, num_prompt_tokens: int, routing_last_layer: int) -> dict | None:
        router = spec.router_adapter_index
        # The route KV and L0's window are rolled back after the decision.
        return dict(hop="route", adapter=router,
                    num_prompt_tokens=num_prompt_tokens + spec.num_route_prompt_tokens,
                    num_output_tokens=spec.num_route_decode_tokens)

    def summary_tokens(self, spec, adapter: int) -> int:
        return spec.max_summary_tokens if adapter != spec.router_adapter_index else 0

    def extra_sequence_tokens(self, spec) -> int:
        return spec.num_route_prompt_tokens + spec.num_route_decode_tokens \
            + spec.max_summary_tokens

    def decision_s(self, spec, pricing: TurnPricing, num_context_tokens: int) -> float:
        # L0 prefills the route prompt, then decodes label and reason.
        c, p = pricing.coeffs, pricing.costs
        route = prefill_s(c, p, spec.num_route_prompt_tokens,
                          max_chunk_tokens=pricing.max_chunk_tokens)
        return route + decode_run_s(c, p, num_tokens=spec.num_route_decode_tokens,
                                    num_context_tokens=spec.num_route_prompt_tokens)

    def switch_s(self, spec, pricing: TurnPricing, num_context_tokens: int,
                 kv_switch: tuple[float, str]) -> tuple[float, str]:
        seconds, mechanism = kv_switch
        if not spec.max_summary_tokens:
            return kv_switch
        # The answering adapter writes a summary for later hops.
        seconds += decode_run_s(pricing.coeffs, pricing.costs, num_tokens=spec.max_summary_tokens,
                                num_context_tokens=num_context_tokens)
        return seconds, mechanism + " + summary hop"
