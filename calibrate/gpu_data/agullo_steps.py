"""The agullo-dt decode sweeps as `calibrate.recorder.StepSample`s, the fitter's input.

A decode sweep run (predictor_latency_overhead, predictor_default_latency/output) sends 4,096
requests of a fixed short prompt and fixed output length at once, so the engine runs full
decode batches of `max_num_seqs` while requests wait, and the client's mean TPOT is the mean
decode step time at that batch. One run becomes one StepSample:

* batch: `max_num_seqs` items (the running set's cap, held while requests wait; the run's
  mean over the ~1 s polls, diluted by ramp-up and the tail, is in `tags["mean_num_running"]`);
* each item computes 1 token; contexts are spread evenly over the output (item i has
  prompt + i * output_len / batch tokens in KV): a steady state of staggered requests;
* adapters: `restrict_loras` distinct adapters, item i on adapter i mod restrict_loras
  (no LoRA: -1), each applied to its item's token;
* measured_s: mean TPOT (the client's mean time between a request's output tokens).

These are assumptions about what the client measured, stated so a fit can be checked against
them; the prefill sweeps (output 1) give TTFT of queued prompts, not steps, and are left to
run-level fitting.
"""

from __future__ import annotations

from calibrate.gpu_data.agullo_records import ServingRunRecord
from calibrate.recorder import StepSample

DECODE_GROUPS = ("estimators/predictor_latency_overhead", "estimators/predictor_default_latency")


def is_decode_sweep(run: ServingRunRecord) -> bool:
    """A saturated fixed-length decode run: more requests than batch slots, output > 1."""
    return (run.group in DECODE_GROUPS and run.output_len is not None and run.output_len > 1
            and run.max_num_seqs is not None and run.num_prompts is not None
            and run.num_prompts > run.max_num_seqs and run.mean_tpot_ms > 0)


def decode_step_samples(runs: list[ServingRunRecord]) -> list[StepSample]:
    """One StepSample per decode sweep run among `runs` (others are skipped: see
    `is_decode_sweep`)."""
    return [decode_step_sample(run) for run in runs if is_decode_sweep(run)]


def decode_step_sample(run: ServingRunRecord) -> StepSample:
    """The mean decode step of one saturated decode run (see the module docstring)."""
    batch = run.max_num_seqs
    prompt = round(run.total_input_tokens / run.completed_requests)
    contexts = tuple(prompt + (i * run.output_len) // batch for i in range(batch))
    distinct = run.restrict_loras if run.enable_lora and run.restrict_loras else 0
    adapters = tuple(i % distinct if distinct else -1 for i in range(batch))
    return StepSample(
        group="agullo_decode_lora" if distinct else "agullo_decode_base",
        num_new_tokens=(1,) * batch, num_context_tokens=contexts, adapter_ids=adapters,
        is_adapted=tuple(a >= 0 for a in adapters), measured_s=run.mean_tpot_ms / 1000,
        wall_s=run.mean_tpot_ms / 1000, is_prompt=(False,) * batch,
        tags={"run_id": run.run_id, "model": run.model, "gpu": run.gpu, "engine": run.engine,
              "batch": batch, "distinct_adapters": distinct, "max_loras": run.max_loras,
              "max_lora_rank": run.max_lora_rank, "lora_module_ranks": list(run.lora_module_ranks),
              "prompt_tokens": prompt, "output_len": run.output_len,
              "mean_num_running": run.mean_num_running, "source_file": run.source_file})
