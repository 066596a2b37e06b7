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
from engine_ext.vllm_plugin.direft import ModelShape, apply_edits
from engine_ext.vllm_plugin.mapping import step_mapping
from engine_ext.vllm_plugin.runtime import RoutePlan, StepState, carried_hash, get_state

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
    """The LoRARequest of a routed adapter. Its own name: vLLM tells LoRARequests apart by name
    only, so a user's request naming the same adapter (another lora_int_id) would replace it in
    the step's adapter set, and the routed tokens would point at an adapter never activated."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=f"molcap-routed:{entry.name}", lora_int_id=entry.hash,
                       lora_path=entry.path)


def _incoming_hash(runner, request_id: str) -> int | None:
    """A decision that arrived with the request (from a remote prefill), if any."""
    cached = getattr(runner, "requests", {}).get(request_id)
    return carried_hash(getattr(cached, "sampling_params", None))


def _resolve_requests(runner, state, batch, lora_ids, num_computed, num_prompt, sched):
    """Fill in decided adapters; list the requests to route now. Returns (requests, routes)."""
    requests = {r.lora_int_id: r for r in batch.lora_id_to_lora_request.values()}
    starts = np.cumsum(sched) - sched
    routes: list[RoutePlan] = []
    for i, request_id in enumerate(batch.req_ids[: len(lora_ids)]):
        if lora_ids[i] != 0:
            continue  # a named adapter is never rerouted
        entry = state.read_decision(request_id, _incoming_hash(runner, request_id))
        row = (i, request_id, int(starts[i]), int(num_computed[i]), int(num_prompt[i]),
               int(sched[i]))
        if entry is not None:
            lora_ids[i] = entry.hash
            requests.setdefault(entry.hash, _lora_request(entry))
            plan = _redecide_plan(state, *row)
        elif state.router is not None and request_id not in state.resolved:
            plan = _route_plan(state, *row)
        else:
            plan = None
        if plan is not None:
            routes.append(plan)
    if routes:  # the router may pick any option: keep them all in adapter slots this step
        for option in state.router.config.options:
            entry = state.entry_by_name(option.adapter)
            if entry is not None:
                requests.setdefault(entry.hash, _lora_request(entry))
    return requests, routes


def _route_plan(state, index, request_id, start, computed, prompt, sched) -> RoutePlan | None:
    """The prompt tokens of a routing candidate in this step (pooled across chunks)."""
    if computed >= prompt:
        return None
    final, whole = computed + sched >= prompt, computed == 0
    if final and not whole and not state.scheduler_here:
        state.unrouted(request_id, f"prompt of {prompt} tokens did not fit one prefill step "
                       "and vLLM's scheduler runs in another process, so the request cannot be "
                       "recomputed under the decision (raise max_num_batched_tokens)")
        return None
    return RoutePlan(index, request_id, start, start + min(prompt - computed, sched),
                     final=final, whole=whole)


def _redecide_plan(state, index, request_id, start, computed, prompt, sched) -> RoutePlan | None:
    """Every token of a routed request in this step; a decision when k more were generated."""
    every = None if state.router is None else state.router.config.redecide_every
    if every is None or request_id not in state.routed or not state.scheduler_here:
        return None
    generated = computed + sched - prompt  # output tokens up to this step's last input
    return RoutePlan(index, request_id, start, start + sched,
                     final=generated > 0 and generated % every == 0, whole=False, redecide=True)


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
    value = carried_hash(request.sampling_params)
    if value is not None:
        entry = state.registry.lookup(value)
        path = None if entry is None else entry.path
        return ("molcap_routed", value, *adapter_version(path or "")), path
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


def _make_schedule(original):
    def schedule(self, *args, **kwargs):
        # Recompute requests can be applied in this process; not tested with async scheduling
        # or speculative decoding (in-flight tokens), so not offered there.
        config = self.vllm_config
        get_state().scheduler_here = (not self.scheduler_config.async_scheduling
                                      and config.speculative_config is None)
        return original(self, *args, **kwargs)

    return schedule


def _make_update_from_output(original):
    def update_from_output(self, scheduler_output, model_runner_output):
        state = get_state()
        switched = {r: v for r, v in state.recompute.items()
                    if r in scheduler_output.num_scheduled_tokens}
        index = model_runner_output.req_id_to_index
        for request_id in switched:  # its token was sampled under the adapter it leaves
            if request_id in index and model_runner_output.sampled_token_ids:
                model_runner_output.sampled_token_ids[index[request_id]] = []
        outputs = original(self, scheduler_output, model_runner_output)
        for request_id, value in switched.items():
            del state.recompute[request_id]
            request = self.requests.get(request_id)
            if request is not None and not request.is_finished() and request in self.running:
                _switch(self, request, value, state)
        return outputs

    return update_from_output


def _switch(scheduler, request, value: int, state) -> None:
    """Preempt `request` and resume it under the adapter of `value` (recomputed from token 0)."""
    import time

    entry = state.registry.lookup(value)
    scheduler.running.remove(request)
    scheduler._preempt_request(request, time.monotonic())
    request.lora_request = None if entry is None else _lora_request(entry)
    request.block_hashes = []  # rehashed under the adapter: its blocks are that adapter's now
    request.update_block_hashes()


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
    from vllm.v1.core.sched import scheduler

    _wrap(scheduler.Scheduler, "schedule", _make_schedule)
    _wrap(scheduler.Scheduler, "update_from_output", _make_update_from_output)
    for module in (kv_cache_utils, block_pool):
        _wrap(module, "generate_block_hash_extra_keys", _make_extra_keys)
