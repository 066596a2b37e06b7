"""Front-end checks: a request is refused before it is queued, never served wrongly.

Wraps vLLM's `InputProcessor._validate_lora` and `_validate_params` (the front end's request
validation; a ValueError there is a 400 for the OpenAI server, an exception for `LLM.generate`):
* a request naming a prefill-only or DiReFT adapter while that feature is refused in this engine
  (untested vLLM, V2 runner, compiled model for DiReFT), or a decision hash while routing is;
* adapter files that do not fit the served model: another base model, a rank above
  `--max-lora-rank`, layers outside the model (LoRA `layers_to_transform`, DiReFT `layers`), a
  DiReFT width other than the model's.
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine_ext.peft_io import CONFIG_NAME, read_adapter_config
from engine_ext.reft_io import load_reft_adapter
from engine_ext.registry import AdapterLoadError
from engine_ext.vllm_plugin import guards
from engine_ext.vllm_plugin.adapters import adapter_file
from engine_ext.vllm_plugin.runtime import HASH_KEY, carried_hash, get_state

logger = logging.getLogger(__name__)
_TARGETS = ("_validate_lora", "_validate_params")


class PluginRequestError(ValueError):
    """A request the plugin refuses (the message says which adapter, feature and why)."""


def _refuse_runner_features(processor, state) -> None:
    if not getattr(processor, "_molcap_facts_checked", False):
        for feature, reason in guards.runner_refusals(
                guards.runner_facts(processor.vllm_config)).items():
            state.refuse(feature, reason)
        processor._molcap_facts_checked = True


def _needed_features(path: str, state) -> list[str]:
    info = adapter_file(path)
    needed = [guards.DIREFT] if info.is_direft else []
    if state.is_prefill_only(path):
        needed.append(guards.PREFILL_ONLY)
    return needed


def check_adapter_file(path: str, model_config, max_rank: int) -> None:
    """AdapterLoadError when the adapter at `path` does not fit the served model."""
    hf = model_config.hf_config
    num_layers, base = hf.num_hidden_layers, model_config.model
    if adapter_file(path).is_direft:
        load_reft_adapter(path, hidden_size=model_config.get_hidden_size(),
                          num_layers=num_layers, base_model=base, max_rank=max_rank)
        return
    source = str(Path(path) / CONFIG_NAME)
    spec = read_adapter_config(Path(source))
    if spec.base_model and spec.base_model != base:
        raise AdapterLoadError(source, "base_model_name_or_path",
                               f"adapter is for {spec.base_model!r}, the model is {base!r}")
    if spec.rank > max_rank:
        raise AdapterLoadError(source, "r", f"rank {spec.rank} > --max-lora-rank {max_rank}")
    bad = [x for x in spec.layers or () if not 0 <= x < num_layers]
    if bad:
        raise AdapterLoadError(source, "layers_to_transform",
                               f"layers {bad} outside the model's 0..{num_layers - 1}")


def _make_validate_lora(original):
    def _validate_lora(self, lora_request):
        original(self, lora_request)
        if lora_request is None:
            return
        state = get_state()
        state.refresh()
        _refuse_runner_features(self, state)
        path = lora_request.lora_path
        for feature in _needed_features(path, state):
            if not state.support.allows(feature):
                reason = state.support.refused[feature]
                state.reject(lora_request.lora_name, f"{feature}: {reason}")
                raise PluginRequestError(f"molcap: adapter {lora_request.lora_name!r} ({path}) "
                                         f"needs {feature}, refused in this engine: {reason}")
        try:
            check_adapter_file(path, self.model_config, self.lora_config.max_lora_rank)
        except AdapterLoadError as err:
            raise PluginRequestError(f"molcap: adapter {lora_request.lora_name!r}: {err}") from err

    return _validate_lora


def _make_validate_params(original):
    def _validate_params(self, params, *args, **kwargs):
        result = original(self, params, *args, **kwargs)
        if carried_hash(params) is not None:
            state = get_state()
            _refuse_runner_features(self, state)
            if not state.support.allows(guards.ROUTED_DECODE):
                reason = state.support.refused[guards.ROUTED_DECODE]
                state.reject("-", f"{guards.ROUTED_DECODE}: {reason}")
                raise PluginRequestError(f"molcap: the request carries a routing decision "
                                         f"({HASH_KEY}), but routing is refused: {reason}")
        return result

    return _validate_params


def install(wrap) -> None:
    """Wrap the front end's validation, when its methods are the ones the plugin knows."""
    from vllm.v1.engine import input_processor

    for internal in guards.INTERNALS:
        if internal.module == input_processor.__name__:
            problem = guards.internal_problem(internal)
            if problem is not None:
                logger.error("molcap plugin: cannot check requests at the front end: %s; "
                             "prefill-only and DiReFT adapters are not refused here", problem)
                return
    owner = input_processor.InputProcessor
    wrap(owner, "_validate_lora", _make_validate_lora)
    wrap(owner, "_validate_params", _make_validate_params)
