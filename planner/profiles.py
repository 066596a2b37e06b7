"""Resolve one strategy of a scenario into what the cost model needs: model, GPU, profile."""

from __future__ import annotations

from dataclasses import dataclass

from planner.scenario import Scenario
from sim.cost_model import CostCoeffs, default_coeffs
from sim.cost_profile import CostProfile, create_cost_profile
from sim.placement import KvLayout, adapter_placements, kv_layout
from sim.specs import GpuSpec, ModelArch


@dataclass(frozen=True)
class StrategyCosting:
    """A strategy resolved for costing: its model, GPU, TP, profile and coefficients."""

    label: str
    kind: str
    arch: ModelArch
    gpu: GpuSpec
    tensor_parallel_size: int
    profile: CostProfile
    coeffs: CostCoeffs
    replay_window_tokens: int
    """Bounded replay length (the strategy's override, else the model's window; 0 if none)."""
    kv_layout: KvLayout
    """What the adapters' placement implies for KV (`sim.placement.kv_layout`)."""

    @property
    def first_decoder_layer(self) -> int:
        """First layer a bounded replay recomputes (0 on a decoder-only model)."""
        return self.arch.ced.num_encoder_layers if self.arch.ced else 0


def _adapter_kind(strategy) -> str:
    if strategy.kind in ("base", "multi_agent"):
        return "none"
    if strategy.kind == "preft" and strategy.variant == "direft_p":
        return "direft"
    return "lora"


def create_strategy_costing(
    scenario: Scenario, index: int, *, gpu: GpuSpec | None = None,
    tensor_parallel_size: int | None = None, coeffs: CostCoeffs | None = None,
) -> StrategyCosting:
    """Cost profile of strategy `index`; adapters are priced at engine.max_lora_rank because
    vLLM pads every adapter slot to it, on the union of the adapters' placements."""
    strategy = scenario.strategies[index]
    arch = scenario.strategy_arch(index)
    gpu = gpu or scenario.hardware.gpu_spec
    tp = tensor_parallel_size or scenario.hardware.tensor_parallel_size
    kind = _adapter_kind(strategy)
    every = [adapter_placements(arch, a.layers, a.target_modules)
             for a in (getattr(strategy, "adapters", ()) if kind != "none" else ())]
    placements = set().union(*every)
    profile = create_cost_profile(
        arch, gpu, tp, adapter_kind=kind, adapter_rank=scenario.engine.max_lora_rank,
        adapter_placements=sorted(placements),
        num_head_params=getattr(strategy, "num_head_params", 0),
    )
    window = getattr(strategy, "replay_window_tokens", None) or profile.window_tokens
    return StrategyCosting(strategy.label, strategy.kind, arch, gpu, tp, profile,
                           coeffs or default_coeffs(gpu), window,
                           kv_layout(arch, strategy.kind, every))
