"""The four analytical comparisons of the first report, from the cost and memory models only.

1. KV memory per conversation vs adapters visited and context length.
2. Cost of one domain switch vs context length (handoff prefill, bounded replay, re-prefill).
3. Routing overhead as a share of the turn vs reply length and vs a decision every k tokens.
4. Decode step time vs distinct adapters in the batch.
Each returns a tidy DataFrame; nothing here is hard-coded beyond the scenario's own inputs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from planner.scenario.pricing import StrategyCosting
from planner.scenario.resolved import ResolvedScenario, as_resolved, create_strategy_costing
from planner.scenario.schema import Scenario
from sim.cost.cost_model import create_step_batch, predict_step
from sim.cost.layer_costs import LayerCosts
from sim.cost.memory_model import conversation_kv
from sim.cost.phase_costs import decode_run_s, decode_step, prefill_s
from sim.strategies.registry import get_strategy
from sim.strategies.strategy import TurnPricing

GIB = 2**30


def _costings(resolved: ResolvedScenario) -> list[tuple[object, StrategyCosting]]:
    return [(st, create_strategy_costing(resolved, i))
            for i, st in enumerate(resolved.scenario.strategies)]


def _labels(strategy, costing: StrategyCosting) -> dict:
    return dict(strategy=costing.label, kind=strategy.kind, model=costing.arch.name)


def _num_options(strategy) -> int:
    return len(getattr(strategy, "adapters", ()))


def decision_time_s(scenario: Scenario, strategy, costing: StrategyCosting,
                    num_context_tokens: int) -> float:
    """Seconds one routing decision takes under `strategy` (0 when the client names the adapter).

    A measured time in the scenario wins; otherwise it is derived from the mechanism.
    """
    measured = getattr(strategy, "measured_decision_time_s", None)
    if measured is not None:
        return measured
    return get_strategy(strategy.kind).decision_s(strategy, _turn_pricing(scenario, costing),
                                                  num_context_tokens)


def _turn_pricing(scenario: Scenario, costing: StrategyCosting) -> TurnPricing:
    p = costing.profile
    return TurnPricing(costing.coeffs, p, scenario.engine.max_num_batched_tokens,
                       scenario.analysis.num_query_tokens,
                       (costing.arch.ced.routing_layer + 1) if costing.arch.ced
                       else p.num_layers)


def _replay_in_step_s(costing: StrategyCosting, num_query_tokens: int,
                      num_context_tokens: int, *, window_tokens: int | None = None,
                      layers: tuple[int, int] | None = None,
                      reencode: tuple[int, int] | None = None) -> float:
    """What rebuilding a window adds to the step that prefills the user turn (the engine runs
    it with the answer's first chunk): the step with it minus the step without it. By default
    the bounded replay (the decoder layers); `layers` (first, last) and `window_tokens` price
    another window, the encoder's re-encode of C[-W:]. `reencode` (window, encoder layers) puts
    that re-encode in both steps, as the engine runs it with the turn: a step's LoRA kernel grid
    grows with all its tokens, so the replay's share depends on what else the step holds."""
    c, p = costing.coeffs, costing.profile
    window = costing.replay_window_tokens if window_tokens is None else window_tokens
    replay = min(window, num_context_tokens)
    first, last = layers or (costing.first_decoder_layer, p.num_layers)
    # Columns: new tokens, context, first layer, last layer, is replay, samples a token.
    turn = [(num_query_tokens, num_context_tokens, 0, p.num_layers, False, True)]
    if reencode is not None:
        num = min(reencode[0], num_context_tokens)
        turn.append((num, num_context_tokens - num, 0, reencode[1], True, False))
    with_replay = [*turn, (replay, num_context_tokens - replay, first, last, True, False)]
    return _step_s(c, p, with_replay) - _step_s(c, p, turn)


def _step_s(c, p, items: list[tuple]) -> float:
    new, ctx, first, last, replay, samples = (list(column) for column in zip(*items, strict=True))
    batch = create_step_batch(new, ctx, num_layers=p.num_layers, adapter_ids=[0] * len(new),
                              is_adapted=[True] * len(new), first_layer=first, last_layer=last,
                              is_replay=replay, is_last_chunk=samples)
    return predict_step(c, p, batch).total_s


def _reencode_window(scenario: Scenario, costing: StrategyCosting) -> tuple[int, int] | None:
    """(window, encoder layers) a CED turn re-encodes after a cached prefix, or None."""
    ced = costing.arch.ced
    if ced is None or scenario.engine.ced_encoder_window != "recompute":
        return None
    return ced.sliding_window_tokens, ced.num_encoder_layers


def switch_cost_s(scenario: Scenario, strategy, costing: StrategyCosting,
                  num_context_tokens: int) -> tuple[float, str]:
    """Seconds one domain switch adds to a turn at this context, and the mechanism's name: the
    turn's prefill of the user turn with the switch minus without it (the analysis query)."""
    c, p = costing.coeffs, costing.profile
    chunk = scenario.engine.max_num_batched_tokens
    query = scenario.analysis.num_query_tokens
    kind = get_strategy(strategy.kind)
    if costing.kv_layout == "shared":  # adapters on the decoder side of a CED model
        kv_switch = (_replay_in_step_s(costing, query, num_context_tokens,
                                       reencode=_reencode_window(scenario, costing)),
                     "bounded replay")
    else:  # the context again under the target, with the user turn, instead of the turn alone
        kv_switch = (prefill_s(c, p, num_context_tokens + query, max_chunk_tokens=chunk)
                     - prefill_s(c, p, query, num_context_tokens=num_context_tokens,
                                 max_chunk_tokens=chunk), kind.reprefill_name)
    return kind.switch_s(strategy, _turn_pricing(scenario, costing), num_context_tokens,
                         kv_switch)


def kv_per_conversation(scenario: Scenario | ResolvedScenario) -> pd.DataFrame:
    """Comparison 1: KV bytes one conversation holds, by strategy, context and adapters visited."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    rows = []
    a = scenario.analysis
    for strategy, costing in _costings(resolved):
        temporary = get_strategy(strategy.kind).decision_kv_tokens(strategy, a.num_query_tokens)
        for visited in a.adapters_visited:
            for ctx in a.context_tokens:
                kv = conversation_kv(costing.arch, costing.kv_layout, ctx, visited,
                                     scenario.engine.block_size, temporary)
                rows.append(dict(_labels(strategy, costing), context_tokens=ctx,
                                 adapters_visited=visited,
                                 kv_gib=kv.total_bytes / GIB, shared_gib=kv.shared_bytes / GIB,
                                 per_adapter_gib=kv.per_adapter_bytes / GIB,
                                 window_gib=kv.window_bytes / GIB,
                                 temporary_gib=kv.temporary_bytes / GIB))
    return pd.DataFrame(rows)


def switch_cost(scenario: Scenario | ResolvedScenario) -> pd.DataFrame:
    """Comparison 2: seconds of one domain switch vs context length."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    rows = []
    for strategy, costing in _costings(resolved):
        for ctx in scenario.analysis.context_tokens:
            seconds, mechanism = switch_cost_s(scenario, strategy, costing, ctx)
            rows.append(dict(_labels(strategy, costing), context_tokens=ctx, switch_s=seconds,
                             mechanism=mechanism))
    return pd.DataFrame(rows)


def _tpot_s(scenario: Scenario, strategy, costing: StrategyCosting, ctx: int) -> float:
    a = scenario.analysis
    if a.measured_turn_per_token_s is not None:
        return a.measured_turn_per_token_s
    return decode_step(costing.coeffs, costing.profile, batch_size=a.decode_batch_size,
                       num_context_tokens=ctx, num_distinct_adapters=_batch_adapters(strategy, a),
                       is_adapted=get_strategy(strategy.kind).is_decode_adapted).total_s


def _batch_adapters(strategy, analysis) -> int:
    return min(_num_options(strategy), analysis.decode_batch_size)


def _value_key(value) -> object:
    """A hashable stand-in, equal for equal values: an array's bytes, a dataclass by its fields
    (some compare by identity), an unhashable model (a GPU spec's sources dict) by its repr,
    which prints every field in full."""
    if isinstance(value, np.ndarray):
        return value.dtype.str, value.shape, value.tobytes()
    if dataclasses.is_dataclass(value):
        return type(value).__name__, tuple((f.name, _value_key(getattr(value, f.name)))
                                           for f in dataclasses.fields(value))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class _DecodeRuns:
    """`decode_run_s` priced once per distinct input within one comparison: strategies whose
    profiles are equal by value (the two MoL2 routings of one model, say) decode the same runs,
    and a run is hundreds of `predict_step` calls. The function is pure, so a repeat returns
    the very same float. Lives for one call, so the profiles it keys by id stay alive."""

    def __init__(self) -> None:
        self._profiles: dict[int, tuple] = {}
        self._runs: dict[tuple, float] = {}

    def _profile_key(self, profile: LayerCosts) -> tuple:
        if id(profile) not in self._profiles:
            self._profiles[id(profile)] = _value_key(profile)
        return self._profiles[id(profile)]

    def __call__(self, coeffs, profile: LayerCosts, **kwargs) -> float:
        key = (self._profile_key(profile), _value_key(coeffs), tuple(sorted(kwargs.items())))
        if key not in self._runs:
            self._runs[key] = decode_run_s(coeffs, profile, **kwargs)
        return self._runs[key]


def _direct_turn_s(scenario: Scenario, strategy, costing: StrategyCosting,
                   num_decode_tokens: int, runs=decode_run_s) -> float:
    """A turn with the right adapter and no routing: prefill the user turn, decode the reply."""
    a = scenario.analysis
    if a.measured_turn_fixed_s is not None:
        return a.measured_turn_fixed_s + a.measured_turn_per_token_s * num_decode_tokens
    c, p, ctx = costing.coeffs, costing.profile, a.num_turn_context_tokens
    first = prefill_s(c, p, a.num_query_tokens, num_context_tokens=ctx,
                      max_chunk_tokens=scenario.engine.max_num_batched_tokens)
    ced = costing.arch.ced
    if ced is not None and scenario.engine.ced_encoder_window == "recompute":
        first += _replay_in_step_s(costing, a.num_query_tokens, ctx,
                                   window_tokens=ced.sliding_window_tokens,
                                   layers=(0, ced.num_encoder_layers))
    # The prefill samples the first reply token; the decode steps make the rest.
    return first + runs(c, p, num_tokens=num_decode_tokens - 1,
                        num_context_tokens=ctx + a.num_query_tokens,
                        batch_size=a.decode_batch_size,
                        num_distinct_adapters=_batch_adapters(strategy, a),
                        is_adapted=get_strategy(strategy.kind).is_decode_adapted)


def routing_overhead(scenario: Scenario | ResolvedScenario) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Comparison 3: routing share of a turn vs reply length, and vs a decision every k tokens."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    a = scenario.analysis
    ctx = a.num_turn_context_tokens
    per_turn, per_k = [], []
    runs = _DecodeRuns()
    for strategy, costing in _costings(resolved):
        decision = decision_time_s(scenario, strategy, costing, ctx)
        base = dict(_labels(strategy, costing), decision_s=decision)
        for tokens in a.decode_tokens_per_turn:
            turn = _direct_turn_s(scenario, strategy, costing, tokens, runs)
            per_turn.append(dict(base, decode_tokens_per_turn=tokens, direct_turn_s=turn,
                                 routing_share=decision / (turn + decision)))
        tpot = _tpot_s(scenario, strategy, costing, ctx)
        switch, _ = switch_cost_s(scenario, strategy, costing, ctx)
        switch = 0.0 if math.isnan(switch) else switch
        for k in a.decision_every_tokens:
            decode = k * tpot
            per_k.append(dict(base, decision_every_tokens=k, decode_s=decode, switch_s=switch,
                              routing_share=decision / (decision + decode),
                              routing_and_switch_share=(decision + switch)
                              / (decision + switch + decode)))
    return pd.DataFrame(per_turn), pd.DataFrame(per_k)


def decode_step_vs_adapters(scenario: Scenario | ResolvedScenario) -> pd.DataFrame:
    """Comparison 4: one decode step's time vs distinct adapters in the batch, by term."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    a = scenario.analysis
    rows = []
    for strategy, costing in _costings(resolved):
        has_adapters = costing.profile.adapter_kind != "none"
        for distinct in a.distinct_adapters:
            if distinct > a.decode_batch_size:
                continue
            step = decode_step(costing.coeffs, costing.profile, batch_size=a.decode_batch_size,
                               num_context_tokens=a.num_turn_context_tokens,
                               num_distinct_adapters=distinct if has_adapters else 0,
                               is_adapted=get_strategy(strategy.kind).is_decode_adapted)
            rows.append(dict(_labels(strategy, costing), distinct_adapters=distinct,
                             step_s=step.total_s,
                             **{k: v for k, v in step.as_dict().items() if k != "total_s"}))
    return pd.DataFrame(rows)


def memory_summary(scenario: Scenario | ResolvedScenario) -> pd.DataFrame:
    """Per-GPU memory split and KV capacity of one replica, by strategy."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    e, hw = scenario.engine, scenario.hardware
    rows = []
    for strategy, costing in _costings(resolved):
        mem = e.memory(costing.arch, costing.gpu, hw.tensor_parallel_size,
                       uses_lora=costing.profile.adapter_kind != "none")
        rows.append(dict(_labels(strategy, costing), gpu=costing.gpu.name,
                         weights_gib_per_gpu=mem.weight_bytes / GIB,
                         lora_slots_gib_per_gpu=mem.adapter_slot_bytes / GIB,
                         activations_gib_per_gpu=mem.activation_bytes / GIB,
                         window_state_gib_per_gpu=mem.window_state_bytes / GIB,
                         kv_pool_gib_per_gpu=max(mem.kv_pool_bytes, 0) / GIB,
                         num_kv_blocks=mem.num_kv_blocks, num_kv_tokens=mem.num_kv_tokens))
    return pd.DataFrame(rows)


def run_comparisons(scenario: Scenario | ResolvedScenario) -> dict[str, pd.DataFrame]:
    """The memory summary and the four comparisons, by name."""
    resolved = as_resolved(scenario)
    per_turn, per_k = routing_overhead(resolved)
    return {
        "memory_summary": memory_summary(resolved),
        "kv_per_conversation": kv_per_conversation(resolved),
        "switch_cost": switch_cost(resolved),
        "routing_vs_reply_length": per_turn,
        "routing_vs_decision_frequency": per_k,
        "decode_step_vs_adapters": decode_step_vs_adapters(resolved),
    }


def tidy(comparisons: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One long table: comparison, strategy, kind, model, other keys, then metric and value."""
    keys = ["strategy", "kind", "model"]
    frames = []
    for name, df in comparisons.items():
        numeric = [c for c in df.columns if c not in keys and pd.api.types.is_numeric_dtype(df[c])]
        long = df.melt(id_vars=[c for c in df.columns if c not in numeric] , value_vars=numeric,
                       var_name="metric", value_name="value")
        frames.append(long.dropna(subset=["value"]).assign(comparison=name))  # NaN: n/a
    out = pd.concat(frames, ignore_index=True)
    first = ["comparison", *keys, "metric", "value"]
    return out[first + [c for c in out.columns if c not in first]]


def strategy_summary(scenario: Scenario | ResolvedScenario) -> pd.DataFrame:
    """One row per strategy at the analysis turn: decision, switch, decode step, KV, capacity."""
    resolved = as_resolved(scenario)
    scenario = resolved.scenario
    a, e = scenario.analysis, scenario.engine
    ctx = a.num_turn_context_tokens
    memory = memory_summary(resolved).set_index("strategy")
    rows = []
    for strategy, costing in _costings(resolved):
        switch, mechanism = switch_cost_s(scenario, strategy, costing, ctx)
        visited = max(1, _num_options(strategy))
        kv = conversation_kv(costing.arch, costing.kv_layout, ctx, visited, e.block_size)
        rows.append(dict(
            _labels(strategy, costing), gpu=costing.gpu.name,
            decision_s=decision_time_s(scenario, strategy, costing, ctx),
            switch_s=switch, switch_mechanism=mechanism,
            decode_step_s=_tpot_s(scenario, strategy, costing, ctx),
            kv_gib_per_conversation=kv.total_bytes / GIB,
            num_kv_tokens=int(memory.loc[costing.label, "num_kv_tokens"]),
        ))
    return pd.DataFrame(rows)
