"""`preft`: prefill-only adapters (LoRA_P, DiReFT_P): the prompt runs through the adapter, decode
tokens through the base weights."""

from __future__ import annotations

from sim.strategies.strategy import Strategy


class PreFT(Strategy):
    kind = "preft"
    is_decode_adapted = False
    is_verifiable = True

    def adapter_pricing_kind(self, spec) -> str:
        return "direft" if spec.variant == "direft_p" else "lora"

    def engine_adapter_kind(self, spec) -> str:
        return spec.variant
