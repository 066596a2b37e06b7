"""agullo-dt importer on the repository's slice (data/gpu/agullo-dt): values checked by hand
against the upstream files, located errors on broken copies, exit 2 on missing folders."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from calibrate.gpu_data.agullo import ESTIMATORS, import_agullo
from calibrate.gpu_data.agullo_records import adapter_classes
from calibrate.gpu_data.agullo_steps import decode_step_samples
from calibrate.gpu_data.base import GpuDataError
from calibrate.gpu_data.export import REPO_DATA

SLICE = REPO_DATA / "gpu" / "agullo-dt"
REPO = REPO_DATA.parent
TEST_RUN = ("br/ml_modelling/test_dataset/llama-3.1-8b-instruct/"
            "rate_0.05-0.0125-0.003125_size_8-8-16/_128_128_16_")
OVERHEAD = f"{ESTIMATORS}/predictor_latency_overhead/llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def result():
    return import_agullo(SLICE)


def test_runs_summary_row_is_read_with_its_configuration_and_metrics(result):
    run = next(r for r in result.records["serving_run"] if r.run_id == TEST_RUN)
    # runs_summary.csv line 2: max_loras 128, max_cpu_loras 128, rank 16, rates 0.05 0.0125
    # 0.003125 with counts '0.003125 0.0125 0.05 | 42 43 43', 2.84 req/s, TPOT p50 22.25 ms
    assert (run.max_loras, run.max_cpu_loras, run.max_lora_rank, run.max_num_seqs) == (
        128, 128, 16, 2048)
    assert run.adapter_rates == (0.05, 0.0125, 0.003125)
    assert run.adapter_rate_counts == (43, 43, 42)
    assert run.lora_module_ranks == (8, 8, 16)
    assert adapter_classes(run) == [(0.05, 8, 43), (0.0125, 8, 43), (0.003125, 16, 42)]
    assert (run.request_throughput, run.median_tpot_ms, run.p99_ttft_ms) == (2.84, 22.25, 376.47)
    assert run.window_s == 3600.0 and run.is_window_result
    assert (run.source_file, run.source_line) == ("derived/runs_summary.csv.gz", 2)
    assert result.excluded["runs_summary rows with no result (run failed or unfinished)"] == 311


def test_raw_test_runs_match_the_derived_table(result):
    summary = {r.run_id: r for r in result.records["serving_run"]}
    raw = result.records["test_run"]
    assert len(raw) == 21 and result.excluded["test_dataset runs with no result"] == 3
    fields = ("model", "max_loras", "max_cpu_loras", "max_lora_rank", "max_num_seqs",
              "adapter_rates", "adapter_rate_counts", "num_adapters", "lora_module_ranks",
              "window_s", "completed_requests",
              "request_throughput", "median_ttft_ms", "p99_tpot_ms", "mean_itl_ms")
    for run in raw:
        assert run.source_file.endswith(".out")
        assert {f: getattr(run, f) for f in fields} == {
            f: getattr(summary[run.run_id], f) for f in fields}


def test_latency_overhead_curve_from_the_result_files(result):
    runs = {r.run_id: r for r in result.records["sweep_run"]}
    base = runs[f"est/{OVERHEAD.split('/', 3)[3]}/initial_points_small/output/_220__1_100"]
    assert not base.enable_lora and round(base.mean_tpot_ms, 1) == 17.1
    curve = {r.restrict_loras: round(r.mean_tpot_ms, 1) for r in runs.values()
             if "overhead_small" in r.run_id and r.output_len == 100}
    assert {k: curve[k] for k in (1, 32, 128, 300)} == {1: 35.4, 32: 45.7, 128: 69.9, 300: 86.6}
    one = runs[f"est/{OVERHEAD.split('/', 3)[3]}/overhead_small/output/_220_300_8__1_100_1"]
    assert (one.max_num_seqs, one.max_loras, one.max_lora_rank, one.num_prompts) == (
        220, 300, 8, 4096)
    assert one.source_file.endswith("openai-infqps-llama-3.1-8b-instruct-20250531-173906.json")


def test_decode_sweeps_become_step_samples(result):
    samples = decode_step_samples(result.records["sweep_run"])
    by_run = {s.tags["run_id"].rsplit("/", 1)[1]: s for s in samples}
    lora = by_run["_220_300_8__1_100_32"]
    assert len(lora.num_new_tokens) == 220 and set(lora.num_new_tokens) == {1}
    assert len(set(lora.adapter_ids)) == 32 and all(lora.is_adapted)
    assert lora.measured_s == pytest.approx(0.0457083, rel=1e-5)
    assert max(lora.num_context_tokens) < 5 + 100 and min(lora.num_context_tokens) == 5
    base = by_run["_220__1_100"]
    assert set(base.adapter_ids) == {-1} and not any(base.is_adapted)
    assert not any("input" in s.tags["run_id"] for s in samples)  # prefill sweeps: no steps


def test_adapter_loads_memory_probes_and_step_trace(result):
    loads = {(r.max_lora_rank, r.adapter_rank): r for r in result.records["adapter_load"]}
    assert loads[(32, 8)].mean_load_ms == pytest.approx(8.076073373667896)
    assert loads[(32, 8)].source_line == 3 and loads[(8, 8)].source_line == 12
    probes = {(p.model, p.max_loras, p.max_lora_rank): p for p in result.records["memory_probe"]}
    assert probes[("llama-3.1-8b-instruct", 128, 16)].gpu_kv_cache_tokens == 212032
    assert not probes[("llama-3.1-8b-instruct", 128, 32)].has_result
    step = result.records["scheduler_step"][0]
    assert (step.step_idx, step.interval_ms, step.scheduler_time_ms, step.source_line) == (
        0, None, pytest.approx(0.0958), 2)
    assert step.run_id.startswith("est/predictor_latency_overhead/llama-3.1-8b-instruct/")


def _broken_summary(tmp_path: Path, line: int, old: bytes, new: bytes) -> Path:
    root = tmp_path / "agullo-dt"
    (root / "derived").mkdir(parents=True)
    shutil.copyfile(SLICE / "LICENSE", root / "LICENSE")
    lines = gzip.decompress((SLICE / "derived/runs_summary.csv.gz").read_bytes()).split(b"\n")
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    (root / "derived/runs_summary.csv").write_bytes(b"\n".join(lines))
    return root


def test_a_malformed_summary_row_names_file_line_field_and_value(tmp_path):
    root = _broken_summary(tmp_path, 3, b",3.57,", b",fast,")
    with pytest.raises(GpuDataError) as err:
        import_agullo(root)
    assert str(err.value).startswith("derived/runs_summary.csv:3: request_throughput='fast'")


def test_an_unknown_run_kind_is_refused(tmp_path):
    root = _broken_summary(tmp_path, 4, b",real,", b",simulated,")
    with pytest.raises(GpuDataError, match=r"runs_summary.csv:4: kind='simulated': allowed: real"):
        import_agullo(root)


def test_a_malformed_launcher_or_log_is_located(tmp_path):
    run = SLICE / OVERHEAD / "overhead_small/output/_220_300_8__1_100_1"
    root = tmp_path / "agullo-dt"
    target = root / OVERHEAD / "overhead_small/output/_220_300_8__1_100_1"
    shutil.copytree(run, target)
    launcher = (target / "launcher.sh").read_text()
    (target / "launcher.sh").write_text(launcher.replace("--max-loras='300'", "--max-loras='x'"))
    with pytest.raises(GpuDataError, match=r"_1/launcher.sh:\d+: --max-loras='x'"):
        import_agullo(root)
    test_run = next((SLICE / "raw/benchmarks").rglob("log_*.out")).parent
    rel = test_run.relative_to(SLICE)
    shutil.rmtree(root / "raw/digital_twin_dynamic")
    shutil.copytree(test_run, root / rel)
    log = next((root / rel).glob("log_*.out"))
    log.write_text("\n".join(x for x in log.read_text().splitlines() if "P99 ITL" not in x))
    with pytest.raises(GpuDataError, match=r"log_\d+\.out:\d+: result block=.*no P99 ITL"):
        import_agullo(root)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calibrate.gpu_data", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_cli_missing_or_incomplete_folder_exits_2_with_one_line(tmp_path):
    done = _cli("agullo-dt", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "does not exist" in done.stderr
    (tmp_path / "gpu" / "agullo-dt").mkdir(parents=True)
    done = _cli("agullo-dt", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "incomplete" in done.stderr and "derived/runs_summary.csv" in done.stderr
    assert not (tmp_path / "o").exists()


def test_cli_writes_parquet_and_csv_with_a_summary_line(tmp_path):
    root = tmp_path / "gpu" / "agullo-dt"
    shutil.copytree(SLICE / ESTIMATORS / "predictor_loading",
                    root / ESTIMATORS / "predictor_loading")
    done = _cli("agullo-dt", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("agullo-dt: sweep_run 6, engine_sample 0, adapter_load 6, "
                                  "adapter_load_time 1,800;")
    times = pd.read_parquet(tmp_path / "o" / "adapter_load_time.parquet")
    assert len(times) == 1800 and set(times.source) == {"disk", "host"}
    loads = pd.read_parquet(tmp_path / "o" / "adapter_load.parquet")
    assert list(loads.mean_load_ms.round(3)) == list(
        pd.read_csv(tmp_path / "o" / "adapter_load.csv").mean_load_ms.round(3))
    assert loads.max_lora_rank.dtype == "int64" and len(loads) == 6
