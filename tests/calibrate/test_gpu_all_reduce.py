"""The per-TP-degree all-reduce fit on vidur's NCCL times (data/gpu/vidur slice): it recovers
known latencies and bandwidths, a bad all-reduce row is a located error, the shipped A100-80GB
and H100-SXM profiles carry a fit per degree with its source, and the Splitwise refits behave
as docs/validation-gpu.md says."""

from __future__ import annotations

import gzip
from dataclasses import replace

import numpy as np
import pytest

from calibrate.gpu_all_reduce import fit_all_reduce_table
from calibrate.gpu_data.base import GpuDataError
from calibrate.gpu_data.vidur import import_vidur
from calibrate.gpu_vidur_fit import PROFILE_NAMES, VIDUR_DIR, _one_node_all_reduces
from sim.cost.profile import PROFILES_DIR, load_profile
from sim.cost.tp_communication import AllReduceFit, all_reduce_s

H100_ALL_REDUCE = "raw/data/profiling/network/h100_dgx/all_reduce.csv.gz"
ROWS = _one_node_all_reduces(import_vidur(VIDUR_DIR).records["collective_time"], "h100_dgx")
TRUTH = {2: (9e-6, 3.1e11), 4: (31e-6, 2.4e11), 8: (35e-6, 1.9e11)}


def test_fit_recovers_known_latency_and_bandwidth_per_degree():
    synthetic = []
    for r in ROWS:
        latency, bandwidth = TRUTH[r.num_workers]
        truth = AllReduceFit(tensor_parallel_size=r.num_workers, interconnect="nvlink",
                             latency_s=latency, bandwidth_bytes_per_s=bandwidth, source="truth")
        synthetic.append(replace(r, median_ms=float(all_reduce_s(truth, r.size)) * 1e3))
    table = fit_all_reduce_table(synthetic, "h100_dgx", "nvlink", "synthetic")
    assert [f.tensor_parallel_size for f in table.fits] == [2, 4, 8]
    for fit in table.fits:
        latency, bandwidth = TRUTH[fit.tensor_parallel_size]
        assert fit.latency_s == pytest.approx(latency, rel=1e-3)
        assert fit.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=1e-3)
    assert all(row["mape"] < 1e-4 for row in table.errors)


def test_no_rows_is_an_error_naming_the_network():
    with pytest.raises(ValueError, match="h100_dgx"):
        fit_all_reduce_table([], "h100_dgx", "nvlink", "none")


def test_a_bad_all_reduce_row_is_a_located_error(tmp_path):
    lines = gzip.decompress((VIDUR_DIR / H100_ALL_REDUCE).read_bytes()).split(b"\n")
    assert lines[1].split(b",")[8] == b"2048"  # line 2's size column
    fields = lines[1].split(b",")
    fields[8] = b"0"
    lines[1] = b",".join(fields)
    target = tmp_path / "vidur" / H100_ALL_REDUCE
    target.parent.mkdir(parents=True)
    target.write_bytes(gzip.compress(b"\n".join(lines)))
    with pytest.raises(GpuDataError, match=r"all_reduce.csv.gz:2: size='0'"):
        import_vidur(tmp_path / "vidur")


@pytest.mark.parametrize("gpu", sorted(PROFILE_NAMES))
def test_shipped_profiles_price_tp_2_4_8_by_their_own_vidur_fit(gpu):
    profile = load_profile(PROFILES_DIR / f"{PROFILE_NAMES[gpu]}.yaml")
    fits = profile.coefficients.all_reduce_fits
    assert [(f.tensor_parallel_size, f.interconnect) for f in fits] == [
        (2, "nvlink"), (4, "nvlink"), (8, "nvlink")]
    assert all("vidur@7d475133" in f.source and "994 rows" in f.source for f in fits)
    assert "all_reduce_fits" in profile.fit.fitted_terms
    train = {r.group: r for r in profile.fit.errors if r.split == "train"}
    network = "a100_dgx" if gpu == "A100-80GB" else "h100_dgx"
    # Band: one latency + bandwidth per degree within 20% MAPE of vidur's 994 sizes.
    assert all(train[f"vidur_all_reduce_by_tp:{network}:tp{n}"].mape < 0.20 for n in (2, 4, 8))


def test_splitwise_refits_constant_latency_misses_tp8_per_gpu_latency_reaches_it():
    from calibrate.gpu_splitwise import splitwise_section

    coeffs = {gpu: load_profile(PROFILES_DIR / f"{name}.yaml").coefficients
              for gpu, name in PROFILE_NAMES.items()}
    section = splitwise_section(coeffs, PROFILE_NAMES)
    assert len(section["tp_refit"]) == 2 * len(PROFILE_NAMES)
    for fit in section["tp_refit"]:
        tp8 = next(r for r in fit["summary"] if r["tp"] == 8 and r["phase"] == "token")
        assert fit["fit_tp"] == [2, 4]
        if not fit["per_gpu"]:
            assert tp8["median_error"] < -0.1  # one latency per all-reduce: TP 8 too fast
        else:
            # Band of the held-out TP 8 token steps under a + b x TP fitted on TP 2 and 4.
            assert abs(tp8["median_error"]) < 0.2 and np.isfinite(fit["latency_per_gpu_s"])


def test_the_dashboards_coefficient_table_lists_each_fitted_value_as_a_number():
    import pyarrow as pa

    from planner.jobs.dashboard import pricing
    from planner.scenario.loading import load_scenario
    from sim.cost.profile import PROFILES_DIR as profiles

    scenarios = profiles.parents[1] / "scenarios"
    priced = pricing(load_scenario(scenarios / "sim_mooncake_punica.yaml"), scenarios)
    assert priced["profile"] == PROFILE_NAMES["H100-SXM"]
    table = priced["coefficients"]
    rows = table[table.coefficient.str.startswith("all_reduce_fits[")]
    assert list(rows.coefficient)[:2] == ["all_reduce_fits[tp=2, nvlink].latency_s",
                                          "all_reduce_fits[tp=2, nvlink].bandwidth_bytes_per_s"]
    assert len(rows) == 6 and all(isinstance(v, float) for v in rows.value)
    pa.Table.from_pandas(table)  # what st.dataframe converts it with
