"""`multi_agent`: one full model per domain (agent), each on its own replicas; a switch hands the
conversation (or a bounded handover text) to the next agent, which prefills it."""

from __future__ import annotations

from sim.cost.phase_costs import prefill_s
from sim.engine.sequence import PRIVATE_STREAM
from sim.hardware.specs import ModelArch
from sim.strategies.placement import KvLayout
from sim.strategies.strategy import Strategy, TurnPricing


class MultiAgent(Strategy):
    kind = "multi_agent"
    uses_adapters = False
    is_model_per_domain = True

    def kv_layout(self, arch: ModelArch, placements: list[list[tuple[int, str]]]) -> KvLayout:
        return "per_model"

    def answer_fields(self, spec, *, is_routed: bool, is_switch: bool,
                      num_context_tokens: int, num_user_tokens: int) -> dict:
        if not is_switch or spec.num_handover_tokens is None:
            return {}
        handover = min(num_context_tokens, spec.num_handover_tokens)
        return dict(num_prompt_tokens=handover + num_user_tokens, stream_id=PRIVATE_STREAM,
                    num_stream_prompt_tokens=0, is_output_in_stream=False)

    def switch_s(self, spec, pricing: TurnPricing, num_context_tokens: int,
                 kv_switch: tuple[float, str]) -> tuple[float, str]:
        tokens = spec.num_handover_tokens or num_context_tokens
        return (prefill_s(pricing.coeffs, pricing.costs, tokens,
                          max_chunk_tokens=pricing.max_chunk_tokens),
                "handover prefill (next model)")
