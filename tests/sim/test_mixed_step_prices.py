"""The fast path prices steps holding re-encodes, replays and partial-layer prefills from a table
of non-attention seconds keyed by counts: steps that differ in anything those seconds depend on
must get their own entry (each priced here equals `predict_step` on its own batch, bit for
bit)."""

import dataclasses

import pytest
from sim_configs import small_config

from sim.cost.cost_model import predict_step
from sim.engine.sequence import Sequence
from sim.engine.step_plan import StepPlan
from sim.engine.step_pricer import StepPricer
from sim.simulate import create_profile


def _seq(seq_id: int, adapter: int, computed: int, **fields) -> Sequence:
    return Sequence(seq_id=seq_id, hop="answer", adapter=adapter, kv_namespace=adapter,
                    num_prompt_tokens=computed, num_output_tokens=64, submit_s=0.0,
                    num_computed_tokens=computed, num_generated_tokens=1, **fields)


def _base_plan() -> StepPlan:
    """A CED turn's step: a prompt chunk after a cached prefix that re-encodes its window, a
    switch's replay, and decodes."""
    turn = Sequence(seq_id=10, hop="answer", adapter=2, kv_namespace=2, num_prompt_tokens=900,
                    num_output_tokens=64, submit_s=0.0, num_computed_tokens=640,
                    num_reencode_tokens=128, num_reencode_context_tokens=640)
    switch = _seq(11, 3, 700, num_replay_tokens=128, num_replay_context_tokens=512)
    decodes = [_seq(i, i % 2, 1000 + 37 * i) for i in range(4)]
    return StepPlan(prefills=[(turn, 260)], decodes=decodes, replays=[switch], reencodes=[turn])


def _variants(replay_first_layer: int) -> dict[str, StepPlan]:
    """The base step and steps that each change one thing the non-attention terms read."""
    plans = {"base": _base_plan()}
    plan = _base_plan()
    for seq in plan.decodes:
        seq.adapter = 0  # same tokens, three distinct adapters instead of four
    plans["fewer adapters"] = plan
    plan = _base_plan()
    plan.prefills[0][0].num_prompt_tokens = 2000  # the chunk no longer ends the prompt
    plans["chunk does not sample"] = plan
    plan = _base_plan()
    plan.prefills[0][0].last_layer = 12  # a pass over the first layers only
    plans["partial-layer prefill"] = plan
    plan = _base_plan()
    plan.reencodes[0].is_prefill_adapted = False
    plans["unadapted prompt and re-encode"] = plan
    plan = _base_plan()
    plan.replays = []
    plan.decodes.append(_seq(12, 3, 700))  # the replayed sequence decodes instead
    plans["replay becomes a decode"] = plan
    plan = _base_plan()
    switch = plan.replays.pop()  # the same tokens on the same layers as a prompt chunk: one
    switch.first_layer, switch.num_prompt_tokens = replay_first_layer, 10_000  # one more seq
    plan.prefills.append((switch, 128))
    plans["replay becomes a prompt chunk"] = plan
    plan = _base_plan()
    turn = plan.prefills[0][0]  # a one-token chunk that samples: a decode but for the prompt
    turn.num_prompt_tokens = turn.num_computed_tokens + 1  # (it pays prompt_step_overhead_s)
    plan.prefills[0] = (turn, 1)
    plan.decodes.pop()
    plans["one-token prompt chunk"] = plan
    plan = _base_plan()
    plan.decodes.append(_seq(13, 2, 640))  # the same counts as the chunk above, as a decode
    plan.decodes.pop(0)
    plan.prefills = []
    plans["one-token prompt chunk as a decode"] = plan
    plans["routing decision"] = dataclasses.replace(_base_plan(), num_routing_decisions=1)
    return plans


@pytest.mark.parametrize("order", ("base first", "base last"))
def test_each_mixed_step_is_priced_as_its_own_batch(order):
    config = small_config("contextual_mol")
    coeffs = config.coeffs.model_copy(update={"prompt_step_overhead_s": 1e-3})
    profile = create_profile(config)
    assert profile.num_layers > 12 and profile.adapter_kind == "lora"
    rfl = config.arch.ced.num_encoder_layers
    fast = StepPricer(coeffs, profile, replay_first_layer=rfl, num_decode_compute_tokens=1,
                      num_tokens_per_decode_step=1, is_fast=True)
    plans = list(_variants(rfl).items())
    if order == "base last":
        plans.reverse()
    for name, plan in plans:
        expected = predict_step(coeffs, profile, fast.batch(plan)).total_s
        assert fast.step_s(plan) == expected, name
    assert fast.num_predict_calls == len(plans)  # one table entry per variant
    assert fast.step_s(_base_plan()) == predict_step(
        coeffs, profile, fast.batch(_base_plan())).total_s
    assert fast.num_predict_calls == len(plans)  # the base step again: from the table
