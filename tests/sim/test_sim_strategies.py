"""Invariants after every run, and the domain's qualitative facts coming out of simulation:
switch cost flat in context under CED strategies and growing under MoL and multi-LoRA; PreFT
decode steps unaffected by the adapter mix; routing outside the engine costs a second prefill."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.simulate import simulate
from sim.workload.generate import Workload, conversation_workload, punica_workload

STRATEGIES = ("base", "multi_lora", "preft", "mol", "contextual_mol", "mol2", "multi_agent")


def two_turn_switch(initial_tokens: int, domains=(0, 1)) -> Workload:
    """One conversation whose second turn (after a long think) moves to another domain."""
    return Workload(
        conv_arrival_s=np.zeros(1), conv_first_turn=np.zeros(1, int),
        conv_num_turns=np.array([2]), conv_initial_tokens=np.array([initial_tokens]),
        turn_domain=np.array(domains), turn_user_tokens=np.array([128, 128]),
        turn_reply_tokens=np.array([32, 32]), turn_think_s=np.array([0.0, 100.0]))


def conversations(seed=0, **kw):
    params = dict(num_conversations=8, num_turns=4, num_domains=4, switch_probability=0.5,
                  num_initial_context_tokens=512, num_user_tokens=64, num_reply_tokens=32,
                  think_time_s=0.2, arrival_rate_per_s=20.0)
    return conversation_workload(np.random.default_rng(seed), **{**params, **kw})


@pytest.mark.parametrize("kind", STRATEGIES)
def test_invariants_hold_for_every_strategy(kind):
    replicas = 4 if kind == "multi_agent" else 2
    config = small_config(kind, max_num_seqs=8, num_replicas=replicas)
    workload = conversations()
    result = simulate(config, workload, timeseries_interval_s=0.0)
    turns = result.turns
    assert len(turns) == workload.num_turns
    assert not turns.duplicated(["conv_id", "turn_index"]).any()
    assert (result.requests.groupby(["conv_id", "turn_index"]).size() >= 1).all()
    assert result.stats["kv_blocks_in_use_at_end"] == 0
    assert result.stats["num_sequences_left"] == 0
    ts = result.timeseries
    assert ts["kv_blocks_used"].between(0, result.stats["num_kv_blocks"]).all()
    assert (turns["first_token_s"] >= turns["arrival_s"]).all()
    assert (turns["finish_s"] >= turns["first_token_s"]).all()
    namespaces = set(result.kv_by_namespace["namespace"])
    if config.strategy.kv_layout != "per_adapter":
        assert namespaces == {-1}  # one shared copy
    else:
        assert len(namespaces) > 1 and -1 not in namespaces  # copies keyed by adapter


def switched_turn_ttft(kind: str, initial_tokens: int, **config) -> float:
    """Time to first token of a switched turn after routing: what the switch itself costs."""
    result = simulate(small_config(kind, **config), two_turn_switch(initial_tokens))
    second = result.turns.iloc[1]
    assert second.is_switch
    return second.ttft_s - second.route_s


@pytest.mark.parametrize("kind", ("mol2", "contextual_mol"))
def test_switch_cost_is_flat_in_context_under_ced(kind):
    short, long = switched_turn_ttft(kind, 1024), switched_turn_ttft(kind, 16384)
    assert long < 1.3 * short


@pytest.mark.parametrize("kind", ("mol", "multi_lora"))
def test_switch_cost_grows_with_context_without_shared_kv(kind):
    short, long = switched_turn_ttft(kind, 1024), switched_turn_ttft(kind, 16384)
    assert long > 3 * short


@pytest.mark.parametrize("kind", ("multi_lora", "preft", "mol"))
def test_decoder_side_adapters_on_ced_share_kv_whatever_the_strategy_name(kind):
    # A client-named adapter (the fixed-route baseline), PreFT, and MoL's answer hop on a CED
    # model with adapters on the decoder side only: shared KV, switch by bounded replay.
    config = small_config(kind, model="ced-40")
    assert config.strategy.kv_layout == "shared"
    short, long = (switched_turn_ttft(kind, n, model="ced-40") for n in (1024, 16384))
    assert long < 1.3 * short
    second = simulate(config, two_turn_switch(8192)).turns.iloc[1]
    assert second.num_replay_tokens == config.arch.ced.sliding_window_tokens
    assert second.num_recomputed_tokens < 64


@pytest.mark.parametrize("kind", ("multi_lora", "mol2"))
def test_ced_adapters_on_the_encoder_get_per_adapter_kv_and_re_prefill(kind):
    from sim.hardware.catalogue import get_model
    from sim.strategies.placement import adapter_placements
    from sim.strategies.registry import kv_layout
    arch = get_model("ced-40")
    pairs = adapter_placements(arch, tuple(range(arch.num_layers)), ("q_proj", "v_proj"))
    fields = dict(adapter_placements=tuple(pairs), kv_layout=kv_layout(arch, kind, [pairs]))
    assert fields["kv_layout"] == "per_adapter"
    short, long = (switched_turn_ttft(kind, n, model="ced-40", strategy_fields=fields)
                   for n in (1024, 16384))
    assert long > 3 * short
    second = simulate(small_config(kind, model="ced-40", strategy_fields=fields),
                      two_turn_switch(8192)).turns.iloc[1]
    assert second.num_replay_tokens == 0
    assert second.num_recomputed_tokens >= 8192


def test_ced_switch_replays_a_bounded_window_and_mol_recomputes_the_context():
    mol2 = simulate(small_config("mol2"), two_turn_switch(8192)).turns.iloc[1]
    mol = simulate(small_config("mol"), two_turn_switch(8192)).turns.iloc[1]
    assert mol2.num_replay_tokens == small_config("mol2").arch.ced.sliding_window_tokens
    assert mol2.num_recomputed_tokens < 64  # at most the partial last block is recomputed
    assert mol.num_recomputed_tokens >= 8192


def punica_tpot(kind: str, popularity: str) -> float:
    config = small_config(kind, max_num_seqs=16, max_loras=8, num_adapters=8)
    workload = punica_workload(np.random.default_rng(5), num_requests=16, num_adapters=8,
                               popularity=popularity, num_output_tokens=64)
    return float(simulate(config, workload).turns["tpot_s"].mean())


def test_preft_decode_is_unaffected_by_the_adapter_mix():
    assert punica_tpot("preft", "distinct") == pytest.approx(punica_tpot("preft", "identical"),
                                                             rel=1e-12)
    assert punica_tpot("multi_lora", "distinct") > punica_tpot("multi_lora", "identical")


def test_routing_outside_the_engine_costs_a_second_prefill():
    workload = conversations(num_conversations=4)
    inside = simulate(small_config("mol2", strategy_fields={"routing": "in_engine"}), workload)
    outside = simulate(small_config("mol2", strategy_fields={"routing": "outside_engine"}),
                       workload)
    routing = outside.requests[outside.requests.hop == "routing_prefill"]
    assert len(routing) == len(outside.turns)
    # The routing request is cached by the same rule as any hop: a first turn prefills its whole
    # prompt (nothing cached yet), a later one at least its user turn, never more than the prompt.
    prompts = (outside.turns["num_context_tokens"] + outside.turns["num_user_tokens"]).to_numpy()
    computed = routing.sort_values(["conv_id", "turn_index"])["num_prefill_tokens_computed"]
    first = (outside.turns["turn_index"] == 0).to_numpy()
    assert (computed.to_numpy()[first] == prompts[first]).all()
    assert (computed.to_numpy() >= outside.turns["num_user_tokens"].to_numpy()).all()
    assert (computed.to_numpy() <= prompts).all()
    assert "routing_prefill" not in set(inside.requests.hop)
    assert outside.turns["ttft_s"].mean() > inside.turns["ttft_s"].mean()
    assert outside.summary["routing_gpu_s"] > inside.summary["routing_gpu_s"] > 0


def test_affinity_keeps_conversations_on_their_replica():
    workload = conversations(num_conversations=12, switch_probability=0.0, num_turns=3)
    per_conv = {}
    for router in ("affinity", "round_robin"):
        config = small_config("multi_lora", num_replicas=3, router=router)
        turns = simulate(config, workload).turns
        per_conv[router] = turns.groupby("conv_id")["replica"].nunique()
        cached = turns["num_cached_tokens"].sum()
        per_conv[router + "_cached"] = cached
    assert (per_conv["affinity"] == 1).all()
    assert (per_conv["round_robin"] > 1).any()
    assert per_conv["affinity_cached"] > per_conv["round_robin_cached"]


@pytest.mark.parametrize("model", ("llama-3.1-8b", "ced-40"))
@pytest.mark.parametrize("kind", STRATEGIES)
def test_every_strategy_and_model_simulates_the_mechanism_its_placement_implies(kind, model):
    if kind in ("contextual_mol", "mol2") and model != "ced-40":
        pytest.skip("needs a CED model (the scenario rejects it)")
    extra = {"num_replicas": 4} if kind == "multi_agent" else {}
    config = small_config(kind, model=model, **extra)
    second = simulate(config, two_turn_switch(4096)).turns.iloc[1]
    layout = config.strategy.kv_layout
    expected = {"base": "one_copy", "multi_agent": "per_model"}.get(
        kind, "shared" if model == "ced-40" else "per_adapter")
    assert layout == expected
    if layout == "shared":  # bounded replay, nothing of the context recomputed
        assert second.num_replay_tokens == config.arch.ced.sliding_window_tokens
        assert second.num_recomputed_tokens < 64
    elif layout == "per_adapter":  # the context again under the new adapter
        assert second.num_replay_tokens == 0 and second.num_recomputed_tokens >= 4096
    elif layout == "per_model":  # the next agent prefills the history it is handed
        assert second.num_recomputed_tokens >= 4096
    else:
        assert second.num_replay_tokens == 0 and second.num_recomputed_tokens < 64
