"""GPU LoRA kernel grid (sim.cost.lora_kernels) and its cost terms, on hand-computed cases.

Llama-3.1-8B with every module wrapped: per layer 7 shrink slices; expand blocks of 128 columns
per slice over each fused call's widest slice: qkv 3 x 4096/128 = 96, o 32, gate_up
2 x 14336/128 = 224, down 32, so 384 per layer, 12,288 over 32 layers.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.cost.cost_model import CostCoeffs, create_step_batch, predict_step
from sim.cost.layer_costs import create_layer_costs
from sim.cost.lora_kernels import lora_program_counts, lora_working_macs, programs_per_slot
from sim.hardware.catalogue import get_gpu, get_model

LLAMA = get_model("llama-3.1-8b")
GPU = get_gpu("H100-64GB")


def lora_profile(max_loras: int, rank: int = 8, **kw):
    return create_layer_costs(LLAMA, GPU, adapter_kind="lora", adapter_rank=rank,
                               max_loras=max_loras, **kw)


def test_grid_of_llama_counts_slices_and_expand_blocks():
    grid = lora_profile(300).lora_grid
    assert (grid.num_shrink_slices, grid.num_expand_blocks, grid.num_slots) == (224, 12288, 301)


def test_programs_per_slot_by_hand():
    grid = lora_profile(8).lora_grid
    # One token (split-K 64): shrink 64 x 1 token block x 1 rank block per slice.
    shrink, expand = programs_per_slot(grid, 1, np.array([1]), rank=8)
    assert (shrink[0], expand[0]) == (64 * 224, 12288)
    # 220 tokens (split-K 8): 7 token blocks of 32 for the shrink, 4 of 64 for the expand;
    # rank 32 needs two 16-wide rank blocks.
    shrink, expand = programs_per_slot(grid, 220, np.array([220]), rank=32)
    assert (shrink[0], expand[0]) == (8 * 7 * 2 * 224, 4 * 12288)


def test_idle_programs_span_every_slot_and_working_ones_each_adapter():
    grid = lora_profile(300).lora_grid
    # 220 decode tokens over 2 adapters (110 each): each adapter computes 4 shrink token blocks
    # (split-K 8) and 2 expand token blocks.
    idle_s, idle_e, working = lora_program_counts(grid, 220, np.array([110.0, 110.0]), 8)
    busy_s, busy_e = 2 * 8 * 4 * 224, 2 * 2 * 12288
    assert working == busy_s + busy_e
    assert idle_s == 301 * 8 * 7 * 224 - busy_s
    assert idle_e == 301 * 4 * 12288 - busy_e


COEFFS = CostCoeffs(lora_kernel_step_s=1e-4, lora_idle_shrink_program_s=1e-10,
                    lora_idle_expand_program_s=1e-9, lora_working_program_s=2e-8)


def step_s(profile, num_adapters: int, batch: int = 220, coeffs=COEFFS, adapted=True) -> float:
    ids = [i % num_adapters for i in range(batch)] if num_adapters else [-1] * batch
    b = create_step_batch([1] * batch, [50] * batch, num_layers=LLAMA.num_layers,
                          adapter_ids=ids, is_adapted=[adapted] * batch)
    return predict_step(coeffs, profile, b).total_s


def test_step_time_grows_with_max_loras_itself():
    # The same batch of base-model tokens: only the slots differ. vLLM 0.8.5 runs the kernels
    # for unadapted tokens too; each extra slot adds its idle programs at M = 1.
    small, large = step_s(lora_profile(16), 0, batch=1), step_s(lora_profile(32), 0, batch=1)
    per_slot = 64 * 224 * 1e-10 + 12288 * 1e-9
    assert large - small == pytest.approx(16 * per_slot, rel=1e-9)


def test_adapter_path_skipped_when_no_token_is_adapted_under_preft():
    profile = lora_profile(32, lora_kernels_run_unadapted=False)
    base = create_layer_costs(LLAMA, GPU)
    assert step_s(profile, 3, adapted=False) == pytest.approx(step_s(base, 0), rel=1e-12)
    assert step_s(profile, 3) > step_s(base, 0)


def test_distinct_adapters_add_working_programs_linearly_at_decode():
    profile = lora_profile(300)
    t = [step_s(profile, n) for n in (55, 110, 165)]
    # Each adapter with 1-4 tokens computes one token block: the same programs each.
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-9)
    assert t[1] > t[0]


def test_zero_coefficients_leave_the_step_unchanged():
    zero = CostCoeffs()
    assert step_s(lora_profile(300), 5, coeffs=zero) == step_s(lora_profile(0), 5, coeffs=zero)


def test_working_macs_of_llama_by_hand():
    grid = lora_profile(8).lora_grid
    # Shrink K summed over the 7 slices of a layer: q, k, v, o, gate, up read the 4,096-wide
    # hidden state, down the 14,336-wide intermediate one; 32 layers.
    assert grid.shrink_k_total == 32 * (6 * 4096 + 14336)
    # One token of one adapter at rank 8: one 32 x 16 shrink tile over every slice's K, and
    # one 64 x 128 expand tile per output block over the rank padded to the K block of 16.
    shrink = 32 * 16 * grid.shrink_k_total
    expand = 12288 * 64 * 128 * 16
    assert lora_working_macs(grid, np.array([1.0]), 8) == shrink + expand
    # Rank 32: two 16-wide rank blocks in the shrink, K of 32 in the expand; 40 tokens: two
    # shrink token blocks of 32, one expand block of 64.
    assert lora_working_macs(grid, np.array([40.0]), 32) == 2 * 2 * shrink + 2 * expand


def lora_seconds(coeffs: CostCoeffs, num_step_tokens: int) -> float:
    """LoRA seconds of a step where one token runs adapter 0 and the rest no adapter."""
    ids = [0] + [-1] * (num_step_tokens - 1)
    batch = create_step_batch([1] * num_step_tokens, [50] * num_step_tokens,
                              num_layers=LLAMA.num_layers, adapter_ids=ids)
    return predict_step(coeffs, lora_profile(8), batch).lora_s


def test_work_term_follows_the_shrink_programs_work_not_their_count():
    # At 128 tokens vLLM 0.8.5 splits the shrink's K 8 ways instead of 64: an adapter's shrink
    # launches 8 times fewer programs, each with 8 times the work.
    per_program = CostCoeffs(lora_working_program_s=1e-8)
    drop = lora_seconds(per_program, 127) - lora_seconds(per_program, 128)
    assert drop == pytest.approx((64 - 8) * 224 * 1e-8, rel=1e-9)
    per_mac = CostCoeffs(lora_working_mac_s=1e-16)
    assert lora_seconds(per_mac, 127) == pytest.approx(lora_seconds(per_mac, 128), rel=1e-12)
    assert lora_seconds(per_mac, 127) - lora_seconds(CostCoeffs(), 127) == pytest.approx(
        1e-16 * lora_working_macs(lora_profile(8).lora_grid, np.array([1.0]), 8), rel=1e-9)
