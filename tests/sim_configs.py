"""Small ready-made simulator configs for tests and benchmarks (no scenario file needed)."""

from __future__ import annotations

from sim.config import AdapterSpec, ClusterSpec, EngineLimits, SimConfig, StrategySpec
from sim.hardware.catalogue import get_gpu, get_model
from sim.strategies.placement import adapter_placements
from sim.strategies.registry import get_strategy, kv_layout

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def strategy_for(kind: str, model: str, num_adapters: int = 4, **fields) -> StrategySpec:
    """A strategy of `kind` over `num_adapters` rank-16 attention adapters on `model`."""
    arch, strategy = get_model(model), get_strategy(kind)
    if not strategy.uses_adapters:  # the base model, or one full model per agent
        num_domains = num_adapters if strategy.is_model_per_domain else 0
        adapters = tuple(AdapterSpec(name=f"d{i}", num_bytes_per_gpu=0.0)
                         for i in range(num_domains))
        layout = kv_layout(arch, kind, [])
        return StrategySpec(kind=kind, label=kind, kv_layout=layout, adapters=adapters, **fields)
    placements = adapter_placements(arch, None, ATTENTION_MODULES)
    defaults = dict(adapter_kind="lora", adapter_rank=16, adapter_placements=tuple(placements),
                    is_decode_adapted=strategy.is_decode_adapted,
                    kv_layout=kv_layout(arch, kind, [placements] * num_adapters))
    if arch.ced is not None:
        defaults.update(replay_window_tokens=arch.ced.sliding_window_tokens,
                        num_head_params=15_250_000 if kind == "mol2" else 0)
    adapters = tuple(AdapterSpec(name=f"d{i}", num_bytes_per_gpu=2e6)
                     for i in range(num_adapters))
    return StrategySpec(kind=kind, label=kind, adapters=adapters, **{**defaults, **fields})


def small_config(kind: str = "multi_lora", *, model: str | None = None, gpu: str = "H100-SXM",
                 tp: int = 1, num_replicas: int = 1, router: str = "least_outstanding",
                 mode: str = "fast", strategy_fields: dict | None = None,
                 **engine) -> SimConfig:
    """A one-replica config: Llama-3.1-8B, or the CED model (TP 8 on H200) for CED strategies."""
    if model is None:
        model = "ced-40" if kind in ("contextual_mol", "mol2") else "llama-3.1-8b"
    if model == "ced-40":
        gpu, tp = "H200", 8
    num_adapters = engine.pop("num_adapters", 4)
    return SimConfig(
        arch=get_model(model), gpu=get_gpu(gpu), tensor_parallel_size=tp,
        engine=EngineLimits(**engine),
        strategy=strategy_for(kind, model, num_adapters, **(strategy_fields or {})),
        cluster=ClusterSpec(num_replicas=num_replicas, router=router), mode=mode,
        check_invariants=True)
