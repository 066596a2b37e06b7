"""Launch grids of vLLM's GPU LoRA kernels (Punica-style shrink and expand, Triton): how many
kernel programs a step launches, and how many of them compute.

vLLM's V1 LoRA layers run, per layer, one shrink and one expand per fused linear (q/k/v as one
3-slice call, gate/up as one 2-slice call, o and down alone) over the step's whole token batch.
The grid spans every device slot (`max_loras` + 1, the extra one for "no adapter"), every block
of the batch's tokens and every block of the output: a program whose slot holds no token of the
step, or whose token block lies past its slot's tokens, exits at once. So a LoRA-enabled engine
pays for `max_loras` itself even when few adapters run, and each distinct adapter in the step
adds the programs that compute. Block sizes are the engine's default kernel configuration; the
cost model prices the two counts with fitted seconds per program (`sim.cost.coeffs`), and a
computing program also by its work: the shrink splits its reduction over the slice's input
width K into `split_k` programs (64 under 128 tokens, 8 above), so one of its programs reduces
over K / split_k, while an expand program reduces over the rank (padded to its 16-wide K block).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"),
                ("down_proj",))
"""Modules vLLM wraps as one LoRA layer (one shrink and one expand call with several slices)."""


@dataclass(frozen=True)
class LoraKernelConfig:
    """Tile sizes of the shrink and expand kernels (vLLM 0.8.5's defaults when no tuned config
    file exists: `lora/ops/triton_ops/utils.py`, `get_v1_op_configs`)."""

    shrink_block_m: int = 32
    shrink_block_n: int = 16
    shrink_split_k_small: int = 64
    """Split-K of the shrink for batches under `shrink_split_k_batch` tokens."""
    shrink_split_k_large: int = 8
    shrink_split_k_batch: int = 128
    expand_block_m: int = 64
    expand_block_n: int = 128
    expand_block_k: int = 16
    """The expand's K block: the rank is reduced in blocks of 16 (rank 8 computes a padded 16)."""


VLLM_085_KERNELS = LoraKernelConfig()


@dataclass(frozen=True, eq=False)
class LoraGrid:
    """Per-slot program counts of one model's wrapped layers, summed over layers."""

    num_shrink_slices: int
    """Slices the shrink kernels run, all layers (7 per layer when every module is wrapped)."""
    num_expand_blocks: int
    """Output blocks the expand kernels run per token block, all layers (each fused call's
    grid spans its widest slice for every slice)."""
    num_slots: int
    """Slots the grid spans: max_loras + 1."""
    shrink_k_total: int = 0
    """Input widths (the shrink's K) summed over the shrink slices, all layers."""
    config: LoraKernelConfig = VLLM_085_KERNELS


def create_lora_grid(shapes: dict[tuple[int, str], tuple[int, int]], max_loras: int,
                     config: LoraKernelConfig = VLLM_085_KERNELS) -> LoraGrid:
    """The grid of the wrapped (layer, module) -> (in, out) shapes on an engine with
    `max_loras` device slots."""
    layers = sorted({layer for layer, _ in shapes})
    slices, blocks, k_total = 0, 0, 0
    for layer in layers:
        for group in FUSED_GROUPS:
            present = [shapes[(layer, m)] for m in group if (layer, m) in shapes]
            if present:
                slices += len(present)
                blocks += len(present) * -(-max(out for _, out in present)
                                           // config.expand_block_n)
                k_total += sum(width_in for width_in, _ in present)
    return LoraGrid(slices, blocks, max_loras + 1 if shapes else 0, k_total, config)


def programs_per_slot(grid: LoraGrid, num_step_tokens: int, num_tokens: np.ndarray,
                      rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(shrink, expand) programs launched for a slot holding `num_tokens` (array; a fraction
    counts as a started block) of a step of `num_step_tokens` tokens (the shrink's split-K
    follows the step's batch)."""
    c = grid.config
    split_k = c.shrink_split_k_small if num_step_tokens < c.shrink_split_k_batch \
        else c.shrink_split_k_large
    n = np.asarray(num_tokens, dtype=float)
    shrink = split_k * np.ceil(n / c.shrink_block_m) * -(-rank // c.shrink_block_n)
    return shrink * grid.num_shrink_slices, np.ceil(n / c.expand_block_m) * grid.num_expand_blocks


def lora_program_counts(grid: LoraGrid, num_step_tokens: int, tokens_per_adapter: np.ndarray,
                        rank: int) -> tuple[float, float, float]:
    """(idle shrink, idle expand, working) programs of one step: the grid launches every slot
    over the whole batch's token blocks; the programs over an adapter's own tokens compute,
    the rest exit at once."""
    if grid.num_slots == 0 or num_step_tokens == 0:
        return 0.0, 0.0, 0.0
    shrink, expand = programs_per_slot(grid, num_step_tokens, np.array([num_step_tokens]), rank)
    busy_shrink, busy_expand = programs_per_slot(grid, num_step_tokens, tokens_per_adapter, rank)
    idle_shrink = grid.num_slots * float(shrink[0]) - float(busy_shrink.sum())
    idle_expand = grid.num_slots * float(expand[0]) - float(busy_expand.sum())
    return (max(idle_shrink, 0.0), max(idle_expand, 0.0),
            float(busy_shrink.sum() + busy_expand.sum()))


def lora_working_macs(grid: LoraGrid, tokens_per_adapter: np.ndarray, rank: int) -> float:
    """Multiply-accumulates of one step's computing programs, tile by tile (a started token
    block computes a whole tile): a shrink program's block_m x block_n tile over its K /
    split_k share of each slice's input width, an expand program's block_m x block_n tile over
    the rank padded to the K block. The shrink's total does not depend on split-K: more
    programs, each with less of K."""
    c = grid.config
    n = np.asarray(tokens_per_adapter, dtype=float)
    shrink_tiles = np.ceil(n / c.shrink_block_m).sum() * -(-rank // c.shrink_block_n)
    shrink = shrink_tiles * c.shrink_block_m * c.shrink_block_n * grid.shrink_k_total
    padded_rank = -(-rank // c.expand_block_k) * c.expand_block_k
    expand_tiles = np.ceil(n / c.expand_block_m).sum() * grid.num_expand_blocks
    return float(shrink + expand_tiles * c.expand_block_m * c.expand_block_n * padded_rank)
