"""The engine's step when its decoding sequences are one group (`sim.engine.decode_group`):
what `Engine._schedule_running` plans, walking only the sequences whose state changes (the
members that need a block, the prompt chunks after them), preemptions included."""

from __future__ import annotations

from sim.engine.sequence import Sequence
from sim.engine.step_plan import StepPlan

# `engine` below is the `sim.engine.scheduler.Engine` that calls these (not imported: it
# imports this module).


def schedule_group(engine, plan: StepPlan, budget: int) -> int | None:
    """`_schedule_running` when the group's members come first in running order and all fit
    the budget: the members decode as one and only the sequences after them (prompt chunks)
    are walked; a step short of blocks goes to `schedule_group_preempting`. The budget left,
    or None to let `_schedule_running` walk the batch (the group dissolved)."""
    group, running, bs = engine.group, engine.running, engine.block_size
    members, cost = group.members, engine.num_decode_compute_tokens
    m = len(members)
    if m * cost > budget or running[:m] != members:
        return None
    full_budget = budget
    budget -= m * cost
    needs = group.step_block_needs()
    total = sum(n for _, n in needs)
    chunks = []
    for seq in running[m:]:
        pending = seq.num_prompt_tokens + seq.num_generated_tokens - seq.num_computed_tokens
        if seq.num_generated_tokens and pending == 1:
            return None  # a decode outside the group (one the budget skipped)
        num_new = min(pending, budget)
        if num_new <= 0:
            continue
        need = -(-(seq.num_computed_tokens + num_new) // bs) - seq.num_blocks
        chunks.append((seq, num_new, need))
        total += max(need, 0)
        budget -= num_new
    if total > engine.kv.num_free:
        return engine._schedule_group_preempting(plan, full_budget, needs)
    for seq, num_new, need in chunks:
        if need > 0:
            seq.num_blocks += need
        plan.prefills.append((seq, num_new))
        engine._note_prompt_end(seq, num_new, plan)
    group.add_blocks(needs)
    engine.kv.allocate(total)
    plan.decodes = list(members)
    plan.group, plan.num_group_decodes = group, m
    return budget


def schedule_group_preempting(engine, plan: StepPlan, budget: int,
                              needs: list[tuple[Sequence, int]]) -> int:
    """`_schedule_running` for a step that must preempt, the group kept: members that need
    a block are walked in running order (the others take none and preempt nothing), then
    the prompt chunks after them, preempting from the back of the running list as the walk
    does; a preempted member leaves the group first. Blocks are allocated at the same
    points as the walk's, so that the cache evicts the same blocks."""
    group, running, kv, bs = engine.group, engine.running, engine.kv, engine.block_size
    orders = engine._orders
    unallocated = 0
    for seq, need in sorted((e for e in needs if e[1] > 0), key=lambda e: orders[e[0]]):
        if seq not in group:
            break  # preempted from the back: so are the members after it
        unallocated = engine._preempt_to_fit(seq, need, unallocated, plan)
    m = len(group.members)
    budget -= m * engine.num_decode_compute_tokens
    i = m
    while i < len(running):  # prompt chunks (a decode here dissolved the group)
        seq = running[i]
        num_new = min(seq.num_prompt_tokens + seq.num_generated_tokens
                      - seq.num_computed_tokens, budget)
        if num_new <= 0:
            i += 1
            continue
        need = -(-(seq.num_computed_tokens + num_new) // bs) - seq.num_blocks
        if need > 0:
            unallocated = engine._preempt_to_fit(seq, need, unallocated, plan)
            if not unallocated:
                continue
            seq.num_blocks += need
        plan.prefills.append((seq, num_new))
        engine._note_prompt_end(seq, num_new, plan)
        budget -= num_new
        i += 1
    kv.allocate(unallocated)
    group.add_blocks([(seq, need) for seq, need in needs if seq in group])
    plan.decodes = list(group.members)
    plan.group, plan.num_group_decodes = group, m
    return budget
