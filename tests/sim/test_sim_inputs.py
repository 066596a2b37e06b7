"""Bad input fails before simulating with a located message; bounds stop runaway runs; real
trace files replay (Azure timestamps, Mooncake hash ids feeding the prefix cache, ServeGen)."""

import numpy as np
import pytest
from pydantic import ValidationError
from sim_configs import small_config

from sim.config import ClusterSpec, SimBounds
from sim.engine.replica import SimulationError
from sim.simulate import SimInputError, simulate
from sim.workload.generate import punica_workload, single_turn_workload
from sim.workload.traces import TRACES_DIR, TraceError, servegen_popularity, trace_workload


def one_request(prompt=100, output=10):
    return single_turn_workload([0.0], [prompt], [output], [0])


def test_request_longer_than_the_kv_pool_is_rejected():
    config = small_config("base", block_size=16, num_kv_blocks=10)
    with pytest.raises(SimInputError, match=r"reaches 170 tokens.*holds 160 tokens"):
        simulate(config, one_request(prompt=160, output=10))


def test_model_larger_than_the_gpu_is_rejected():
    config = small_config("base", model="llama-3.1-70b", gpu="H100-SXM")
    with pytest.raises(SimInputError, match="leaves no KV block"):
        simulate(config, one_request())


def test_zero_replicas_and_too_few_agent_replicas():
    with pytest.raises(ValidationError, match="num_replicas"):
        ClusterSpec(num_replicas=0)
    with pytest.raises(SimInputError, match="one replica per agent"):
        simulate(small_config("multi_agent", num_replicas=2), one_request())


def test_bounds_stop_the_run_with_a_clear_message():
    workload = punica_workload(np.random.default_rng(0), num_requests=50, num_adapters=4)
    config = small_config("base")
    with pytest.raises(SimulationError, match="max_engine_steps=20"):
        simulate(config.model_copy(update={"bounds": SimBounds(max_engine_steps=20)}), workload)
    short = config.model_copy(update={"bounds": SimBounds(max_simulated_time_s=0.05)})
    with pytest.raises(SimulationError, match=r"max_simulated_time_s=0.05 .* unfinished"):
        simulate(short, workload)


def test_trace_with_missing_columns_or_bad_rows_is_located(tmp_path):
    missing = tmp_path / "missing.csv"
    missing.write_text("timestamp,input_length\n0,10\n")
    with pytest.raises(TraceError, match=r"missing.csv:2: missing column\(s\) \['output_length'\]"):
        trace_workload(np.random.default_rng(0), missing, num_domains=2)
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,input_length,output_length\n0,10,5\n1,ten,5\n")
    with pytest.raises(TraceError, match=r"bad.csv:3: column 'input_length': 'ten'"):
        trace_workload(np.random.default_rng(0), bad, num_domains=2)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{oops\n')
    with pytest.raises(TraceError, match=r"broken.jsonl:2: not JSON"):
        trace_workload(np.random.default_rng(0), broken, num_domains=2, fmt="jsonl")


def test_azure_trace_replays_with_rate_scaling():
    path = TRACES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    kw = dict(num_domains=4, arrival_column="TIMESTAMP", input_column="ContextTokens",
              output_column="GeneratedTokens", time_unit="datetime", max_requests=200)
    base = trace_workload(np.random.default_rng(0), path, **kw)
    fast = trace_workload(np.random.default_rng(0), path, rate_scale=2.0, **kw)
    assert base.conv_arrival_s[0] == 0 and np.all(np.diff(base.conv_arrival_s) >= 0)
    np.testing.assert_allclose(fast.conv_arrival_s, base.conv_arrival_s / 2)
    assert base.turn_user_tokens[0] == 374  # first data row of the file


def test_mooncake_hash_ids_drive_prefix_cache_hits():
    path = TRACES_DIR / "mooncake_fast25" / "conversation_trace.jsonl"
    workload = trace_workload(np.random.default_rng(0), path, num_domains=1, fmt="jsonl",
                              hash_ids_column="hash_ids", time_unit="ms", max_requests=40,
                              length_scale=0.25, hash_block_tokens=128)
    result = simulate(small_config("base", max_num_seqs=64), workload)
    # Requests share leading hash ids (block 0 is common to most), so some prompt is reused.
    assert result.requests["num_cached_tokens"].sum() > 0


def test_servegen_popularity_is_skewed_and_sized():
    # The trace README: the busiest client averages about 351 req/s, the quietest 0.017.
    weights = servegen_popularity(43)
    assert weights.size == 43 and np.all(np.diff(weights) <= 0)
    assert weights[0] == pytest.approx(351, rel=0.01) and weights[-1] < 0.02


def test_an_unsorted_trace_is_sorted_before_it_is_cut(tmp_path):
    # Rows out of time order: the first two requests in time are the rows at t=0 and t=1,
    # wherever they sit in the file.
    path = tmp_path / "unsorted.csv"
    path.write_text("timestamp,input_length,output_length\n"
                    "5,500,50\n0,100,10\n3,300,30\n1,200,20\n", encoding="utf-8")
    cut = trace_workload(np.random.default_rng(0), path, num_domains=1, max_requests=2)
    assert cut.conv_arrival_s.tolist() == [0.0, 1.0]
    assert cut.turn_user_tokens.tolist() == [100, 200]
    whole = trace_workload(np.random.default_rng(0), path, num_domains=1)
    assert whole.turn_user_tokens.tolist() == [100, 200, 300, 500]
