"""`contextual_mol`: a q/k head scores the query against every option's description in one
encoder pass up to the routing layer, then the chosen adapter answers."""

from __future__ import annotations

from sim.strategies.strategy import Strategy


class ContextualMol(Strategy):
    kind = "contextual_mol"
    is_routing = True

    def route_hop(self, spec, num_prompt_tokens: int, routing_last_layer: int) -> dict | None:
        options = spec.num_domains * spec.num_option_description_tokens
        return dict(hop="route", adapter=-1, num_prompt_tokens=num_prompt_tokens + options,
                    num_output_tokens=0, last_layer=routing_last_layer,
                    num_routing_decisions=1)

    def extra_sequence_tokens(self, spec) -> int:
        return spec.num_domains * spec.num_option_description_tokens
