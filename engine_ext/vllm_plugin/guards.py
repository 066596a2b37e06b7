"""Version and runner guards: which plugin features this vLLM process may enable, and why not.

The plugin replaces or wraps private vLLM methods. On a vLLM version it was not tested on, on
vLLM's Model Runner V2 (which never calls the patched V1 methods), or without eager mode for the
features that hook the model forward, the feature is refused: one error log line per feature and
process, a `refused` entry in the process's counter file, and requests that need it are rejected
at the front end (a prefill-only adapter is never served on every token, a DiReFT adapter never
silently skipped). Pure functions over plain facts, so a test can simulate every refusal.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

TESTED_VLLM_VERSIONS = ("0.32.0",)
PREFILL_ONLY, DIREFT, ROUTING = "prefill_only", "direft", "routing"
ROUTED_DECODE = "routed_decode"
"""Applying a decision that arrived with the request (decode side): no layer hook needed."""
FEATURES = (PREFILL_ONLY, DIREFT, ROUTING, ROUTED_DECODE)
EAGER_FEATURES = (DIREFT, ROUTING)
"""Features that run Python inside the model forward (a layer hook): compiled graphs skip it."""


@dataclass(frozen=True)
class Internal:
    """One private vLLM attribute the plugin patches, and the parameters it relies on."""

    module: str
    qualname: str
    params: tuple[str, ...]
    features: tuple[str, ...]


INTERNALS = (
    Internal("vllm.v1.worker.lora_model_runner_mixin", "LoRAModelRunnerMixin.set_active_loras",
             ("self", "input_batch", "num_scheduled_tokens", "num_sampled_tokens",
              "mapping_type"), FEATURES),
    Internal("vllm.v1.worker.lora_model_runner_mixin", "LoRAModelRunnerMixin._set_active_loras",
             ("self", "prompt_lora_mapping", "token_lora_mapping", "lora_requests",
              "mapping_type"), FEATURES),
    Internal("vllm.v1.worker.lora_model_runner_mixin", "LoRAModelRunnerMixin.load_lora_model",
             ("self", "model", "vllm_config", "device"), FEATURES),
    Internal("vllm.v1.core.kv_cache_utils", "generate_block_hash_extra_keys",
             ("request", "start_token_idx", "end_token_idx", "start_mm_idx"),
             (PREFILL_ONLY, DIREFT)),
    Internal("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU._apply_shrink",
             ("self", "y", "x", "w_t_all", "scale"), FEATURES),
    Internal("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output",
             ("self", "scheduler_output", "model_runner_output"), (ROUTING,)),
    Internal("vllm.v1.core.sched.scheduler", "Scheduler._preempt_request",
             ("self", "request", "timestamp"), (ROUTING,)),
    Internal("vllm.v1.core.sched.scheduler", "Scheduler.schedule", ("self",), (ROUTING,)),
    Internal("vllm.v1.engine.input_processor", "InputProcessor._validate_lora",
             ("self", "lora_request"), ()),
    Internal("vllm.v1.engine.input_processor", "InputProcessor._validate_params",
             ("self", "params"), ()),
)


def internal_problem(internal: Internal) -> str | None:
    """Why `internal` cannot be patched (missing, or other parameters), or None."""
    try:
        owner = importlib.import_module(internal.module)
    except ImportError as err:
        return f"{internal.module} does not import ({err})"
    target = owner
    for part in internal.qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return f"{internal.module}.{internal.qualname} is missing"
    try:
        params = tuple(inspect.signature(inspect.unwrap(target)).parameters)
    except (TypeError, ValueError):
        return f"{internal.module}.{internal.qualname} has no signature"
    if params[: len(internal.params)] != internal.params:
        return (f"{internal.module}.{internal.qualname} takes {params}, the plugin was written "
                f"for {internal.params}")
    return None


@dataclass(frozen=True)
class RunnerFacts:
    """What the engine process knows once its model runner loads the model."""

    v2_runner: bool
    eager: bool


def runner_facts(vllm_config) -> RunnerFacts:
    """The facts of a vLLM `VllmConfig` (engine process or front end: both hold it)."""
    compilation = vllm_config.compilation_config
    graphs = getattr(getattr(compilation, "cudagraph_mode", None), "name", "NONE")
    eager = bool(vllm_config.model_config.enforce_eager) or (
        int(compilation.mode or 0) == 0 and graphs == "NONE")
    return RunnerFacts(v2_runner=bool(vllm_config.use_v2_model_runner), eager=eager)


@dataclass
class Support:
    """Features refused in this process, with the reason of each."""

    refused: dict[str, str] = field(default_factory=dict)

    def allows(self, feature: str) -> bool:
        """Whether `feature` may be used."""
        return feature not in self.refused

    def refuse(self, feature: str, reason: str) -> bool:
        """Record a refusal (the first reason wins); True when it is new."""
        if feature in self.refused:
            return False
        self.refused[feature] = reason
        return True


def version_refusals(version: str) -> dict[str, str]:
    """Every feature, when `version` is not one the plugin was tested on."""
    if version in TESTED_VLLM_VERSIONS:
        return {}
    reason = (f"vLLM {version} is untested (tested: {', '.join(TESTED_VLLM_VERSIONS)}); "
              "the private methods the plugin patches may have changed")
    return dict.fromkeys(FEATURES, reason)


def internals_refusals(problems: dict[Internal, str | None]) -> dict[str, str]:
    """Features whose patched internals are missing or changed."""
    refused: dict[str, str] = {}
    for internal, problem in problems.items():
        if problem is not None:
            for feature in internal.features:
                refused.setdefault(feature, problem)
    return refused


def runner_refusals(facts: RunnerFacts) -> dict[str, str]:
    """Features the model runner cannot serve."""
    if facts.v2_runner:
        reason = ("vLLM's Model Runner V2 serves this engine; the plugin patches the V1 runner "
                  "(set VLLM_USE_V2_MODEL_RUNNER=0)")
        return dict.fromkeys(FEATURES, reason)
    if facts.eager:
        return {}
    reason = "the model is compiled or graph-captured; its layer hooks need --enforce-eager"
    return dict.fromkeys(EAGER_FEATURES, reason)


def registration_refusals(version: str) -> dict[str, str]:
    """Refusals known at `register()`: the version, then the patched internals."""
    refused = version_refusals(version)
    for feature, reason in internals_refusals(
            {internal: internal_problem(internal) for internal in INTERNALS}).items():
        refused.setdefault(feature, reason)
    return refused


def log_refusal(feature: str, reason: str) -> None:
    """The one log line of a refusal."""
    logger.error("molcap plugin: %s refused: %s", feature, reason)
