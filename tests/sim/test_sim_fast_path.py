"""The event-skipping fast path gives the step-by-step reference's per-request metrics bit for
bit, for every strategy, on workloads that exercise arrivals mid-run, preemption, switches and
the multi-LoRA regime (many adapters over few slots, saturated queues; bench_multilora's own
workloads are in test_fast_group_preemption)."""

import numpy as np
import pandas as pd
import pytest
from sim_configs import small_config

from sim.config import ClusterSpec, DisaggregationSpec
from sim.cost.cost_model import attention_s_per_item, create_step_batch, predict_step
from sim.engine import run_pricing, step_pricer
from sim.engine.scheduler import Engine
from sim.engine.sequence import Sequence
from sim.engine.step_plan import StepPlan
from sim.engine.step_pricer import StepPricer
from sim.simulate import create_profile, simulate
from sim.workload.generate import conversation_workload, punica_workload, single_turn_workload

STRATEGIES = ("base", "multi_lora", "preft", "mol", "contextual_mol", "mol2", "multi_agent")
METRICS = ("first_scheduled_s", "first_token_s", "finish_s")


def both_modes(config, workload):
    ref = simulate(config.model_copy(update={"mode": "reference"}), workload)
    fast = simulate(config.model_copy(update={"mode": "fast"}), workload)
    return ref, fast


def assert_same_requests(ref, fast):
    """Bit for bit: times, counts and GPU time attribution."""
    assert len(ref.requests) == len(fast.requests)
    for col in (*METRICS, "num_prefill_tokens_computed", "num_preemptions", "num_cached_tokens",
                "busy_prefill_s", "busy_replay_s", "busy_decode_s"):
        np.testing.assert_array_equal(fast.requests[col], ref.requests[col], err_msg=col)


def conversations(seed, **kw):
    params = dict(num_conversations=6, num_turns=3, num_domains=4, switch_probability=0.5,
                  num_initial_context_tokens=300, num_user_tokens=40, num_reply_tokens=24,
                  think_time_s=0.05, arrival_rate_per_s=40.0)
    return conversation_workload(np.random.default_rng(seed), **{**params, **kw})


@pytest.mark.parametrize("kind", STRATEGIES)
@pytest.mark.parametrize("kv", ("roomy", "tight"))
def test_fast_equals_reference_on_conversations(kind, kv):
    extra = {"num_replicas": 4} if kind == "multi_agent" else {}
    workload = conversations(1)
    if kv == "tight":  # 120 blocks and a burst of arrivals: preemptions, cache evictions
        extra.update(num_kv_blocks=120, block_size=16)
        workload = conversations(7, arrival_rate_per_s=400.0, think_time_s=0.01)
    config = small_config(kind, max_num_seqs=8, **extra)
    ref, fast = both_modes(config, workload)
    assert_same_requests(ref, fast)
    assert fast.stats["num_engine_events"] < ref.stats["num_engine_events"]


@pytest.mark.parametrize("kind", ("multi_lora", "preft", "base"))
def test_fast_equals_reference_on_punica_with_preemption(kind):
    # A small KV pool forces preemptions; Poisson arrivals cut decode runs.
    config = small_config(kind, max_num_seqs=16, block_size=16, num_kv_blocks=60,
                          max_loras=2, num_adapters=6)
    workload = punica_workload(np.random.default_rng(3), num_requests=60, num_adapters=6,
                               num_output_tokens=40, arrival_rate_per_s=400.0)
    ref, fast = both_modes(config, workload)
    assert ref.requests["num_preemptions"].sum() > 0
    assert_same_requests(ref, fast)


def test_fast_equals_reference_with_speculative_decoding_and_replicas():
    config = small_config("multi_lora", max_num_seqs=8, num_speculative_tokens=3,
                          mean_accepted_tokens=2.0, num_replicas=2, router="round_robin")
    ref, fast = both_modes(config, conversations(2))
    assert_same_requests(ref, fast)


def test_fast_equals_reference_under_disaggregation():
    config = small_config("mol2", max_num_seqs=8)
    config = config.model_copy(update={"cluster": ClusterSpec(
        disaggregation=DisaggregationSpec(num_prefill_workers=1, num_decode_workers=2))})
    ref, fast = both_modes(config, conversations(4))
    assert_same_requests(ref, fast)
    hops = fast.requests["hop"].value_counts()
    assert hops["prefill"] == hops["answer"] == len(fast.turns)  # each answer split in two
    assert (fast.requests.loc[fast.requests.hop == "answer", "replica"] >= 1).all()


@pytest.mark.parametrize("kind", ("multi_lora", "contextual_mol"))
def test_attention_by_item_matches_the_cost_model(kind):
    config = small_config(kind)
    profile = create_profile(config)
    # Each item's seconds (over all its kinds of layer) summed: so the fast path can keep an
    # item's value and sum kept values, bit for bit. (On the CED model, summing each kind of
    # layer over the items first differs in the last bits for about half of these batches.)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        n = rng.integers(1, 300, size=12)
        ctx = rng.integers(0, 5000, size=12)
        first = rng.integers(0, profile.num_layers // 2, size=12)
        last = rng.integers(profile.num_layers // 2 + 1, profile.num_layers + 1, size=12)
        batch = create_step_batch(n, ctx, num_layers=profile.num_layers, first_layer=first,
                                  last_layer=last)
        expected = predict_step(config.coeffs, profile, batch).attention_s
        got = attention_s_per_item(config.coeffs, profile, n, ctx, first, last).sum()
        assert got == expected, seed


def _decode_run(adv: int, contexts: list[int], num_steps: int):
    config = small_config("multi_lora")
    pricer = StepPricer(config.coeffs, create_profile(config), replay_first_layer=0,
                        num_decode_compute_tokens=adv, num_tokens_per_decode_step=adv,
                        is_fast=True)
    seqs = [Sequence(seq_id=i, hop="answer", adapter=i % 2, kv_namespace=i % 2,
                     num_prompt_tokens=c, num_output_tokens=10_000, submit_s=0.0,
                     num_computed_tokens=c, num_generated_tokens=1)
            for i, c in enumerate(contexts)]
    return pricer.decode_run(StepPlan(decodes=seqs), 5.0, num_steps)


def _synthetic_run(shape: str, adv: int, contexts: list[int], num_steps: int):
    """A run whose per-item attention grows like `shape` with the context (far from the near
    linear step ends of real runs)."""
    x = np.arange(1 << 16, dtype=float)
    per_item = {"convex": x ** 3, "concave": np.sqrt(x), "steps": (x // 500) ** 4}[shape]
    c = np.array(contexts)
    return step_pricer.DecodeRun(5.0, num_steps, lambda first, count: 1e-3 + np.array(
        [per_item[c + adv * k].sum() for k in range(first, first + count)]))


@pytest.mark.parametrize("adv", (1, 3))
@pytest.mark.parametrize("contexts", ([7, 300, 1200, 4000], [0], [5, 60_000]))
@pytest.mark.parametrize("shape", ("real", "convex", "concave", "steps"))
def test_interrupted_run_search_finds_the_first_step_ending_at_or_after(adv, contexts, shape):
    # Where an arrival cuts a run: every step end, just past it, and past the run's end, each
    # searched on a fresh run (its steps are priced in chunks, as far as asked) against all
    # ends listed in order.
    num_steps = 200
    new_run = (lambda: _decode_run(adv, contexts, num_steps)) if shape == "real" else (
        lambda: _synthetic_run(shape, adv, [min(c, 4000) for c in contexts], num_steps))
    run = new_run()
    ends = [run.end_s(k) for k in range(num_steps + 1)]
    assert ends == sorted(ends)
    times = ends[1:] + [np.nextafter(e, np.inf) for e in ends[:-1]] + [ends[-1] * 2]
    for t in times:
        k = new_run().steps_to_reach(t, num_steps)
        expected = next((j for j in range(1, num_steps + 1) if ends[j] >= t), num_steps)
        assert k == expected, t


@pytest.mark.parametrize("kind", ("multi_lora", "mol", "preft"))
def test_fast_equals_reference_under_shared_kv_on_ced(kind):
    # Decoder-side adapters on the CED model: shared KV and bounded replays for any strategy.
    config = small_config(kind, model="ced-40", max_num_seqs=8)
    assert config.strategy.kv_layout == "shared"
    ref, fast = both_modes(config, conversations(5))
    assert ref.requests["num_replay_tokens"].sum() > 0
    assert_same_requests(ref, fast)


@pytest.mark.parametrize("kind", ("mol", "mol2", "contextual_mol"))
def test_fast_equals_reference_with_misroutes_and_named_turns(kind):
    from sim.workload.generate import with_named_share
    config = small_config(kind, max_num_seqs=8, strategy_fields={"routing_accuracy": 0.7})
    workload = with_named_share(np.random.default_rng(6), conversations(3), 0.3)
    ref, fast = both_modes(config, workload)
    assert fast.summary["num_misroutes"] > 0
    assert_same_requests(ref, fast)


@pytest.mark.parametrize("kind", ("multi_lora", "preft"))
def test_fast_equals_reference_with_the_fitted_cpu_lora_terms(kind):
    # The cpu entry's fitted coefficients switch on the slice-launch and per-token gather terms
    # (which depend on whether a step has any adapted token): the fast path's cache must agree.
    from sim.cost.cost_model import DEFAULT_COEFFS

    config = small_config(kind, model="vllm-tiny-llama", gpu="cpu", max_num_seqs=8,
                          max_num_batched_tokens=256, max_lora_rank=8)
    config = config.model_copy(update={"coeffs": DEFAULT_COEFFS["cpu"]})
    assert config.coeffs.lora_token_gather_share > 0 and config.coeffs.lora_slice_launch_s > 0
    workload = punica_workload(np.random.default_rng(3), num_requests=40, num_adapters=4,
                               max_prompt_tokens=300, num_output_tokens=12,
                               arrival_rate_per_s=50.0)
    ref, fast = both_modes(config, workload)
    assert_same_requests(ref, fast)


def test_fast_equals_reference_on_mooncake_hash_ids_with_evictions():
    # Trace hash ids name the blocks (shared leading ids, partial last id); a pool of 900
    # blocks for about 2,600 blocks of prompts makes the prefix cache evict.
    from sim.workload.traces import TRACES_DIR, trace_workload

    workload = trace_workload(np.random.default_rng(0),
                              TRACES_DIR / "mooncake_fast25" / "conversation_trace.jsonl",
                              num_domains=4, fmt="jsonl", hash_ids_column="hash_ids",
                              time_unit="ms", max_requests=30, length_scale=0.1,
                              hash_block_tokens=128)
    config = small_config("multi_lora", max_num_seqs=8, block_size=16, num_kv_blocks=900)
    ref, fast = both_modes(config, workload)
    assert fast.requests["num_cached_tokens"].sum() > 0
    assert_same_requests(ref, fast)


def many_adapter_requests(seed: int, num_requests: int, num_adapters: int, rate_per_s: float):
    """Single requests over many adapters (skewed, as per-adapter rates in tiers are), with
    lognormal prompts and outputs, arriving faster than one replica serves them."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, num_adapters + 1)
    adapters = rng.choice(num_adapters, size=num_requests, p=weights / weights.sum())
    prompts = np.clip(np.rint(200 * np.exp(0.8 * rng.standard_normal(num_requests))), 1, 2000)
    outputs = np.clip(np.rint(60 * np.exp(0.8 * rng.standard_normal(num_requests))), 1, 500)
    arrivals = np.cumsum(rng.exponential(1 / rate_per_s, size=num_requests))
    return single_turn_workload(arrivals, prompts, outputs, adapters)


@pytest.mark.parametrize(("num_adapters", "max_loras", "max_cpu_loras", "num_kv_blocks"), [
    (64, 4, 64, None),  # many adapters over few slots, queue saturated
    (48, 8, 12, None),  # CPU cache smaller than the adapters: cold loads
    (200, 16, 32, 400),  # and a KV pool small enough to preempt
])
def test_fast_equals_reference_with_many_adapters_over_few_slots(num_adapters, max_loras,
                                                                  max_cpu_loras, num_kv_blocks):
    config = small_config("multi_lora", max_num_seqs=32, num_adapters=num_adapters,
                          max_loras=max_loras, max_cpu_loras=max_cpu_loras,
                          num_kv_blocks=num_kv_blocks)
    workload = many_adapter_requests(num_adapters, 400, num_adapters, rate_per_s=300.0)
    ref, fast = both_modes(config, workload)
    assert_same_requests(ref, fast)
    started = fast.requests.sort_values("submit_s")["first_scheduled_s"].to_numpy()
    assert (np.diff(started) < 0).any()  # a waiter whose adapter found no slot was passed over
    assert fast.timeseries["num_waiting"].max() > 50
    if num_kv_blocks is not None:
        assert fast.summary["num_preemptions"] > 0


def _walk_admit(self, plan, budget, now):
    """Admission as a walk of the whole waiting queue asking the slots about each waiter (the
    O(queue x slots) way the indexed admission replaces): the specification it must equal."""
    skipped = []
    while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
        seq = self.waiting.popleft()
        if not self.slots.can_activate(seq.adapter):
            skipped.append(seq)
            continue
        cost = self._try_admit(seq, plan, budget, now)
        if cost == 0:
            skipped.append(seq)
            break
        budget -= cost
    for seq in reversed(skipped):
        self.waiting.appendleft(seq)


@pytest.mark.parametrize("mode", ("reference", "fast"))
def test_indexed_admission_equals_walking_the_queue(monkeypatch, mode):
    config = small_config("multi_lora", max_num_seqs=24, num_adapters=96, max_loras=6,
                          max_cpu_loras=20, num_kv_blocks=300, mode=mode)
    workload = many_adapter_requests(5, 300, 96, rate_per_s=200.0)
    indexed = simulate(config, workload)
    monkeypatch.setattr(Engine, "_admit", _walk_admit)
    monkeypatch.setattr(Engine, "can_start_during_run", lambda self, seq: True)  # cut always
    walked = simulate(config, workload)
    assert indexed.summary["num_preemptions"] > 0
    if mode == "reference":  # the same steps: bitwise the same
        pd.testing.assert_frame_equal(indexed.requests, walked.requests, check_exact=True)
    else:  # every arrival cuts a decode run there, here only one that could start
        assert_same_requests(walked, indexed)
        assert indexed.stats["num_engine_events"] < walked.stats["num_engine_events"]


@pytest.mark.parametrize("runs", ("as chosen", "all listed", "all numpy"))
def test_fast_equals_reference_on_bench_multilora_above_capacity(runs, monkeypatch):
    # bench_multilora's own case, engine as the real run had it: 64 adapters of the agullo
    # runs over 16 slots, ShareGPT lengths, one Poisson process per adapter at 9 requests/s
    # (the configuration serves about 6/s): the queue grows and waiters are passed over.
    # Decode runs priced as the pricer chooses, or every one in plain floats, or every one in
    # numpy chunks.
    from bench import bench_multilora as bm

    if runs != "as chosen":
        monkeypatch.setattr(step_pricer, "MAX_LISTED_RUN_VALUES",
                            10**9 if runs == "all listed" else 0)
    cfg = bm.select(bm.load_run_configs(bm.data_file(bm.RUNS_CSV)), [(64, 16)])[0]
    lengths = bm.sharegpt_lengths(bm.data_file(bm.SHAREGPT_CSV))
    workload = bm.workload(cfg, lengths, 9.0, 300, seed=1)
    config = bm.sim_config(cfg, 8192)
    ref = simulate(config.model_copy(update={"mode": "reference"}), workload)
    fast = simulate(config, workload)
    assert_same_requests(ref, fast)
    assert fast.timeseries["num_waiting"].max() > 20
    started = fast.requests.sort_values("submit_s")["first_scheduled_s"].to_numpy()
    assert (np.diff(started) < 0).any()
    assert fast.stats["num_engine_events"] < ref.stats["num_engine_events"]


def test_fast_equals_reference_when_sum_compensates(monkeypatch):
    # From Python 3.12 `sum` of floats compensates its rounding, and a decode run's step times
    # are then summed per step by `sum` itself rather than by numpy's adds: that branch too.
    monkeypatch.setattr(run_pricing, "IS_SUM_SEQUENTIAL", False)
    config = small_config("multi_lora", max_num_seqs=8, num_kv_blocks=120, block_size=16)
    ref, fast = both_modes(config, conversations(7, arrival_rate_per_s=400.0, think_time_s=0.01))
    assert_same_requests(ref, fast)
