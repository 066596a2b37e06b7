"""Splitwise and memory-gap phase timings as `calibrate.recorder.StepSample`s (the fitter's
input). agullo-dt's decode sweeps have their own converter (`agullo_steps`).

Stated assumptions (a fit can be checked against them):

* Splitwise: a prompt record is one prefill step of `batch_size` prompts of `prompt_size`
  tokens (no context); its decode is a step of `batch_size` one-token items at the mean
  context of the generation (prompt + token_size / 2), timed by `token_time_ms`.
* memory-gap offline runs: the decode phase runs the whole batch for one step per printed
  DECODE line, so a step is `decode_s / num_decode_lines`; items at the mean context
  (prompt + output_len / 2). Prefill phases are chunked by `max_num_batched_tokens` over
  several steps whose split is not logged: not converted.
"""

from __future__ import annotations

from calibrate.gpu_data.memory_gap import PhaseTimingRecord
from calibrate.gpu_data.splitwise import SplitwisePhaseRecord
from calibrate.recorder import StepSample


def _step(group: str, new: int, context: int, batch: int, seconds: float, tags: dict,
          prompt: bool) -> StepSample:
    return StepSample(group=group, num_new_tokens=(new,) * batch,
                      num_context_tokens=(context,) * batch, adapter_ids=(-1,) * batch,
                      is_adapted=(False,) * batch, measured_s=seconds, wall_s=seconds,
                      is_prompt=(prompt,) * batch, tags=tags)


def splitwise_step_samples(records: list[SplitwisePhaseRecord]) -> list[StepSample]:
    """A prefill and a decode StepSample per Splitwise record (group splitwise_prefill /
    splitwise_decode; tags carry model, hardware, TP and the source line)."""
    out = []
    for r in records:
        tags = {"model": r.model, "hardware": r.hardware, "tensor_parallel": r.tensor_parallel,
                "batch": r.batch_size, "prompt_size": r.prompt_size, "token_size": r.token_size,
                "source_file": r.source_file, "source_line": r.source_line}
        out.append(_step("splitwise_prefill", r.prompt_size, 0, r.batch_size,
                         r.prompt_time_ms / 1000, tags, prompt=True))
        out.append(_step("splitwise_decode", 1, r.prompt_size + r.token_size // 2, r.batch_size,
                         r.token_time_ms / 1000, tags, prompt=False))
    return out


def phase_decode_step_samples(records: list[PhaseTimingRecord]) -> list[StepSample]:
    """One mean decode StepSample per memory-gap offline run (group memory_gap_decode)."""
    return [_step("memory_gap_decode", 1, r.prompt_len + r.output_len // 2, r.batch_size,
                  r.decode_s / r.num_decode_lines,
                  {"model": r.model, "engine": r.engine, "experiment": r.experiment,
                   "batch": r.batch_size, "prompt_len": r.prompt_len,
                   "output_len": r.output_len, "enforce_eager": r.enforce_eager,
                   "source_file": r.source_file, "source_line": r.source_line}, prompt=False)
            for r in records if r.num_decode_lines > 0]
