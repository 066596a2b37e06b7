"""Capacity candidates dropped when the KV pool cannot hold the longest context, and the
analytical comparisons checked against values computed by hand."""

import pytest

from planner.predict.analysis import kv_per_conversation, memory_summary, routing_overhead
from planner.scenario.schema import Scenario
from planner.search.strategy_plan import fitting_candidates, workload_shape

GIB = 2**30


def test_candidates_whose_kv_pool_cannot_hold_the_longest_context_are_dropped():
    # Llama-3.1-70B, 141e9 bytes of bf16 weights: at TP 2 each 80 GB H100 keeps 70.6e9 of
    # about 72-76e9 usable bytes, leaving KV for at most ~30k tokens (163,840 bytes per token
    # per GPU); at TP 4 about 440k. The workload reaches 60,000 + 2 x (64 + 64) tokens.
    s = Scenario.model_validate(dict(
        model="llama-3.1-70b",
        hardware=dict(gpu="H100-SXM", num_gpus_per_replica=4, tensor_parallel_size=4),
        strategies=[{"kind": "multi_lora", "adapters": [{"name": "a"}]}],
        workload=dict(kind="conversations", num_conversations=3, num_turns=2,
                      num_initial_context_tokens=60_000, num_user_tokens=64,
                      num_reply_tokens=64),
        search=dict(tensor_parallel_sizes=[2, 4])))
    shape = workload_shape(s)
    assert shape.max_context_tokens == 60_256
    kept, dropped = fitting_candidates(s, 0, shape)
    assert [d.tensor_parallel_size for d in kept] == [4]
    assert len(dropped) == 1 and "H100-SXM TP=2" in dropped[0] and "60256" in dropped[0]


ANALYSIS = dict(context_tokens=[4096], adapters_visited=[1, 2], decode_tokens_per_turn=[64, 1024],
                decision_every_tokens=[16, 256], distinct_adapters=[1], decode_batch_size=4,
                measured_turn_fixed_s=19.65, measured_turn_per_token_s=0.336)


@pytest.fixture(scope="module")
def scenario():
    return Scenario.model_validate(dict(
        model="llama-3.1-8b",
        hardware=dict(gpu="H200", num_gpus_per_replica=8, tensor_parallel_size=8),
        strategies=[{"kind": "base"},
                    {"kind": "multi_lora", "adapters": [{"name": "a"}, {"name": "b"}]},
                    {"kind": "mol2", "model": "ced-40", "measured_decision_time_s": 0.00277,
                     "adapters": [{"name": "a"}, {"name": "b"}]}],
        analysis=ANALYSIS))


def test_kv_per_conversation_by_hand(scenario):
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 131,072 bytes per token;
    # 4096 tokens = 0.5 GiB per copy. Multi-LoRA's prefix cache keys KV by adapter: one copy
    # per adapter visited. The base model keeps one.
    kv = kv_per_conversation(scenario).set_index(["strategy", "adapters_visited"])["kv_gib"]
    assert kv[("base", 1)] == kv[("base", 2)] == 0.5
    assert kv[("multi_lora", 1)] == 0.5 and kv[("multi_lora", 2)] == 1.0
    # CED (decoder-side adapters): one shared copy whatever the adapters visited.
    assert kv[("mol2", 1)] == kv[("mol2", 2)]


def test_routing_overhead_by_hand(scenario):
    per_turn, per_k = routing_overhead(scenario)
    turn = per_turn[per_turn.strategy == "mol2"].set_index("decode_tokens_per_turn")
    decision = 0.00277
    for tokens in (64, 1024):
        direct = 19.65 + 0.336 * tokens
        assert turn.loc[tokens, "direct_turn_s"] == pytest.approx(direct, rel=1e-12)
        assert turn.loc[tokens, "routing_share"] == pytest.approx(decision / (direct + decision),
                                                                  rel=1e-12)
    k = per_k[per_k.strategy == "mol2"].set_index("decision_every_tokens")
    assert k.loc[16, "routing_share"] == pytest.approx(decision / (decision + 16 * 0.336),
                                                       rel=1e-12)
    named = per_turn[per_turn.strategy == "multi_lora"]
    assert (named.decision_s == 0).all() and (named.routing_share == 0).all()


def test_memory_summary_weights_by_hand(scenario):
    # Llama-3.1-8B has 8,030,261,248 parameters (its model card); bf16 over TP 8.
    mem = memory_summary(scenario).set_index("strategy")
    assert mem.loc["base", "weights_gib_per_gpu"] == pytest.approx(
        8_030_261_248 * 2 / 8 / GIB, rel=1e-3)
    assert mem.loc["base", "lora_slots_gib_per_gpu"] == 0
    assert mem.loc["multi_lora", "lora_slots_gib_per_gpu"] > 0


def test_a_dedicated_router_pool_is_counted_and_priced():
    from planner.predict.simulation import simulate_strategy
    from planner.search.slo_search import Deployment
    assert Deployment("H100-SXM", 2, num_replicas=3, num_router_replicas=1).num_gpus == 8
    s = Scenario.model_validate(dict(
        model="ced-40", hardware=dict(gpu="H200", num_gpus_per_replica=8, tensor_parallel_size=8),
        strategies=[{"kind": "mol2", "routing": "outside_engine", "router_pool": "dedicated",
                     "num_router_replicas": 1, "adapters": [{"name": "a"}, {"name": "b"}]}],
        workload=dict(kind="conversations", num_conversations=4, num_turns=2,
                      num_initial_context_tokens=256, num_user_tokens=32, num_reply_tokens=8)))
    kept, _ = fitting_candidates(s, 0, workload_shape(s))
    assert [d.num_router_replicas for d in kept] == [1]
    assert kept[0].num_gpus == 16  # one serving replica and one router replica of TP 8
    result = simulate_strategy(s, 0)
    routing = result.requests[result.requests.hop == "routing_prefill"]
    assert set(routing.replica) == {1} and result.stats["num_replicas"] == 2
