"""DiReFT and DiReFT_P inside vLLM: engine_ext's residual edit applied by decoder-layer hooks.

A request names a DiReFT adapter directory with an ordinary `LoRARequest`. The runner patch takes
such requests out of vLLM's LoRA path (their tokens get LoRA id 0, their adapter no LoRA slot)
and lists, per step, the tokens each DiReFT adapter edits: its request's tokens, prompt positions
only when prefill-only (engine_ext's `build_token_slots` rule, the same as LoRA_P), inside the
adapter's position window (`engine_ext.reft.in_window`). A forward hook on each decoder layer
adds `engine_ext.reft.direft_delta` of the layer output to those rows. vLLM's layers hand
`(hidden, residual)` un-added to the next norm; the edit reads their sum and is added to hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine_ext.reft import ReftWeights, direft_delta, in_window
from engine_ext.reft_io import load_reft_adapter
from engine_ext.vllm_plugin.adapters import Version, adapter_version


@dataclass(frozen=True)
class ModelShape:
    """What a DiReFT file is checked against."""

    hidden_size: int
    num_layers: int
    base_model: str
    max_rank: int


class ReftStore:
    """DiReFT adapters loaded in this process, by path, reloaded when their files change."""

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[Version, ReftWeights]] = {}

    def get(self, path: str, shape: ModelShape) -> ReftWeights:
        """The adapter at `path`, validated against `shape` (AdapterLoadError when it is bad)."""
        version = adapter_version(path)
        cached = self._loaded.get(path)
        if cached is None or cached[0] != version:
            weights = load_reft_adapter(path, hidden_size=shape.hidden_size,
                                        num_layers=shape.num_layers, base_model=shape.base_model,
                                        max_rank=shape.max_rank)
            self._loaded[path] = (version, weights)
        return self._loaded[path][1]


@dataclass
class ReftStep:
    """The DiReFT edits of one step: per adapter, its weights and the flat token rows it edits."""

    edits: list[tuple[ReftWeights, torch.Tensor]]

    def layers(self) -> set[int]:
        """Layers any edit of this step touches."""
        return {layer for weights, _ in self.edits for layer in weights.tensors}


def reft_rows(token_map: np.ndarray, positions: np.ndarray, prompt_lens: np.ndarray,
              lora_id: int, weights: ReftWeights) -> torch.Tensor:
    """Flat token rows edited by adapter `lora_id` this step.

    token_map [N]: lora id per token with prefill-only adapters already masked past the prompt;
    positions, prompt_lens [N]: absolute position and prompt length of each token.
    """
    mine = torch.from_numpy(token_map == lora_id)
    window = in_window(weights.spec.window, torch.from_numpy(positions),
                       torch.from_numpy(prompt_lens))
    return (mine & window).nonzero().squeeze(1)


def apply_edits(layer_index: int, step: ReftStep | None, output):
    """Forward-hook body for decoder layer `layer_index`: the edited (hidden, residual)."""
    if step is None or not step.edits:
        return None
    hidden, residual = output
    stream = hidden if residual is None else hidden + residual  # [N, D] layer output
    edited = hidden
    for weights, rows in step.edits:
        parts = weights.tensors.get(layer_index)
        if parts is None or rows.numel() == 0:
            continue
        a, b, bias = (p.to(stream.device, stream.dtype) for p in parts)
        rows = rows.to(stream.device)
        edited = edited.index_add(0, rows, direft_delta(stream[rows], a, b, bias))
    return None if edited is hidden else (edited, residual)
