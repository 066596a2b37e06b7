"""`contextual_mol`: a q/k head scores the query against every option's description in one
encoder pass up to the routing layer, then the chosen adapter answers."""

from __future__ import annotations

from sim.cost.phase_costs import prefill_s
from sim.strategies.strategy import Strategy, TurnPricing


class ContextualMol(Strategy):
    kind = "contextual_mol"
    needs_ced_model = True
    is_routing = True

    def route_hop(self, spec, num_prompt_tokens: int, routing_last_layer: int) -> dict | None:
        options = spec.num_domains * spec.num_option_description_tokens
        return dict(hop="route", adapter=-1, num_prompt_tokens=num_prompt_tokens + options,
                    num_output_tokens=0, last_layer=routing_last_layer,
                    num_routing_decisions=1)

    def extra_sequence_tokens(self, spec) -> int:
        return spec.num_domains * spec.num_option_description_tokens

    def decision_s(self, spec, pricing: TurnPricing, num_context_tokens: int) -> float:
        # One encoder pass over the query and every option's description.
        options = len(spec.adapters) * spec.num_option_description_tokens
        return prefill_s(pricing.coeffs, pricing.costs, pricing.num_query_tokens + options,
                         num_context_tokens=num_context_tokens,
                         max_chunk_tokens=pricing.max_chunk_tokens, is_adapted=False,
                         last_layer=pricing.routing_last_layer, num_routing_decisions=1)

    def decision_kv_tokens(self, spec, num_query_tokens: int) -> int:
        # The decision's global-KV branch: the query and every option's description.
        return num_query_tokens + len(spec.adapters) * spec.num_option_description_tokens
