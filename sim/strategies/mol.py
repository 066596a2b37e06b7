"""`mol`: mixture of LoRAs routed by adapter L0, which prefills a route prompt and decodes a label
and reason; an answer by another adapter is followed by a summary hop under it."""

from __future__ import annotations

from sim.strategies.strategy import Strategy


class MixtureOfLoras(Strategy):
    kind = "mol"
    is_routing = True

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
