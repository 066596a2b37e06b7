"""The validation replays' own engine steps, priced one by one: is a latency error the cost
model's price of the steps the engine ran, or what the simulator scheduled around them?

During each validation run the step timer records every engine step (`replay_steps`); here each
recorded step is priced by `predict_step` under the profile being validated, exactly as a
fitting probe's step is, and compared with what it took. A workload whose steps are priced
right while its TPOT is not points at the scheduling (batches the simulator forms differently)
or at host work between steps; mispriced steps point at the cost model, or at an engine state
the fitting probes did not reach.
"""

from __future__ import annotations

import numpy as np

from calibrate.fitter import predict_samples, step_kind
from calibrate.recorder import StepSample, samples_from_vllm_steps


def replay_steps(timings, *, group: str, prefill_only_ids: set[int]) -> dict:
    """Step samples of one replay (JSON-ready), and each step's seconds inside the model
    runner (execute_model to sampled tokens, adapter loads out): the rest of a sample's
    seconds, to the next step's start, is the engine loop's host work (scheduling, output
    handling, requests added between steps)."""
    samples = samples_from_vllm_steps(timings, group=group, prefill_only_ids=prefill_only_ids,
                                      tags={}, clock="cpu")
    runner_s = [t.cpu_end_s - t.cpu_start_s - t.adapter_load_cpu_s for t in timings]
    return dict(samples=[s.to_json() for s in samples], runner_s=runner_s)


def _kind_row(kind: str, measured: np.ndarray, predicted: np.ndarray) -> dict:
    return dict(kind=kind, num_steps=int(measured.size),
                measured_median_s=float(np.median(measured)),
                median_error=float(np.median(predicted / measured - 1)),
                total_error=float(predicted.sum() / measured.sum() - 1))


def check_steps(runs: list[dict], coeffs, profiles) -> dict:
    """Pricing error of the steps of `runs` (each a `replay_steps` dict) per kind of step
    ("decode", and "prefill+mixed"): median of predicted / measured - 1 over the steps and the
    error of their total; and the share of the step time spent outside the model runner."""
    samples = [StepSample.from_json(s) for run in runs for s in run["samples"]]
    if not samples:
        return {}
    measured = np.array([s.measured_s for s in samples])
    predicted = predict_samples(coeffs, samples, profiles)
    is_decode = np.array([step_kind(s) == "decode" for s in samples])
    rows = [_kind_row(kind, measured[mask], predicted[mask])
            for kind, mask in (("decode", is_decode), ("prefill+mixed", ~is_decode))
            if mask.any()]
    runner = np.array([x for run in runs for x in run["runner_s"]])
    return dict(rows=rows, host_share=float(1 - runner.sum() / measured.sum()),
                num_runs=len(runs))
