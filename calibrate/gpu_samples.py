"""Step samples from the agullo-dt slice (multi-LoRA vLLM 0.8.5 V1 on a 64 GB H100): what
`calibrate.gpu_fit` fits and checks.

Each controlled experiment becomes `StepSample`s the fitter takes, one per run, in the run's
steady state:
* `base_decode` (`predictor_default_latency/output`): all prompts sent at once, one-token
  prompts, fixed output; a step decodes `max_num_seqs` sequences at half the output length of
  context on average; measured: the run's mean TPOT. Runs whose batch cannot fit the KV pool
  (they preempt) are left out, and said so in `skipped`.
* `base_prefill` (`.../input`): prompts of one length, one output token; a step packs the
  engine's 2,048-token budget (vLLM 0.8.5's V1 default for the API server: the runs' step
  counts are input tokens / 2,048); measured: the run's mean step interval.
* `lora_probe` (`find_available_gpu_memory...`): one base-model request (no adapter) on a
  LoRA engine with `max_loras` slots at `max_lora_rank`; batch 1; measured: mean TPOT.
* `lora_overhead` (`predictor_latency_overhead`): `max_num_seqs` sequences over N adapters at
  `max_loras` 300; measured: the median step and its median distinct adapters (`overhead_steps
  .csv`); `lora_warmup`: the client's warm-up before it, batch 1 with one adapter.

`first_request_gaps` reads the same warm-ups for what the API server adds to an adapter's first
request, and `api_path_s` the `lora_probe` runs for what it adds to every request (neither is
a step: `calibrate.gpu_runs` adds them to the replayed TTFT).
"""

from __future__ import annotations

import csv
import gzip
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.recorder import StepSample

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "gpu" / "agullo-dt"
RUNS_SUMMARY = "derived/runs_summary.csv.gz"
MODELS = {"llama-3.1-8b-instruct": "llama-3.1-8b", "qwen-2.5-7b-instruct": "qwen2.5-7b"}
MAX_NUM_BATCHED_TOKENS = 2048
"""vLLM 0.8.5 V1's default token budget per step for the OpenAI server (not in the launchers)."""
KV_TOKENS = {"llama-3.1-8b": 334_816, "qwen2.5-7b": 1_300_000}
"""KV pool of the base engine in tokens: Llama's from the dataset's log (`gpu_kv_cache_tokens`);
Qwen's (4 KV heads of 28 layers: 57 KB a token) is above every run's batch x length."""


class SliceError(ValueError):
    """A file of the slice is missing or a row is malformed (message names file and line)."""


@dataclass
class AgulloSamples:
    """Step samples by kind; `skipped` says which rows were left out and why."""

    by_kind: dict[str, list[StepSample]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def add(self, kind: str, sample: StepSample) -> None:
        sample.tags["kind"] = kind
        self.by_kind.setdefault(kind, []).append(sample)


def lora_group(model: str, rank: int, max_loras: int) -> str:
    """Sample group of a LoRA engine (its cost profile depends on rank and slots)."""
    return f"{model}:lora_r{rank}_ml{max_loras}"


def _decode(group, batch, context, measured_ms, adapters=(), tags=None) -> StepSample:
    ids = [adapters[i % len(adapters)] for i in range(batch)] if adapters else [-1] * batch
    return StepSample(group=group, num_new_tokens=(1,) * batch,
                      num_context_tokens=(int(context),) * batch, adapter_ids=tuple(ids),
                      is_adapted=(bool(adapters),) * batch, measured_s=measured_ms / 1e3,
                      tags=tags or {})


def _prefill(group, prompt_len, measured_ms, tags) -> StepSample:
    n, rest = divmod(MAX_NUM_BATCHED_TOKENS, prompt_len)
    new = (prompt_len,) * n + ((rest,) if rest else ())
    return StepSample(group=group, num_new_tokens=new, num_context_tokens=(0,) * len(new),
                      adapter_ids=(-1,) * len(new), is_adapted=(False,) * len(new),
                      measured_s=measured_ms / 1e3, tags=tags)


def _rows(path: Path):
    if not path.exists():
        raise SliceError(f"{path}: missing; recreate it with data/cut_gpu_slices.py and "
                         f"data/gpu/cut_agullo_slice.py")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8") as fh:
        yield from enumerate(csv.DictReader(fh), start=2)


def _num(path, line, row, name, *, required=True):
    value = row.get(name, "")
    try:
        return float(value)
    except ValueError:
        if required:
            raise SliceError(f"{path}:{line}: {name}: {value!r} is not a number") from None
        return None


def _estimator_sample(out: AgulloSamples, path, line, row) -> None:
    model, group = MODELS.get(row["model"]), row["group"]
    if not group.startswith(("predictor_default", "find_available")):
        return
    tpot = _num(path, line, row, "mean_tpot_ms", required=False)
    tags = dict(model=model, run=row["run_id"], line=line)
    if model is None:  # vLLM 0.5.0's Llama-2 runs, not these experiments
        out.skipped.append(f"{path.name}:{line}: model {row['model']!r} not in the catalogue")
    elif group == "predictor_default_latency/output" and tpot:
        batch = int(_num(path, line, row, "max_num_seqs"))
        length = int(_num(path, line, row, "synthetic_output_len"))
        if batch * (length + 1) > KV_TOKENS[model]:
            out.skipped.append(f"{path.name}:{line}: batch {batch} x {length} tokens exceeds "
                               f"the KV pool ({KV_TOKENS[model]} tokens): preempts")
            return
        out.add("base_decode", _decode(f"{model}:base", batch, length // 2, tpot,
                                       tags={**tags, "batch": batch}))
    elif group == "predictor_default_latency/input":
        step = _num(path, line, row, "mean_step_interval_ms", required=False)
        length = int(_num(path, line, row, "synthetic_input_len"))
        if step:
            out.add("base_prefill", _prefill(f"{model}:base", length, step,
                                             {**tags, "prompt_len": length}))
    elif group.startswith("find_available") and tpot:
        rank = int(_num(path, line, row, "max_lora_rank"))
        slots = int(_num(path, line, row, "max_loras"))
        out.add("lora_probe", _decode(lora_group(model, rank, slots), 1, 300, tpot,
                                      tags={**tags, "max_loras": slots, "rank": rank}))
    elif tpot is None and group.startswith(("predictor_default", "find_available")):
        out.skipped.append(f"{path.name}:{line}: no mean TPOT (the run did not finish)")


def _overhead_samples(out: AgulloSamples, path: Path) -> None:
    for line, row in _rows(path):
        model = MODELS[row["run_id"].split("/")[2]]
        seqs, slots, rank, length, num_adapters = (
            int(_num(path, line, row, k)) for k in ("max_num_seqs", "max_loras",
                                                     "max_lora_rank", "output_len",
                                                     "restrict_loras"))
        group = lora_group(model, rank, slots)
        distinct = int(_num(path, line, row, "median_unique_adapters"))
        tags = dict(model=model, run=row["run_id"], line=line, batch=seqs, adapters=distinct,
                    restrict_loras=num_adapters, output_len=length)
        out.add("lora_overhead", _decode(group, seqs, length // 2,
                                         _num(path, line, row, "median_step_ms"),
                                         adapters=tuple(range(distinct)), tags=tags))
        warm = _num(path, line, row, "warmup_median_step_ms", required=False)
        if warm and length == 100:
            out.add("lora_warmup", _decode(group, 1, length // 2, warm, adapters=(0,),
                                           tags={**tags, "batch": 1, "adapters": 1}))


def load_agullo_samples(root: Path = DATA_DIR) -> AgulloSamples:
    """Every step sample of the slice under `root` (SliceError naming a missing file or a
    malformed row)."""
    out = AgulloSamples()
    path = root / RUNS_SUMMARY
    for line, row in _rows(path):
        _estimator_sample(out, path, line, row)
    _overhead_samples(out, root / "overhead_steps.csv")
    return out


STEP_TRACE = "derived/per_step_scheduler_trace.csv.gz"
_WARMUP_RUN = re.compile(r"overhead_small/output/_\d+_\d+_\d+__\d+_(\d+)_(\d+)$")


def first_request_gaps(root: Path = DATA_DIR) -> list[float]:
    """Seconds the engine idles before each adapter's first request, beyond a step, in the
    distinct-adapter sweep's warm-ups. The client sends one request per adapter, each as soon
    as the previous one has finished, to a server that holds every adapter in its host cache
    and device slots (`max_loras` 300): the engine's steps run back to back within a request,
    and between two requests it waits for the next to come through the API server, which on
    an adapter's first request loads the tokenizer from the adapter's folder (vLLM 0.8.5's
    `TokenizerGroup.get_lora_tokenizer`; the fork's dummy adapters carry tokenizer files: its
    server logs never say "No tokenizer found"). A gap is a step interval over 3x the run's
    median within the warm-up (requests x output length steps); the median step is
    subtracted."""
    path = root / STEP_TRACE
    runs: dict[str, list[float]] = {}
    for line, row in _rows(path):
        match = _WARMUP_RUN.search(row["run_id"])
        if match and int(match.group(2)) > 1 and row["interval_since_prev_step_ms"]:
            limit = int(match.group(1)) * int(match.group(2))
            steps = runs.setdefault(row["run_id"], [])
            if len(steps) < limit:
                steps.append(_num(path, line, row, "interval_since_prev_step_ms") / 1e3)
    gaps = []
    for steps in runs.values():
        step = statistics.median(steps)
        gaps += [s - step for s in steps if s > 3 * step]
    return gaps


def api_path_s(root: Path = DATA_DIR) -> float:
    """Median seconds a request spends outside the engine's steps before its first token
    reaches the client (HTTP, tokenizing, handing it to the engine, detokenizing, streaming),
    from the `lora_probe` runs: one short ShareGPT request alone on an idle LoRA engine, whose
    TTFT is that path plus one prefill step, priced here as the run's TPOT (a decode step of
    the same batch of one; the prefill of its few tokens costs about as much)."""
    path = root / RUNS_SUMMARY
    gaps = []
    for line, row in _rows(path):
        if row["group"].startswith("find_available") and row["mean_tpot_ms"]:
            ttft = _num(path, line, row, "mean_ttft_ms")
            gaps.append((ttft - _num(path, line, row, "mean_tpot_ms")) / 1e3)
    return statistics.median(gaps)


def expected_distinct(num_adapters: int, batch: int) -> float:
    """Distinct adapters among `batch` requests drawn uniformly from `num_adapters`."""
    return num_adapters * (1 - (1 - 1 / num_adapters) ** batch)
