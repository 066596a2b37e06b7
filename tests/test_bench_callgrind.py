"""bench/callgrind_sim.py: the call it counts runs inside libc's qsort (where callgrind's
--toggle-collect finds it), and its digest tells results apart bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.callgrind_sim import result_digest, run_in_qsort  # noqa: E402


def test_the_call_runs_once_inside_qsort():
    calls = []
    run_in_qsort(lambda: calls.append(1))
    assert calls == [1]


def test_the_digest_is_the_same_for_equal_results_and_not_for_a_changed_bit():
    from sim_configs import small_config

    from sim.simulate import simulate
    from sim.workload.generate import punica_workload

    config = small_config("multi_lora", max_num_seqs=8)
    workload = punica_workload(np.random.default_rng(0), num_requests=20, num_adapters=4,
                               num_output_tokens=8, arrival_rate_per_s=50.0)
    first, second = simulate(config, workload), simulate(config, workload)
    assert result_digest(first) == result_digest(second)
    finish = second.requests["finish_s"].to_numpy().copy()
    finish[3] = np.nextafter(finish[3], np.inf)  # one last bit
    second.requests["finish_s"] = finish
    assert result_digest(first) != result_digest(second)


@pytest.mark.parametrize("hop", ("answer", "prefill"))
def test_text_columns_count_by_their_text(hop):
    # An object column's bytes are pointers: the digest reads its text instead.
    from types import SimpleNamespace

    import pandas as pd

    def result(value):
        return SimpleNamespace(requests=pd.DataFrame({"hop": [value]}), turns=pd.DataFrame())

    assert result_digest(result(hop)) == result_digest(result("".join(list(hop))))
    assert result_digest(result(hop)) != result_digest(result(hop + "x"))


def test_a_run_points_digest_sees_a_last_bit_and_not_the_wall_clock():
    from bench.callgrind_run import record_digest

    def record(done_s: float, wall_s: float) -> dict:
        turns = [dict(strategy="s", conv_id=0, done_s=1.5), dict(strategy="s", conv_id=1,
                                                                  done_s=done_s)]
        return dict(strategy="s", turns=turns, summary=dict(ttft_p50_s=0.25, wall_s=wall_s))

    assert record_digest(record(2.0, 1.0)) == record_digest(record(2.0, 9.0))
    assert record_digest(record(2.0, 1.0)) != record_digest(record(np.nextafter(2.0, 3.0), 1.0))
