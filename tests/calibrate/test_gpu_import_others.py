"""vidur, llmservingsim, Splitwise and memory-gap importers on the repository's slices
(data/gpu/...): rows checked by hand against the upstream files, located errors on broken
copies, exit 2 on missing folders, the step-sample converters."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.gpu_data.base import GpuDataError
from calibrate.gpu_data.export import REPO_DATA, import_dataset
from calibrate.gpu_data.llmservingsim import import_llmservingsim
from calibrate.gpu_data.memory_gap import import_memory_gap
from calibrate.gpu_data.splitwise import import_splitwise
from calibrate.gpu_data.steps import phase_decode_step_samples, splitwise_step_samples
from calibrate.gpu_data.vidur import import_vidur

GPU = REPO_DATA / "gpu"
VIDUR_H100 = "raw/data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv.gz"
LSS_LAYERS = "raw/profiler/v0/perf_models/H100/meta-llama/Llama-3.1-8B/tp1/layers.csv.gz"
RUN_64 = "raw/benchmarks/definitive_results/advisor/output_length/_130/llama-2-7b/_64__2000"


def _line(records, file_end: str, line: int):
    return [r for r in records if r.source_file.endswith(file_end) and r.source_line == line]


def test_vidur_operator_and_collective_rows():
    result = import_vidur(GPU / "vidur")
    ops = {r.operator: r for r in _line(result.records["operator_time"], VIDUR_H100, 2)}
    assert len(ops) == 10  # ten operators per row
    up = ops["mlp_up_proj"]  # line 2: Llama-2-7B geometry, 4096 tokens, TP 1, median 0.987 ms
    assert (up.gpu, up.model, up.num_tokens, up.num_tensor_parallel_workers) == (
        "h100", "meta-llama/Llama-2-7b-hf", 4096, 1)
    assert (up.n_embd, up.n_expanded_embd, up.use_gated_mlp, up.median_ms) == (
        4096, 11008, True, 0.987)
    (ar,) = _line(result.records["collective_time"], "h100_dgx/all_reduce.csv.gz", 2)
    assert (ar.num_workers, ar.size, ar.mean_ms, ar.median_ms) == (8, 2048, 0.03, 0.037)
    assert {r.gpu for r in result.records["operator_time"]} == {"a100", "h100"}


def test_llmservingsim_layer_and_attention_rows():
    result = import_llmservingsim(GPU / "llmservingsim-profiles")
    (q,) = _line(result.records["layer_time"], LSS_LAYERS, 4)  # q_proj,1,0,1,16078 (ns)
    assert (q.layer, q.num_tokens, q.kv_cache_tokens, q.time_us) == ("q_proj", 1, 0, 16.078)
    assert (q.hardware, q.engine, q.tensor_parallel) == ("H100", "", 1)
    (act,) = _line(result.records["layer_time"], "tp1/dense.csv.gz", 2)  # act_fn,1,2.592
    assert (act.layer, act.time_us, act.engine, act.hardware) == (
        "act_fn", 2.592, "vllm 0.19.0", "RTX4090")
    (att,) = _line(result.records["attention_time"], "tp1/attention.csv.gz", 2)
    assert (att.prefill_chunk, att.n_decode, att.kv_decode, att.time_us) == (0, 1, 16, 9.31067)


def test_splitwise_rows_and_step_samples():
    result = import_splitwise(GPU / "splitwise")
    first = result.records["phase_time"][0]  # line 2 of the upstream CSV
    assert (first.model, first.hardware, first.tensor_parallel, first.prompt_size,
            first.batch_size, first.token_size) == ("llama2-70b", "a100-80gb", 2, 512, 1, 128)
    assert first.token_time_ms == pytest.approx(54.87951193752838) and first.source_line == 2
    assert len(result.records["phase_time"]) == 1260
    prefill, decode = splitwise_step_samples([first])
    assert prefill.num_new_tokens == (512,) and prefill.measured_s == pytest.approx(0.19625322)
    assert decode.num_context_tokens == (576,) and decode.is_prompt == (False,)


def test_memory_gap_runs_intervals_and_phases():
    result = import_memory_gap(GPU / "memory-gap")
    runs = {r.run_id.rsplit("/", 1)[1]: r for r in result.records["serving_run"]}
    run = runs["_64__2000"]
    assert (run.max_num_seqs, run.gpu_blocks, run.output_len, run.enable_lora) == (
        64, 5671, 130, False)
    assert run.request_throughput == pytest.approx(22.231836515561678)
    assert run.engine == "vllm 0.5.2.dev1210+g6f078ea3c" and run.gpu == "H100-64GB"
    assert result.excluded == {"advisor runs with no result": 1}  # _512__2000 printed none
    (interval,) = _line(result.records["forward_interval"], f"{RUN_64}/metrics_engine.csv.gz", 4)
    assert interval.forward_s == pytest.approx(1.137236276641488 - 0.14061271073296666)
    assert interval.interval_s == pytest.approx(2.2521846210584044 - 1.2520779410842806)
    phases = {r.model: r for r in result.records["phase_timing"]}
    opt = phases["opt-2.7b"]
    assert (opt.batch_size, opt.prompt_len, opt.output_len, opt.source_line) == (256, 161, 338, 381)
    assert (opt.prefill_s, opt.decode_s) == (0.592889650259167, 12.56689507747069)
    assert (opt.num_decode_lines, opt.total_gpu_memory_gib, opt.kv_cache_gib) == (337, 63.43, 50.16)
    (step,) = phase_decode_step_samples([opt])
    assert len(step.num_new_tokens) == 256
    assert step.measured_s == pytest.approx(12.56689507747069 / 337)


def _gz_copy_with(source: Path, target: Path, line: int, old: bytes, new: bytes) -> None:
    lines = gzip.decompress(source.read_bytes()).split(b"\n")
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(b"\n".join(lines)))


def test_malformed_rows_give_located_errors(tmp_path):
    root = tmp_path / "splitwise"
    _gz_copy_with(GPU / "splitwise/splitwise_perf_model.csv.gz",
                  root / "splitwise_perf_model.csv.gz", 3, b"a100-80gb", b"tpu-v5")
    with pytest.raises(GpuDataError, match=r"csv.gz:3: hardware='tpu-v5': allowed: a100-80gb"):
        import_splitwise(root)
    root = tmp_path / "vidur"
    _gz_copy_with(GPU / "vidur" / VIDUR_H100, root / VIDUR_H100, 5, b",True,", b",maybe,")
    with pytest.raises(GpuDataError, match=r"mlp.csv.gz:5: use_gated_mlp='maybe'"):
        import_vidur(root)
    root = tmp_path / "lss"
    _gz_copy_with(GPU / "llmservingsim-profiles" / LSS_LAYERS, root / LSS_LAYERS, 3,
                  b"input_layernorm,1,0,1,", b"input_layernorm,1,0,2,")
    with pytest.raises(GpuDataError, match=r"layers.csv.gz:3: tp_size='2': 1 \(the tp folder\)"):
        import_llmservingsim(root)
    root = tmp_path / "memory-gap"
    shutil.copytree(GPU / "memory-gap" / RUN_64, root / RUN_64)
    _gz_copy_with(GPU / "memory-gap" / RUN_64 / "metrics_engine.csv.gz",
                  root / RUN_64 / "metrics_engine.csv.gz", 9, b"", b"x")
    with pytest.raises(GpuDataError, match=r"metrics_engine.csv.gz:9: time \[s\]='x"):
        import_memory_gap(root)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calibrate.gpu_data", *args],
                          cwd=REPO_DATA.parent, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("dataset", ["vidur", "llmservingsim-profiles", "splitwise",
                                     "memory-gap"])
def test_missing_or_incomplete_dataset_folder_exits_2(tmp_path, dataset):
    done = _cli(dataset, "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert f"{dataset}: no dataset folder under" in done.stderr
    place = "perf" if dataset == "splitwise" else f"gpu/{dataset}"
    (tmp_path / place).mkdir(parents=True)
    done = _cli(dataset, "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "is incomplete" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()


def test_the_slices_are_the_default_data_root(monkeypatch):
    monkeypatch.delenv("MOLCAP_DATA_DIR", raising=False)
    assert import_dataset("splitwise").summary() == "splitwise: phase_time 1,260"


def test_molcap_calibrate_import_command(tmp_path):
    from typer.testing import CliRunner

    from app.cli import app

    runner = CliRunner()
    done = runner.invoke(app, ["calibrate", "import", "splitwise", "--data-dir", str(REPO_DATA),
                               "--out", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert "splitwise: phase_time 1,260" in done.output
    assert (tmp_path / "o" / "phase_time.parquet").exists()
    done = runner.invoke(app, ["calibrate", "import", "vidur", "--data-dir",
                               str(tmp_path / "none"), "--out", str(tmp_path / "p")])
    assert done.exit_code == 2 and "does not exist" in done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)
