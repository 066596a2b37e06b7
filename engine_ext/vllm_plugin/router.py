"""The in-engine router: engine_ext's MoL2 pointer head over the layer-k hidden state.

Option embeddings are computed once when the model is loaded (and again only when the config's
options change); a decision costs one mean-pool and one small head forward per routed request.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from safetensors.torch import load_file

from engine_ext.routing import PointerHead, Router
from engine_ext.vllm_plugin.config import RouterConfig


def create_pointer_head(config: RouterConfig, d_model: int) -> PointerHead:
    """A PointerHead shaped as `config` says for a model of width d_model (weights not loaded)."""
    return PointerHead(d_model, d_model, d_head=config.d_head, num_heads=config.num_heads,
                       option_depth=config.option_depth)


class InEngineRouter:
    """Chooses an adapter name (or None) from a request's layer-k hidden states."""

    def __init__(self, config: RouterConfig, embed: Callable[[torch.Tensor], torch.Tensor],
                 d_model: int) -> None:
        self.config = config
        head = create_pointer_head(config, d_model)
        head.load_state_dict(load_file(config.head_path))
        head.eval()

        def embed_float(ids: torch.Tensor) -> torch.Tensor:
            # The head runs in float32 whatever the serving dtype.
            return embed(ids.reshape(-1)).float().reshape(*ids.shape, -1)

        self.router = Router.create(head, embed_float,
                                    [o.description_token_ids for o in config.options],
                                    [o.adapter for o in config.options])

    def choose(self, hidden: torch.Tensor) -> str | None:
        """hidden [T, D]: layer-k output of the request's prompt tokens -> adapter name."""
        return self.router.route(hidden[None].float())[0]
