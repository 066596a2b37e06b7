"""Exact timelines on hand-computable cases: the test lists the batches the engine must form and
prices each with `predict_step`; the simulated timestamps must be their running sums."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.cost.cost_model import create_step_batch, predict_step
from sim.simulate import create_profile, simulate
from sim.workload.generate import single_turn_workload

MODES = ("reference", "fast")


def step(config, items, num_routing_decisions=0):
    """Seconds of one step; items: (new tokens, context, adapter, samples) per sequence."""
    new, ctx, ids, samples = zip(*items, strict=True)
    profile = create_profile(config)
    batch = create_step_batch(new, ctx, num_layers=profile.num_layers, adapter_ids=ids,
                              is_last_chunk=samples,
                              num_routing_decisions=num_routing_decisions)
    return predict_step(config.coeffs, profile, batch).total_s


def load_s(config):
    """Seconds to load one adapter over PCIe (charged to the step that admits it)."""
    return config.strategy.adapters[0].num_bytes_per_gpu / config.gpu.pcie_bandwidth_bytes_per_s


def run(config, prompts, outputs, domains=None, arrivals=None):
    n = len(prompts)
    workload = single_turn_workload(np.zeros(n) if arrivals is None else arrivals, prompts,
                                    outputs, np.zeros(n, int) if domains is None else domains)
    return simulate(config, workload, timeseries_interval_s=0.0)


@pytest.mark.parametrize("mode", MODES)
def test_one_request_prefill_then_decodes(mode):
    config = small_config("multi_lora", mode=mode)
    result = run(config, [100], [4])
    # Step 1 prefills 100 tokens and samples token 1; steps 2-4 decode at contexts 100, 101, 102.
    t1 = step(config, [(100, 0, 0, True)]) + load_s(config)
    decodes = [step(config, [(1, c, 0, True)]) for c in (100, 101, 102)]
    row = result.requests.iloc[0]
    assert row.first_token_s == pytest.approx(t1, rel=1e-12)
    assert row.finish_s == pytest.approx(t1 + sum(decodes), rel=1e-12)
    assert result.turns.iloc[0].tpot_s == pytest.approx(sum(decodes) / 3, rel=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_two_requests_share_a_batch(mode):
    config = small_config("multi_lora", mode=mode)
    result = run(config, [50, 30], [3, 2], domains=[0, 1])
    # Step 1: both prefill together. Step 2: both decode (A at 50, B at 30); B is done.
    # Step 3: A decodes alone at 51.
    t1 = step(config, [(50, 0, 0, True), (30, 0, 1, True)]) + 2 * load_s(config)
    t2 = t1 + step(config, [(1, 50, 0, True), (1, 30, 1, True)])
    t3 = t2 + step(config, [(1, 51, 0, True)])
    a, b = result.requests.itertuples()
    assert (a.first_token_s, b.first_token_s) == pytest.approx((t1, t1), rel=1e-12)
    assert (a.finish_s, b.finish_s) == pytest.approx((t3, t2), rel=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_chunked_prefill_splits_the_prompt(mode):
    config = small_config("base", mode=mode, max_num_seqs=8, max_num_batched_tokens=64)
    result = run(config, [100], [2])
    # 100 prompt tokens over a 64-token budget: chunks of 64 (no sample) then 36 at context 64.
    t1 = step(config, [(64, 0, -1, False)]) + step(config, [(36, 64, -1, True)])
    t2 = t1 + step(config, [(1, 100, -1, True)])
    row = result.requests.iloc[0]
    assert (row.first_token_s, row.finish_s) == pytest.approx((t1, t2), rel=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_preemption_recomputes_the_latest_request(mode):
    # 6 blocks of 4 tokens. A and B prefill 8 tokens each (2 blocks each), then each needs a
    # third block at its first decode (context 8 -> 9 tokens): 6 blocks used. At context 12 A
    # needs a fourth block: B (admitted last) is preempted and later recomputes 8 + 5 tokens.
    config = small_config("base", mode=mode, block_size=4, num_kv_blocks=6, max_num_seqs=4,
                          max_num_batched_tokens=64)
    result = run(config, [8, 8], [6, 6])
    a, b = result.requests.itertuples()
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    # B had sampled 5 tokens (1 at prefill + 4 decodes at contexts 8..11) when preempted, so
    # its recompute prefills prompt + generated = 13 tokens.
    assert b.num_prefill_tokens_computed == 8 + 13
    t = step(config, [(8, 0, -1, True), (8, 0, -1, True)])
    for ctx in (8, 9, 10, 11):
        t += step(config, [(1, ctx, -1, True), (1, ctx, -1, True)])
    t += step(config, [(1, 12, -1, True)])  # A alone: B was preempted at this boundary
    assert a.finish_s == pytest.approx(t, rel=1e-12)
    # B resumes once A has finished and released its blocks: recompute, then its last token.
    t += step(config, [(13, 0, -1, True)])
    assert b.finish_s == pytest.approx(t, rel=1e-12)
    assert result.stats["kv_blocks_in_use_at_end"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_late_arrival_joins_at_the_next_step_boundary(mode):
    config = small_config("base", mode=mode)
    d1 = step(config, [(20, 0, -1, True)])
    d2 = step(config, [(1, 20, -1, True)])
    arrival = d1 + 0.5 * d2  # B arrives during A's first decode step
    result = run(config, [20, 10], [5, 2], arrivals=[0.0, arrival])
    b = result.requests.iloc[1]
    assert b.first_scheduled_s == pytest.approx(d1 + d2, rel=1e-12)
    t_b = d1 + d2 + step(config, [(1, 21, -1, True), (10, 0, -1, True)])
    assert b.first_token_s == pytest.approx(t_b, rel=1e-12)
