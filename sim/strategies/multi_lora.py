"""`multi_lora`: one LoRA per domain on every token, batched across adapters (Punica, S-LoRA,
vLLM); the client names the adapter."""

from __future__ import annotations

from sim.strategies.strategy import Strategy


class MultiLora(Strategy):
    kind = "multi_lora"
    is_verifiable = True
