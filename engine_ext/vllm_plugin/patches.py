"""The hooks into vLLM's V1 engine. Imported only by `register()`, so vLLM loads lazily.

Four places, all outside the compiled model region:
* the runner's `set_active_loras` (called once per step before the forward): per-token adapter
  mapping with prefill-only adapters masked past the prompt, decisions resolved from hashes, and
  the list of requests to route in this step;
* a forward hook on decoder layer k (routing only, eager mode): pool, score, write the decision,
  and re-point the LoRA mapping of the routed tokens before layer k+1 runs;
* the prefix-cache block hash: a block holding decode tokens of a prefill-only adapter gets an
  extra key, because its KV was computed on base weights and must not serve a later prompt.
* the CPU punica wrapper's shrink: tokens with no adapter get exactly zero LoRA delta (vLLM's
  torch-native ops otherwise read slot -1 as the last slot).
Every wrapper is marked, so installing twice is a no-op.
"""

from __future__ import annotations

import logging

import numpy as np

from engine_ext.lora import LoraSpec
from engine_ext.peft_io import CONFIG_NAME, read_adapter_config
from engine_ext.vllm_plugin.mapping import step_lora_mapping
from engine_ext.vllm_plugin.runtime import HASH_KEY, RoutePlan, StepState, get_state

logger = logging.getLogger(__name__)
_MARK = "__molcap_wrapped__"
PREFILL_ONLY_DECODE_KEY = ("molcap", "prefill_only_decode")


def _wrap(owner, name: str, make) -> None:
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return
    wrapper = make(original)
    setattr(wrapper, _MARK, True)
    setattr(owner, name, wrapper)


def _lora_request(entry):
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=entry.name, lora_int_id=entry.hash, lora_path=entry.path)


def _incoming_hash(runner, request_id: str) -> int | None:
    """A decision that arrived with the request (from a remote prefill), if any."""
    cached = getattr(runner, "requests", {}).get(request_id)
    params = getattr(cached, "sampling_params", None)
    extra = getattr(params, "extra_args", None) or {}
    value = extra.get(HASH_KEY)
    return None if value is None else int(value)


def _resolve_requests(runner, state, batch, lora_ids, num_computed, num_prompt, sched):
    """Fill in decided adapters; list the requests to route now. Returns (requests, routes)."""
    requests = {r.lora_int_id: r for r in batch.lora_id_to_lora_request.values()}
    starts = np.cumsum(sched) - sched
    routes: list[RoutePlan] = []
    for i, request_id in enumerate(batch.req_ids[: len(lora_ids)]):
        if lora_ids[i] != 0:
            continue  # a named adapter is never rerouted
        entry = state.read_decision(request_id, _incoming_hash(runner, request_id))
        if entry is not None:
            lora_ids[i] = entry.hash
            requests.setdefault(entry.hash, _lora_request(entry))
        elif (state.router is not None and request_id not in state.resolved
              and num_computed[i] < num_prompt[i] <= num_computed[i] + sched[i]):
            end = starts[i] + num_prompt[i] - num_computed[i]
            routes.append(RoutePlan(i, request_id, int(starts[i]), int(end)))
    if routes:  # the router may pick any option: keep them all in adapter slots this step
        for option in state.router.config.options:
            entry = state.entry_by_name(option.adapter)
            if entry is not None:
                requests.setdefault(entry.hash, _lora_request(entry))
    return requests, routes


def _make_set_active_loras(original):
    del original  # replaced, not wrapped: it builds the unmasked mapping this one refines

    def set_active_loras(self, input_batch, num_scheduled_tokens, num_sampled_tokens=None,
                         mapping_type=None):
        from vllm.lora.layers import LoRAMappingType

        state = get_state()
        state.refresh()
        _ensure_router(self, state)
        mapping_type = mapping_type or LoRAMappingType.LANGUAGE
        n = input_batch.num_reqs
        sched = np.asarray(num_scheduled_tokens[:n], dtype=np.int64)
        sampled = (np.ones(n, dtype=np.int64) if num_sampled_tokens is None
                   else np.asarray(num_sampled_tokens[:n], dtype=np.int64))
        lora_ids = input_batch.request_lora_mapping[:n].astype(np.int64)
        num_computed = input_batch.num_computed_tokens_cpu[:n].astype(np.int64)
        num_prompt = input_batch.num_prompt_tokens[:n].astype(np.int64)
        requests, routes = _resolve_requests(self, state, input_batch, lora_ids, num_computed,
                                             num_prompt, sched)
        step = StepState(lora_ids, num_computed, sched, num_prompt, sampled,
                         {k: r.lora_path for k, r in requests.items()}, mapping_type, routes)
        prompt_map, token_map = _step_mapping(state, step)
        self._set_active_loras(prompt_map, token_map, set(requests.values()), mapping_type)
        state.mark_applied()
        state.step = step
        if len(state.resolved) > 4 * max(n, 1):
            state.forget(set(getattr(self, "requests", {})))

    return set_active_loras


def _step_mapping(state, step: StepState) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return step_lora_mapping(step.req_lora_ids, step.num_computed, step.num_scheduled,
                             step.num_prompt, step.num_sampled,
                             lambda lora_id: state.is_prefill_only(step.lora_paths[lora_id]))


def _check_above_route_layer(path: str, route_layer: int) -> None:
    """Routed adapters must sit only above layer k (the pooled state is then adapter-free)."""
    from pathlib import Path

    spec: LoraSpec = read_adapter_config(Path(path) / CONFIG_NAME)
    if spec.layers is None or min(spec.layers) <= route_layer:
        raise ValueError(f"{path}: routed adapters must set layers_to_transform above route "
                         f"layer {route_layer}, got {spec.layers}")


def _ensure_router(runner, state) -> None:
    """Build the router (and its layer-k hook) once per config, from the served model."""
    config = state.config.router
    if config is None or state.router is not None or not hasattr(runner, "model"):
        return
    from engine_ext.vllm_plugin.router import InEngineRouter

    for option in config.options:
        entry = state.entry_by_name(option.adapter)
        if entry is not None:
            _check_above_route_layer(entry.path, config.route_layer)
    model = runner.get_model()
    embed = model.model.embed_tokens
    embed = getattr(embed, "base_layer", embed)
    d_model = runner.model_config.get_hidden_size()
    state.router = InEngineRouter(config, embed, d_model)
    layer = model.model.layers[config.route_layer]
    if not getattr(layer, "_molcap_route_hook", False):
        layer.register_forward_hook(_on_route_layer)
        layer._molcap_route_hook = True
    state.route_module, state.runner = layer, runner


def _on_route_layer(module, args, output):
    """After layer k: route the requests whose prompt ends in this step, re-point their LoRA."""
    from vllm.lora.layers import LoRAMapping

    state = get_state()
    step = state.step
    if step is None or not step.routes or module is not state.route_module:
        return None
    hidden, residual = output
    # vLLM's layers hand the residual to the next norm un-added; the layer output is their sum.
    stream = hidden if residual is None else hidden + residual  # [N, D]
    for plan in step.routes:
        name = state.router.choose(stream[plan.token_start : plan.token_end])
        # The prefill side applies its own decision above k; later steps read the hash back.
        step.req_lora_ids[plan.index] = state.write_decision(plan.request_id, name)
    step.routes = []
    prompt_map, token_map = _step_mapping(state, step)
    manager = state.runner.lora_manager._adapter_manager
    manager.set_adapter_mapping(LoRAMapping(token_map, prompt_map, is_prefill=True,
                                            type=step.mapping_type))
    return None


def _make_extra_keys(original):
    def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, next_mm_idx = original(request, start_token_idx, end_token_idx, start_mm_idx)
        lora = request.lora_request
        if lora is not None and end_token_idx > request.num_prompt_tokens:
            state = get_state()
            state.refresh()
            if state.is_prefill_only(lora.lora_path):
                keys = (*(keys or ()), PREFILL_ONLY_DECODE_KEY)
        return keys, next_mm_idx

    return generate_block_hash_extra_keys


def _make_apply_shrink(original):
    def _apply_shrink(self, y, x, w_t_all, scale):
        original(self, y, x, w_t_all, scale)
        # vLLM's torch-native LoRA ops gather weights with the token's slot index, and index -1
        # ("no adapter") then reads the LAST slot: once every slot is taken, base tokens (and
        # the masked decode tokens of LoRA_P) would get that adapter. Zero their shrink rows so
        # the expand adds exactly 0. The CUDA/Triton kernels skip -1 themselves.
        indices = self.token_lora_indices  # [N]
        rows = y.view(-1, y.shape[-1])  # [>=N, r]
        n = min(indices.shape[0], rows.shape[0])
        rows[:n][indices[:n] < 0] = 0

    return _apply_shrink


def _make_v2_warning(original):
    warned = []

    def make_lora_inputs(self, *args, **kwargs):
        if not warned:
            warned.append(True)
            logger.warning("molcap plugin: vLLM's Model Runner V2 is serving LoRA; prefill-only "
                           "adapters and in-engine routing are NOT applied there. Set "
                           "VLLM_USE_V2_MODEL_RUNNER=0 to use the V1 runner the plugin patches.")
        return original(self, *args, **kwargs)

    return make_lora_inputs


def install() -> None:
    """Patch vLLM's V1 runner, the CPU LoRA path and prefix-cache hashing (idempotent)."""
    from vllm.lora.punica_wrapper import punica_cpu
    from vllm.v1.core import block_pool, kv_cache_utils
    from vllm.v1.worker import lora_model_runner_mixin

    _wrap(lora_model_runner_mixin.LoRAModelRunnerMixin, "set_active_loras",
          _make_set_active_loras)
    _wrap(punica_cpu.PunicaWrapperCPU, "_apply_shrink", _make_apply_shrink)
    for module in (kv_cache_utils, block_pool):
        _wrap(module, "generate_block_hash_extra_keys", _make_extra_keys)
    try:
        from vllm.v1.worker.gpu import lora_utils
    except ImportError:  # pragma: no cover - layout of another vLLM version
        return
    _wrap(lora_utils.LoraState, "make_lora_inputs", _make_v2_warning)
