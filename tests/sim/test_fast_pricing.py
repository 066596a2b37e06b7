"""The fast pricer prices a full-layer step's non-attention terms from its counts alone
(`sim.cost.cost_model.predict_counted_step`): bit for bit what the step's own batch gives, for
every adapter kind, model and coefficient that makes those terms depend on the batch."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.cost.cost_model import DEFAULT_COEFFS, predict_step
from sim.engine.run_pricing import non_attention_s
from sim.engine.sequence import Sequence
from sim.engine.step_plan import StepPlan
from sim.engine.step_pricer import StepPricer
from sim.simulate import create_profile

# Every term a count reaches switched on: LoRA kernel grid, per-token gathers, slice launches,
# per-layer, per-sequence and prompt overheads.
EVERY_TERM = dict(lora_kernel_step_s=3e-5, lora_idle_shrink_program_s=2e-8,
                  lora_idle_expand_program_s=3e-8, lora_working_program_s=5e-8,
                  lora_working_mac_s=2e-17,
                  lora_slice_launch_s=1e-6, lora_token_gather_share=0.7, layer_overhead_s=2e-6,
                  per_sequence_overhead_s=1.3e-5, prompt_step_overhead_s=4e-4)

CASES = {
    # name: (strategy kind, model, gpu, extra strategy fields)
    "lora": ("multi_lora", None, "H100-SXM", {}),
    "preft (decodes unadapted)": ("preft", None, "H100-SXM", {}),
    "no adapters": ("base", None, "H100-SXM", {}),
    "direft": ("preft", None, "H100-SXM", {"adapter_kind": "direft"}),
    "moe": ("mol", "moe-78", "H200", {}),
    "ced, tp 8": ("contextual_mol", None, "H200", {}),
    "cpu": ("multi_lora", "vllm-tiny-llama", "cpu", {}),
}


def _pricer(name: str, **coeffs) -> StepPricer:
    kind, model, gpu, fields = CASES[name]
    config = small_config(kind, model=model, gpu=gpu, strategy_fields=fields, max_loras=4,
                          max_lora_rank=16)
    base = DEFAULT_COEFFS["cpu"] if gpu == "cpu" else config.coeffs
    coeffs = base.model_copy(update=coeffs)
    return StepPricer(coeffs, create_profile(config), replay_first_layer=0,
                      num_decode_compute_tokens=1, num_tokens_per_decode_step=1, is_fast=True)


def _plan(rng, num_prefills: int, num_decodes: int, num_adapters: int) -> StepPlan:
    def seq(i: int, prompt: int, computed: int, generated: int) -> Sequence:
        return Sequence(seq_id=i, hop="answer", adapter=int(rng.integers(-1, num_adapters)),
                        kv_namespace=0, num_prompt_tokens=prompt,
                        num_output_tokens=int(rng.integers(0, 3)) * 50, submit_s=0.0,
                        num_computed_tokens=computed, num_generated_tokens=generated,
                        is_decode_adapted=bool(rng.integers(0, 2)),
                        is_prefill_adapted=bool(rng.integers(0, 2)))

    prefills = []
    for i in range(num_prefills):
        prompt = int(rng.integers(1, 5000))
        computed = int(rng.integers(0, prompt))
        prefills.append((seq(i, prompt, computed, 0), int(rng.integers(1, prompt - computed + 1))))
    decodes = [seq(num_prefills + i, int(rng.integers(1, 3000)), 0, 1) for i in range(num_decodes)]
    for s in decodes:
        s.num_computed_tokens = s.num_prompt_tokens
    return StepPlan(prefills=prefills, decodes=decodes,
                    num_routing_decisions=int(rng.integers(0, 2)))


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("coeffs", ("defaults", "every term"))
def test_counts_price_a_plain_step_as_its_own_batch(name, coeffs):
    rng = np.random.default_rng(len(name))
    for trial in range(40):
        pricer = _pricer(name, **(EVERY_TERM if coeffs == "every term" else {}))
        plan = _plan(rng, int(rng.integers(0, 4)), int(rng.integers(0 if trial else 1, 300)),
                     int(rng.integers(1, 40)))
        if plan.is_empty:
            continue
        key = pricer._plan_key(plan)
        assert pricer._is_plain(plan) and key[0] <= pricer._max_exact_tokens
        expected = non_attention_s(predict_step(pricer.coeffs, pricer.profile, pricer.batch(plan)))
        assert pricer._cached_non_attention_s(plan) == expected, (trial, key)


def test_widths_that_are_not_whole_numbers_price_the_steps_own_batch():
    # Sums over items of such widths round differently by item: the counts cannot stand in.
    import dataclasses

    pricer = _pricer("lora", **EVERY_TERM)
    widths = pricer.profile.lora_wrapped_in_prefix + 0.5
    profile = dataclasses.replace(pricer.profile, lora_wrapped_in_prefix=widths)
    pricer = StepPricer(pricer.coeffs, profile, replay_first_layer=0, num_decode_compute_tokens=1,
                        num_tokens_per_decode_step=1, is_fast=True)
    assert pricer._max_exact_tokens == 0
    plan = _plan(np.random.default_rng(0), 2, 30, 8)
    expected = non_attention_s(predict_step(pricer.coeffs, profile, pricer.batch(plan)))
    assert pricer._cached_non_attention_s(plan) == expected
