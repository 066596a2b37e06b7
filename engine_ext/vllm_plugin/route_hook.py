"""In-engine routing in the served model: the router built from the config, the layer-k hook.

During the normal prefill a forward hook on decoder layer k keeps each routing candidate's
layer-k states (vLLM keeps `hidden + residual` un-added; the hook adds them). When its prompt
ends in the step, engine_ext's pointer head chooses on the mean of all its prompt states and the
decision is written. A prompt that was all in this step is re-pointed to the decision before
layer k+1 runs; one that took several steps ran the layers above k of its earlier chunks under
no adapter, so it is recomputed under the decision (the scheduler patch preempts and resumes
it). With `redecide_every: k` a routed request is routed again every k generated tokens on all
its tokens so far, and recomputed under a changed decision. Needs eager mode (guards.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine_ext.lora import LoraSpec
from engine_ext.peft_io import CONFIG_NAME, read_adapter_config
from engine_ext.vllm_plugin.guards import ROUTING
from engine_ext.vllm_plugin.runtime import get_state


def check_above_route_layer(path: str, route_layer: int) -> None:
    """Routed adapters must sit only above layer k (the pooled state is then adapter-free)."""
    spec: LoraSpec = read_adapter_config(Path(path) / CONFIG_NAME)
    if spec.layers is None or min(spec.layers) <= route_layer:
        raise ValueError(f"{path}: routed adapters must set layers_to_transform above route "
                         f"layer {route_layer}, got {spec.layers}")


def ensure_router(runner, state) -> None:
    """Build the router (and its layer-k hook) once per config, from the served model."""
    config = state.config.router
    if (config is None or state.router is not None or not hasattr(runner, "model")
            or not state.support.allows(ROUTING)):
        return
    from engine_ext.vllm_plugin.router import InEngineRouter

    for option in config.options:
        entry = state.entry_by_name(option.adapter)
        if entry is not None:
            check_above_route_layer(entry.path, config.route_layer)
    model = runner.get_model()
    embed = model.model.embed_tokens
    embed = getattr(embed, "base_layer", embed)
    d_model = runner.model_config.get_hidden_size()
    state.router = InEngineRouter(config, embed, d_model)
    layer = model.model.layers[config.route_layer]
    if not getattr(layer, "_molcap_route_hook", False):
        layer.register_forward_hook(on_route_layer)
        layer._molcap_route_hook = True
    state.route_module, state.runner = layer, runner


def on_route_layer(module, args, output):
    """After layer k: pool the routed requests' states; decide where a decision is due."""
    from vllm.lora.layers import LoRAMapping

    from engine_ext.vllm_plugin.mapping import step_mapping

    state = get_state()
    step = state.step
    if step is None or not step.routes or module is not state.route_module:
        return None
    hidden, residual = output
    # vLLM's layers hand the residual to the next norm un-added; the layer output is their sum.
    stream = hidden if residual is None else hidden + residual  # [N, D]
    repoint = False
    for plan in step.routes:
        chunks = state.pooled.setdefault(plan.request_id, [])
        chunks.append(stream[plan.token_start : plan.token_end].detach().clone())
        if plan.final:
            repoint |= _decide(state, step, plan, torch.cat(chunks))
    step.routes = []
    if repoint:
        prompt_map, token_map, _ = step_mapping(state, step)
        manager = state.runner.lora_manager._adapter_manager
        manager.set_adapter_mapping(LoRAMapping(token_map, prompt_map, is_prefill=True,
                                                type=step.mapping_type))
    return None


def _decide(state, step, plan, states: torch.Tensor) -> bool:
    """Route one request on its layer-k states; True when this step's mapping must change."""
    name = state.router.choose(states)
    redecide = state.router.config.redecide_every is not None
    if not redecide:
        state.pooled.pop(plan.request_id, None)
    entry = state.entry_by_name(name)
    if plan.redecide and (0 if entry is None else entry.hash) == state.routed[plan.request_id]:
        return False  # the same adapter again: nothing changes
    value = state.write_decision(plan.request_id, name)
    if redecide:
        state.routed[plan.request_id] = value
    if not plan.whole:
        state.request_recompute(plan.request_id, value)
        return False
    # The prefill side applies its own decision above k; later steps read the hash back.
    step.req_lora_ids[plan.index] = value
    return True
