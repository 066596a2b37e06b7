"""The hooks into vLLM's V1 engine. Imported only by `register()`, so vLLM loads lazily.

All outside the compiled model region except the layer hooks (which need eager mode):
* the runner's `load_lora_model` (both runners call it): the runner facts for the guards, and
  the DiReFT hooks on every decoder layer;
* the runner's `set_active_loras` (once per step before the forward): per-token adapter mapping
  with prefill-only adapters masked past the prompt, DiReFT requests taken out of the LoRA path,
  decisions resolved from hashes, updated adapter files reloaded, requests to route this step;
* the layer-k hook (route_hook.py) and the DiReFT layer hooks (direft.py);
* the prefix-cache block hash: every adapter's blocks carry its file version (an adapter
  rewritten in place stops matching its old blocks), and blocks holding decode tokens of a
  prefill-only adapter an extra key (their KV was computed without the adapter);
* the CPU punica wrapper's shrink: tokens with no adapter get exactly zero LoRA delta;
* the front end's request validation (frontend.py): refused features, bad adapter files.
Every wrapper is marked, so installing twice is a no-op. guards.py decides what is installed.
"""

from __future__ import annotations

import logging

import numpy as np

from engine_ext.vllm_plugin import guards
from engine_ext.vllm_plugin.adapters import adapter_file, adapter_version
from engine_ext.vllm_plugin.direft import ModelShape, ReftStep, apply_edits, reft_rows
from engine_ext.vllm_plugin.mapping import step_lora_mapping, token_positions
from engine_ext.vllm_plugin.runtime import HASH_KEY, RoutePlan, StepState, get_state

logger = logging.getLogger(__name__)
_MARK = "__molcap_wrapped__"
PREFILL_ONLY_DECODE_KEY = ("molcap", "prefill_only_decode")
VERSION_KEY = "molcap_adapter_version"


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
            if num_computed[i] > 0:  # earlier chunks ran the layers above k on base weights
                state.unrouted(request_id, f"prompt of {num_prompt[i]} tokens did not fit one "
                               "prefill step (raise max_num_batched_tokens, or disaggregate)")
                continue
            end = starts[i] + num_prompt[i] - num_computed[i]
            routes.append(RoutePlan(i, request_id, int(starts[i]), int(end)))
    if routes:  # the router may pick any option: keep them all in adapter slots this step
        for option in state.router.config.options:
            entry = state.entry_by_name(option.adapter)
            if entry is not None:
                requests.setdefault(entry.hash, _lora_request(entry))
    return requests, routes


def _reload_updated(runner, state, requests) -> None:
    """Evict LoRA adapters whose files changed since this worker loaded them (reloaded on use)."""
    manager = runner.lora_manager
    for lora_id, request in requests.items():
        version = adapter_version(request.lora_path)
        old = state.loaded_versions.get(lora_id)
        if old is not None and old != version and lora_id in manager.list_adapters():
            manager.remove_adapter(lora_id)
            logger.info("molcap: adapter %s changed on disk; reloading it", request.lora_path)
        state.loaded_versions[lora_id] = version


def _make_set_active_loras(original):
    del original  # replaced, not wrapped: it builds the unmasked mapping this one refines

    def set_active_loras(self, input_batch, num_scheduled_tokens, num_sampled_tokens=None,
                         mapping_type=None):
        from vllm.lora.layers import LoRAMappingType

        from engine_ext.vllm_plugin.route_hook import ensure_router

        state = get_state()
        state.refresh()
        ensure_router(self, state)
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
        reft_ids = {k for k, r in requests.items() if adapter_file(r.lora_path).is_direft}
        lora_requests = {k: r for k, r in requests.items() if k not in reft_ids}
        _reload_updated(self, state, lora_requests)
        step = StepState(lora_ids, num_computed, sched, num_prompt, sampled,
                         {k: r.lora_path for k, r in requests.items()}, mapping_type, routes,
                         reft_ids=reft_ids)
        prompt_map, token_map, step.reft = step_mapping(state, step)
        self._set_active_loras(prompt_map, token_map, set(lora_requests.values()), mapping_type)
        state.mark_applied()
        state.step = step
        if len(state.resolved) > 4 * max(n, 1):
            state.forget(set(getattr(self, "requests", {})))

    return set_active_loras


def step_mapping(state, step: StepState):
    """(sampled-token LoRA map, token LoRA map, DiReFT edits) of a step.

    DiReFT adapters get their rows in the edits and LoRA id 0 in both maps.
    """
    prompt_map, token_map = step_lora_mapping(
        step.req_lora_ids, step.num_computed, step.num_scheduled, step.num_prompt,
        step.num_sampled, lambda lora_id: state.is_prefill_only(step.lora_paths[lora_id]))
    if not step.reft_ids:
        return prompt_map, token_map, None
    tokens = np.asarray(token_map, dtype=np.int64)
    tok_req, positions = token_positions(step.num_computed, step.num_scheduled)
    edits = []
    for lora_id in sorted(step.reft_ids):
        if not state.support.allows(guards.DIREFT):
            continue  # the front end rejects these requests; never apply a refused feature
        weights = state.reft_store.get(step.lora_paths[lora_id], state.model_shape)
        edits.append((weights, reft_rows(tokens, positions, step.num_prompt[tok_req], lora_id,
                                         weights)))
    prompt_map, token_map = (tuple(0 if x in step.reft_ids else x for x in mapping)
                             for mapping in (prompt_map, token_map))
    return prompt_map, token_map, ReftStep(edits)


def _make_load_lora_model(original):
    def load_lora_model(self, model, vllm_config, device):
        state = get_state()
        for feature, reason in guards.runner_refusals(guards.runner_facts(vllm_config)).items():
            state.refuse(feature, reason)
        lora_model = original(self, model, vllm_config, device)
        if state.support.allows(guards.DIREFT):
            _install_reft_hooks(lora_model, state, self, vllm_config)
        return lora_model

    return load_lora_model


def _install_reft_hooks(model, state, runner, vllm_config) -> None:
    layers = model.model.layers
    state.model_shape = ModelShape(
        hidden_size=vllm_config.model_config.get_hidden_size(), num_layers=len(layers),
        base_model=vllm_config.model_config.model,
        max_rank=vllm_config.lora_config.max_lora_rank)
    for index, layer in enumerate(layers):
        if getattr(layer, "_molcap_reft_hook", False):
            continue
        layer.register_forward_hook(
            lambda module, args, output, index=index: apply_edits(
                index, getattr(get_state().step, "reft", None), output))
        layer._molcap_reft_hook = True


def _routing_keys(request, state) -> tuple[tuple, str | None]:
    """Keys of a request that names no adapter: (extra keys, path of its decided adapter).

    A decision that came with the request: its adapter and version (requests with one decision
    share blocks). A request the router will decide: its own id, because its blocks hold KV of
    layers above k under an adapter not known when they are hashed; they never serve another
    request, and no cached prefix (whose layer-k states are gone) is read for it.
    """
    extra = getattr(request.sampling_params, "extra_args", None) or {}
    if HASH_KEY in extra:
        entry = state.registry.lookup(int(extra[HASH_KEY]))
        path = None if entry is None else entry.path
        return ("molcap_routed", int(extra[HASH_KEY]), *adapter_version(path or "")), path
    if state.config.router is not None and state.support.allows(guards.ROUTING):
        return ("molcap_route_candidate", request.request_id), None
    return (), None


def _make_extra_keys(original):
    def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, next_mm_idx = original(request, start_token_idx, end_token_idx, start_mm_idx)
        state = get_state()
        state.refresh()
        lora = request.lora_request
        if lora is None:
            key, path = _routing_keys(request, state)
        else:
            # vLLM keys by name and path only: the version keeps an adapter rewritten in place
            # from matching blocks computed with its old weights.
            key, path = (VERSION_KEY, *adapter_version(lora.lora_path)), lora.lora_path
        if key:
            keys = (*(keys or ()), key)
        if (path is not None and end_token_idx > request.num_prompt_tokens
                and state.is_prefill_only(path)):
            keys = (*keys, PREFILL_ONLY_DECODE_KEY)
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


def install() -> None:
    """Check the vLLM version and internals, then patch what they allow (idempotent)."""
    import vllm

    state = get_state()
    for feature, reason in guards.registration_refusals(vllm.__version__).items():
        state.refuse(feature, reason)
    from engine_ext.vllm_plugin import frontend

    frontend.install(_wrap)  # rejects requests that need a refused feature
    if not any(state.support.allows(f) for f in guards.FEATURES):
        return  # an untested vLLM: patch nothing else
    from vllm.lora.punica_wrapper import punica_cpu
    from vllm.v1.core import block_pool, kv_cache_utils
    from vllm.v1.worker import lora_model_runner_mixin as mixin

    _wrap(mixin.LoRAModelRunnerMixin, "load_lora_model", _make_load_lora_model)
    _wrap(mixin.LoRAModelRunnerMixin, "set_active_loras", _make_set_active_loras)
    _wrap(punica_cpu.PunicaWrapperCPU, "_apply_shrink", _make_apply_shrink)
    for module in (kv_cache_utils, block_pool):
        _wrap(module, "generate_block_hash_extra_keys", _make_extra_keys)
