"""Per-step timer on vLLM's V1 model runner: what each step computed and how long it took.

`install()` wraps the runner's `execute_model` and `sample_tokens` (a step is the pair: the
forward, then sampling) and appends one `StepTiming` per step to `TIMINGS` while `enabled` is set.
A record holds, per scheduled request, the tokens scheduled, the tokens already computed
(context), the prompt length and the LoRA id, plus the step's start and end, both in wall
seconds (perf_counter) and in CPU seconds of the calling thread (thread_time: on a shared
machine, the engine's own work without the time other processes held the cores). It needs the
runner in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0). Reading the scheduler's output
only: no tensor is touched, so timing adds microseconds per step.

Adapter loads are timed too (`LOADS`): vLLM's worker reading an adapter's files into its CPU cache
("load") and copying a cached adapter into a device slot ("activate"), each with its bytes. Both
happen inside a step's execute_model; the step records their seconds so a profile can price the
step without them and the loads on their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_MARK = "__molcap_step_timer__"


@dataclass(frozen=True)
class StepTiming:
    """One engine step as the runner saw it."""

    start_s: float
    """perf_counter at entry of execute_model."""
    end_s: float
    """perf_counter when the step's sampled tokens were returned."""
    num_scheduled_tokens: tuple[int, ...]
    """Tokens computed this step, per request."""
    num_computed_tokens: tuple[int, ...]
    """Tokens already in KV before this step, per request."""
    num_prompt_tokens: tuple[int, ...]
    """Prompt length, per request."""
    lora_ids: tuple[int, ...]
    """LoRA int id per request (0: none)."""
    cpu_start_s: float = 0.0
    """thread_time at entry of execute_model."""
    cpu_end_s: float = 0.0
    """thread_time when the sampled tokens were returned."""
    adapter_load_s: float = 0.0
    """Wall seconds of adapter loads and activations inside this step."""
    adapter_load_cpu_s: float = 0.0
    """Thread CPU seconds of adapter loads and activations inside this step."""


@dataclass(frozen=True)
class AdapterLoad:
    """One adapter moved by vLLM's LoRA manager."""

    kind: str
    """"load" (adapter files into the CPU cache) or "activate" (cached adapter into a slot)."""
    lora_id: int
    num_bytes: int
    """Bytes of the adapter's A and B tensors."""
    wall_s: float
    cpu_s: float


TIMINGS: list[StepTiming] = []
"""Finished steps, in order; the caller drains it."""
LOADS: list[AdapterLoad] = []
"""Adapter loads and activations while enabled, in order; `drain_loads` clears it."""
_state = {"enabled": False, "pending": None, "load_s": 0.0, "load_cpu_s": 0.0}


def enable(on: bool = True) -> None:
    """Start (or stop) recording steps."""
    _state["enabled"] = on
    _state["pending"] = None
    _state["load_s"] = _state["load_cpu_s"] = 0.0


def drain() -> list[StepTiming]:
    """The steps recorded so far; clears the list."""
    out = list(TIMINGS)
    TIMINGS.clear()
    return out


def drain_loads() -> list[AdapterLoad]:
    """The adapter loads recorded so far; clears the list."""
    out = list(LOADS)
    LOADS.clear()
    return out


def _features(runner, scheduler_output) -> tuple[tuple[int, ...], ...]:
    """(scheduled, computed, prompt, lora id) per scheduled request of this step."""
    sched, computed, prompt, lora = [], [], [], []
    for req in scheduler_output.scheduled_new_reqs:
        sched.append(scheduler_output.num_scheduled_tokens[req.req_id])
        computed.append(req.num_computed_tokens)
        prompt.append(len(req.prompt_token_ids or ()))
        lora.append(req.lora_request.lora_int_id if req.lora_request else 0)
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
        state = runner.requests.get(req_id)
        sched.append(scheduler_output.num_scheduled_tokens[req_id])
        computed.append(num_computed)
        prompt.append(state.num_prompt_tokens if state is not None else 0)
        request = getattr(state, "lora_request", None)
        lora.append(request.lora_int_id if request else 0)
    return tuple(sched), tuple(computed), tuple(prompt), tuple(lora)


def _finish() -> None:
    end_s, cpu_end_s = time.perf_counter(), time.thread_time()
    pending, _state["pending"] = _state["pending"], None
    load_s, load_cpu_s = _state["load_s"], _state["load_cpu_s"]
    _state["load_s"] = _state["load_cpu_s"] = 0.0
    if pending is not None and pending[2][0]:
        TIMINGS.append(StepTiming(pending[0], end_s, *pending[2], cpu_start_s=pending[1],
                                  cpu_end_s=cpu_end_s, adapter_load_s=load_s,
                                  adapter_load_cpu_s=load_cpu_s))


def _num_bytes(lora_model) -> int:
    """Bytes of a vLLM LoRAModel's A and B tensors (packed modules hold lists)."""
    total = 0
    for weights in getattr(lora_model, "loras", {}).values():
        for part in (weights.lora_a, weights.lora_b):
            for t in part if isinstance(part, (list, tuple)) else (part,):
                if t is not None:
                    total += t.numel() * t.element_size()
    return total


def _timed_load(kind: str, original, lora_id_of, model_of):
    def wrapper(self, *args, **kwargs):
        if not _state["enabled"]:
            return original(self, *args, **kwargs)
        start, cpu_start = time.perf_counter(), time.thread_time()
        out = original(self, *args, **kwargs)
        wall_s, cpu_s = time.perf_counter() - start, time.thread_time() - cpu_start
        if out is False:  # already active: nothing moved
            return out
        _state["load_s"] += wall_s
        _state["load_cpu_s"] += cpu_s
        lora_id = lora_id_of(self, args, kwargs, out)
        LOADS.append(AdapterLoad(kind, lora_id, _num_bytes(model_of(self, lora_id, out)),
                                 wall_s, cpu_s))
        return out

    return wrapper


def _make_execute_model(original):
    def execute_model(self, scheduler_output, *args, **kwargs):
        if not _state["enabled"]:
            return original(self, scheduler_output, *args, **kwargs)
        start, cpu_start = time.perf_counter(), time.thread_time()
        _state["pending"] = (start, cpu_start, _features(self, scheduler_output))
        out = original(self, scheduler_output, *args, **kwargs)
        if out is not None:  # no separate sampling call follows
            _finish()
        return out

    return execute_model


def _make_sample_tokens(original):
    def sample_tokens(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if _state["enabled"]:
            _finish()
        return out

    return sample_tokens


def _wrap(owner, name: str, make) -> None:
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return
    wrapper = make(original)
    setattr(wrapper, _MARK, True)
    setattr(owner, name, wrapper)


def install() -> None:
    """Wrap the V1 GPU model runner (the CPU runner inherits it); idempotent."""
    from vllm.lora.model_manager import LoRAModelManager
    from vllm.lora.worker_manager import WorkerLoRAManager
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _wrap(GPUModelRunner, "execute_model", _make_execute_model)
    _wrap(GPUModelRunner, "sample_tokens", _make_sample_tokens)
    _wrap(WorkerLoRAManager, "_load_adapter", lambda original: _timed_load(
        "load", original, lambda self, a, k, out: out.id, lambda self, i, out: out))
    _wrap(LoRAModelManager, "activate_adapter", lambda original: _timed_load(
        "activate", original, lambda self, a, k, out: a[0] if a else k["lora_id"],
        lambda self, i, out: self._registered_adapters[i]))
