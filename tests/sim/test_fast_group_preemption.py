"""A step that must preempt keeps the decode group (`Engine._schedule_group_preempting`): the
same simulation, bit for bit, as dissolving the group and walking the batch, on the multi-LoRA
workloads where preemption is common (many adapters over few slots, a tight KV pool, a queue
that grows)."""

import numpy as np
import pandas as pd
import pytest
from sim_configs import small_config
from test_sim_fast_path import assert_same_requests, many_adapter_requests

from sim.engine.scheduler import Engine
from sim.simulate import simulate


def _counting(monkeypatch, name: str) -> list:
    calls = []
    original = getattr(Engine, name)

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(Engine, name, counted)
    return calls


@pytest.mark.parametrize(("num_adapters", "max_loras", "num_kv_blocks", "caching"), [
    (64, 4, 300, False),
    (200, 16, 400, True),
    (8, 8, 250, True),
])
def test_preempting_with_the_group_equals_walking_the_batch(monkeypatch, num_adapters, max_loras,
                                                            num_kv_blocks, caching):
    config = small_config("multi_lora", max_num_seqs=32, num_adapters=num_adapters,
                          max_loras=max_loras, max_cpu_loras=num_adapters,
                          num_kv_blocks=num_kv_blocks, enable_prefix_caching=caching,
                          mode="reference")
    workload = many_adapter_requests(num_adapters, 300, num_adapters, rate_per_s=300.0)
    kept = _counting(monkeypatch, "_schedule_group_preempting")
    grouped = simulate(config, workload)
    assert grouped.summary["num_preemptions"] > 0 and len(kept) > 0
    monkeypatch.setattr(Engine, "_schedule_group", lambda self, plan, budget: None)
    walked = simulate(config, workload)
    pd.testing.assert_frame_equal(grouped.requests, walked.requests, check_exact=True)
    # and the fast path, which keeps the group too, still gives the reference's requests
    monkeypatch.undo()
    fast = simulate(config.model_copy(update={"mode": "fast"}), workload)
    assert_same_requests(grouped, fast)


@pytest.mark.parametrize("grid", [(16, 16), (320, 16)])
def test_bench_multilora_workload_keeps_the_group_through_preemptions(monkeypatch, grid):
    # Llama-3.1-8B on an H100 with 2048 sequences of ShareGPT lengths over 16 adapters in 16
    # slots, or 320 adapters over 16 slots, at 60 requests/s (bench_multilora's 16a/16s and
    # 320a/16s serve about 6/s), 300 requests, KV cut to 2,500 blocks.
    from bench import bench_multilora as bm

    cfg = bm.select(bm.load_run_configs(bm.data_file(bm.RUNS_CSV)), [grid])[0]
    lengths = bm.sharegpt_lengths(bm.data_file(bm.SHAREGPT_CSV))
    workload = bm.workload(cfg, lengths, 60.0, 300, seed=1)
    config = bm.sim_config(cfg, 8192)
    config = config.model_copy(update={"engine": config.engine.model_copy(
        update={"num_kv_blocks": 2500})})
    dissolved = _counting(monkeypatch, "_schedule_running")
    ref = simulate(config.model_copy(update={"mode": "reference"}), workload)
    fast = simulate(config, workload)
    assert ref.summary["num_preemptions"] > 0
    assert_same_requests(ref, fast)
    assert len(dissolved) < 0.5 * ref.summary["num_preemptions"]
    assert np.isfinite(fast.requests["finish_s"]).all()


def test_group_run_arrays_are_its_rows(monkeypatch):
    # The block bound of a decode run reads the group's kept offsets and ends: at every bound
    # that needs the rows (KV short for the run), they must be the rows read off the members.
    from sim.engine.decode_group import DecodeGroup

    checked = []
    run_arrays = DecodeGroup.run_arrays

    def checking(self):
        arrays = run_arrays(self)
        expected = np.array(self.rows(), dtype=np.int64).T
        assert all(np.array_equal(a, e) and a.dtype == e.dtype
                   for a, e in zip(arrays, expected, strict=True))
        checked.append(len(self.members))
        return arrays

    monkeypatch.setattr(DecodeGroup, "run_arrays", checking)
    config = small_config("multi_lora", max_num_seqs=32, num_adapters=16, max_loras=8,
                          num_kv_blocks=300, enable_prefix_caching=False)
    simulate(config, many_adapter_requests(3, 300, 16, rate_per_s=300.0))
    assert len(checked) > 20 and max(checked) > 5
