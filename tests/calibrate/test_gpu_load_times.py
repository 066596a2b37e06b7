"""Per-load adapter timings of agullo-dt's predictor_loading runs (server logs cut into the
repository's slice) and the host-cache load terms fitted on them."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from calibrate.fitter import fit_host_cache_loads
from calibrate.gpu_data.agullo_loads import LOADING, read_load_times, read_run_loads
from calibrate.gpu_data.base import GpuDataError
from calibrate.gpu_data.export import REPO_DATA
from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR, fit_disk_loads
from sim.cost.profile import load_profile

SLICE = REPO_DATA / "gpu" / "agullo-dt"
RUN = "llama-3.1-8b-instruct/adapter_rank_8/_8_"


@pytest.fixture(scope="module")
def loads():
    return read_load_times(SLICE)


def test_every_run_has_its_startup_disk_loads_and_benchmark_host_loads(loads):
    runs = {r.source_file for r in loads}
    assert len(runs) == 12 and len(loads) == 12 * 150
    for run in runs:
        mine = [r for r in loads if r.source_file == run]
        kinds = {k: sum(1 for r in mine if (r.source, r.phase) == k) for k in
                 [("disk", "startup"), ("host", "startup"), ("host", "benchmark")]}
        assert kinds == {("disk", "startup"): 50, ("host", "startup"): 50,
                         ("host", "benchmark"): 50}, run
    first = next(r for r in loads if r.source_file.endswith(f"{RUN}/server_out.loads.log"))
    # Line 1 of that log: "Total loads from disk: 1. Total loading time from disk:
    # 0.1743587760720402 seconds."
    assert (first.source, first.load_index, first.source_line) == ("disk", 1, 1)
    assert first.seconds == 0.1743587760720402


def test_benchmark_host_loads_give_upstream_activation_constants(loads):
    """Upstream's predictor_loading.py averaged the same loads into its constants files; the
    records' means must equal them."""
    for model in ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"):
        path = SLICE / f"predictor_loading_{model}_constants.json"
        table = json.loads(path.read_text(encoding="utf-8"))
        for max_rank, by_rank in table.items():
            for rank, ms in by_rank.items():
                mine = [r.seconds for r in loads if r.model == model and r.phase == "benchmark"
                        and (r.max_lora_rank, r.adapter_rank) == (int(max_rank), int(rank))]
                assert len(mine) == 50
                assert np.mean(mine) * 1e3 == pytest.approx(ms, rel=1e-9), (model, max_rank, rank)


def _broken_copy(tmp_path, old: bytes, new: bytes):
    folder = tmp_path / "agullo-dt" / LOADING / RUN
    folder.mkdir(parents=True)
    text = (SLICE / LOADING / RUN / "server_out.loads.log").read_bytes()
    assert old in text
    (folder / "server_out.loads.log").write_bytes(text.replace(old, new, 1))
    return folder / "server_out.loads.log", tmp_path / "agullo-dt"


def test_malformed_or_backward_lines_are_located_errors(tmp_path):
    log, root = _broken_copy(tmp_path, b"Total loads from disk: 2.", b"Total loads from disk: x.")
    with pytest.raises(GpuDataError, match=r"server_out.loads.log:3: number='x'"):
        read_run_loads(log, root)
    shutil.rmtree(root)
    log, root = _broken_copy(tmp_path, b"Total loads from memory: 2.",
                             b"Total loads from memory: 3.")
    with pytest.raises(GpuDataError, match=r"server_out.loads.log:4: memory loads='3, 0.0139"):
        read_run_loads(log, root)


def test_host_cache_fit_recovers_known_terms():
    overhead, per_gib = 0.04, 0.6
    rng = np.random.default_rng(0)
    sizes = rng.integers(10**7, 2 * 10**8, 40)
    loads = [dict(kind="disk", num_bytes=int(b), seconds=overhead + b / 2**30 * per_gib)
             for b in sizes] + [dict(kind="activate", num_bytes=10**6, seconds=0.007)] * 3
    coeffs, summary = fit_host_cache_loads(loads)
    assert coeffs["adapter_disk_load_overhead_s"] == pytest.approx(overhead, rel=1e-6)
    assert coeffs["adapter_disk_read_s_per_gib"] == pytest.approx(per_gib, rel=1e-6)
    assert summary["num_loads"] == 40 and summary["fit_mape"] < 1e-6
    assert fit_host_cache_loads(loads[-3:]) == ({}, {})  # no disk loads: nothing to fit


def test_shipped_profile_carries_the_disk_fit_of_the_slice():
    coeffs, summary = fit_disk_loads(SLICE)
    shipped = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml")
    for term, value in coeffs.items():
        assert getattr(shipped.coefficients, term) == pytest.approx(value, rel=1e-9), term
        assert term in shipped.fit.fitted_terms
    assert shipped.fit.adapter_loads["disk"]["num_loads"] == 300
    assert coeffs["adapter_disk_load_overhead_s"] > 0
