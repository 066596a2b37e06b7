"""In-engine routing in the served model: the router built from the config, the layer-k hook.

During the normal prefill a forward hook on decoder layer k mean-pools each routed request's
prompt tokens (vLLM keeps `hidden + residual` un-added; the hook adds them), lets engine_ext's
pointer head choose, writes the decision and re-points the request's LoRA mapping before layer
k+1 runs. Needs eager mode (guards.py refuses routing otherwise).
"""

from __future__ import annotations

from pathlib import Path

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
    """After layer k: route the requests whose prompt ends in this step, re-point their LoRA."""
    from vllm.lora.layers import LoRAMapping

    from engine_ext.vllm_plugin.patches import step_mapping

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
    prompt_map, token_map, _ = step_mapping(state, step)
    manager = state.runner.lora_manager._adapter_manager
    manager.set_adapter_mapping(LoRAMapping(token_map, prompt_map, is_prefill=True,
                                            type=step.mapping_type))
    return None
