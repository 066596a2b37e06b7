"""One replica's scheduler as plain state: continuous batching in the manner of vLLM's.

Each step: running sequences first (decodes and unfinished prefill chunks, in admission order),
preempting the most recently admitted sequence (recompute: its blocks are dropped) when a block
is missing; then, if nothing was preempted, waiting sequences in arrival order while the token
budget, max_num_seqs, KV blocks and adapter slots allow (a sequence whose adapter finds no slot
is skipped, as vLLM does; any other shortage stops admission). `commit` applies a step, or a run
of identical decode steps, after its time has passed. Decoding sequences are kept as one group
(`sim.engine.decode_group`), so that a step walks only the sequences whose state changes; a step the
group cannot plan that way (a preemption, decodes over the token budget) dissolves it and walks
the batch.
"""

from __future__ import annotations

from heapq import heappop, heapreplace

import numpy as np

from sim.config import EngineLimits
from sim.engine.decode_group import DecodeGroup
from sim.engine.group_step import schedule_group, schedule_group_preempting
from sim.engine.sequence import Sequence
from sim.engine.step_plan import StepPlan
from sim.engine.waiting import WaitingQueue
from sim.memory.adapter_slots import NO_ADAPTER, AdapterSlots
from sim.memory.kv_blocks import KvBlockManager


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Engine:
    """Waiting and running sequences, the KV pool and the adapter slots of one replica."""

    def __init__(self, limits: EngineLimits, num_kv_blocks: int, adapter_load_s: list[float],
                 check_invariants: bool = False, adapter_disk_load_s: list[float] | None = None):
        self.limits = limits
        self.check_invariants = check_invariants
        self.block_size = limits.block_size
        self.kv = KvBlockManager(num_kv_blocks, limits.block_size, limits.enable_prefix_caching)
        self.slots = AdapterSlots(
            limits.max_loras, limits.max_cpu_loras, adapter_load_s, adapter_disk_load_s,
            num_preloaded=len(adapter_load_s) if limits.preload_cpu_loras else 0)
        self.running: list[Sequence] = []
        self.waiting = WaitingQueue()
        self.num_tokens_per_decode_step = limits.num_tokens_per_decode_step
        self.num_decode_compute_tokens = 1 + limits.num_speculative_tokens
        self.num_preemptions = 0
        self.group = DecodeGroup(limits.block_size, self.num_tokens_per_decode_step)
        self._orders: dict[Sequence, int] = {}  # running sequence -> admission count
        self._num_admissions = 0
        # Why the last `_admit` stopped: "limits" (budget, max_num_seqs), "waiter" (one did
        # not fit), None (no waiter left it could start).
        self._stop: str | None = None

    @property
    def num_outstanding(self) -> int:
        """Sequences admitted or waiting."""
        return len(self.running) + len(self.waiting)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (FCFS)."""
        self.waiting.append(seq)

    def schedule(self, now: float) -> StepPlan:
        """Choose the next step's work and reserve its KV blocks."""
        plan = StepPlan()
        budget = self.limits.max_num_batched_tokens
        left = self._schedule_group(plan, budget) if self.group.members else None
        if left is None:
            self.group.dissolve()
            left = self._schedule_running(plan, budget, now)
        if plan.num_preempted == 0:
            self._admit(plan, left, now)
        if plan.num_group_decodes:
            plan.decode_contexts = self.group.contexts(plan.decodes[plan.num_group_decodes:])
        return plan

    def _schedule_group(self, plan: StepPlan, budget: int) -> int | None:
        """`_schedule_running` through the decode group: the budget left, or None to walk the
        batch (`sim.engine.group_step.schedule_group`)."""
        return schedule_group(self, plan, budget)

    def _schedule_group_preempting(self, plan: StepPlan, budget: int,
                                   needs: list[tuple[Sequence, int]]) -> int:
        """`sim.engine.group_step.schedule_group_preempting`."""
        return schedule_group_preempting(self, plan, budget, needs)

    def _decode_tokens(self, seq: Sequence) -> int:
        return min(self.num_tokens_per_decode_step,
                   seq.num_output_tokens - seq.num_generated_tokens)

    def _schedule_running(self, plan: StepPlan, budget: int, now: float) -> int:
        bs, kv, running = self.block_size, self.kv, self.running
        decode_cost, adv = self.num_decode_compute_tokens, self.num_tokens_per_decode_step
        # Blocks are taken in one allocation per stretch without preemption: allocations in a
        # row evict the same LRU blocks as one, but a preemption in between releases blocks.
        unallocated = 0
        i = 0
        while i < len(running):
            seq = running[i]
            # Inlined Sequence.num_tokens / is_prefilling: this loop runs for every sequence of
            # every step of the reference path.
            generated = seq.num_generated_tokens
            pending = seq.num_prompt_tokens + generated - seq.num_computed_tokens
            is_prefilling = generated == 0 or pending > 1
            if is_prefilling:
                num_new = cost = min(pending, budget)
            else:
                num_new, cost = min(adv, seq.num_output_tokens - generated), decode_cost
            if num_new <= 0 or cost > budget:
                i += 1
                continue
            need = -(-(seq.num_computed_tokens + num_new) // bs) - seq.num_blocks
            if need > 0:
                unallocated = self._preempt_to_fit(seq, need, unallocated, plan)
                if not unallocated:
                    continue
                seq.num_blocks += need
            if is_prefilling:
                plan.prefills.append((seq, num_new))
                self._note_prompt_end(seq, num_new, plan)
            else:
                plan.decodes.append(seq)
            budget -= cost
            i += 1
        kv.allocate(unallocated)
        return budget

    def _preempt_to_fit(self, seq: Sequence, need: int, unallocated: int,
                        plan: StepPlan) -> int:
        """Make `need` (> 0) more blocks fit for running `seq`, `unallocated` blocks being
        already promised to the sequences before it: if they do not fit, allocate the promised
        ones and preempt from the back of the running list until they do, `seq` itself last.
        The blocks still to allocate, `need` included; 0 when `seq` was preempted."""
        kv = self.kv
        if need > kv.num_free - unallocated:
            kv.allocate(unallocated)
            unallocated = 0
            running = self.running
            while need > kv.num_free and running[-1] is not seq:
                self._preempt(running[-1], plan)
            if need > kv.num_free:
                self._preempt(seq, plan)
                return 0
        return unallocated + need

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        """Recompute preemption: drop the sequence's KV and queue it first (a group member
        leaves the group first)."""
        if seq in self.group:
            self.group.leave(seq)
        if self.running[-1] is seq:  # the usual victim: the last admitted
            self.running.pop()
        else:
            self.running.remove(seq)
        del self._orders[seq]
        self.kv.release(seq.block_runs, seq.num_blocks)
        self.slots.release(seq.adapter)
        seq.block_runs = []
        seq.num_blocks = 0
        seq.num_registered_blocks = 0
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        plan.num_preempted += 1
        self.waiting.appendleft(seq)

    def _note_prompt_end(self, seq: Sequence, num_new: int, plan: StepPlan) -> None:
        if seq.num_computed_tokens + num_new == seq.num_tokens and not seq.is_routing_done:
            plan.num_routing_decisions += seq.num_routing_decisions
            seq.is_routing_done = True

    def _cached_prefix(self, seq: Sequence) -> list[range]:
        if seq.num_computed_tokens or not self.kv.enable_prefix_caching or not seq.is_cacheable:
            return []
        return self.kv.cached_prefix(seq.block_key_runs(
            0, (seq.num_tokens - 1) // self.block_size, self.block_size, self.kv))

    def _admit(self, plan: StepPlan, budget: int, now: float) -> None:
        """Waiting sequences in FCFS order while the budget, max_num_seqs, KV blocks and slots
        allow. Until every slot is pinned any adapter can start, so the queue's head is next;
        from then on the pinned set is fixed for this step and waiters of other adapters are
        skipped (as vLLM skips them): the next is the first waiter of a pinned adapter."""
        waiting, slots, running = self.waiting, self.slots, self.running
        heads = None  # once every slot is pinned: (key, adapter) of each one's first waiter
        self._stop = None
        while waiting:
            if budget <= 0 or len(running) >= self.limits.max_num_seqs:
                self._stop = "limits"
                return
            if heads is None and slots.is_saturated:
                heads = waiting.heads(slots.pinned, NO_ADAPTER)
            if heads is None:
                seq = waiting.first()
            elif heads:
                seq = waiting.first_of(heads[0][1])
            else:
                return
            cost = self._try_admit(seq, plan, budget, now)
            if cost == 0:
                self._stop = "waiter"
                return
            budget -= cost
            if heads is None:
                waiting.popleft()
            elif (next_key := waiting.remove_first_of(seq.adapter)) is None:
                heappop(heads)
            else:
                heapreplace(heads, (next_key, seq.adapter))

    def can_start_during_run(self, seq: Sequence) -> bool:
        """Whether `seq`, queued last while the pure-decode plan last scheduled repeats, could
        start before the run ends (else the run need not be cut). A run keeps the running
        sequences, pinned adapters and token budget and only takes KV blocks, so `seq` cannot
        start when the budget or max_num_seqs stopped admission, when its adapter is skipped,
        or behind a waiter that did not fit and still does not (without prefix caching the
        blocks it needs are fixed)."""
        if self._stop == "limits" or (self._stop == "waiter"
                                      and not self.kv.enable_prefix_caching):
            return False
        slots = self.slots
        return not slots.is_saturated or seq.adapter == NO_ADAPTER or seq.adapter in slots.pinned

    def _try_admit(self, seq: Sequence, plan: StepPlan, budget: int, now: float) -> int:
        """Admit `seq` into this step if everything it needs is free; its token cost, or 0."""
        bs = self.block_size
        hits = self._cached_prefix(seq)
        num_hits = sum(map(len, hits))
        done = num_hits * bs
        if seq.is_kv_preloaded and seq.num_preemptions == 0:
            done = seq.num_tokens - 1  # the prompt's KV arrived with the request
        pending = seq.num_tokens - done
        is_decode = seq.num_generated_tokens > 0 and pending == 1
        num_new = self._decode_tokens(seq) if is_decode else min(pending, budget)
        cost = self.num_decode_compute_tokens if is_decode else num_new
        if cost > budget or (num_new < pending and not self.limits.enable_chunked_prefill):
            return 0
        need = _ceil_div(done + num_new, bs) - num_hits
        if need + self.kv.count_evictable(hits) > self.kv.num_free:
            return 0
        self.kv.acquire_cached(hits)
        self.kv.allocate(need)
        seq.block_runs = hits
        seq.num_blocks = num_hits + need
        seq.num_registered_blocks = num_hits
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_hits * bs
        seq.num_computed_tokens = done
        load_s = self.slots.activate(seq.adapter)
        seq.adapter_load_s += load_s
        plan.adapter_load_s += load_s
        if seq.first_scheduled_s < 0:
            seq.first_scheduled_s = now
        self._rebuild_window(seq, done if not seq.is_kv_preloaded else 0, plan)
        self.running.append(seq)
        self._orders[seq] = self._num_admissions
        self._num_admissions += 1
        plan.num_admitted += 1
        if is_decode:
            plan.decodes.append(seq)
        else:
            plan.prefills.append((seq, num_new))
            self._note_prompt_end(seq, num_new, plan)
        return cost

    @staticmethod
    def _rebuild_window(seq: Sequence, num_cached: int, plan: StepPlan) -> None:
        """A prompt that starts after `num_cached` cached tokens needs the window before it:
        the encoder's is re-encoded (when the sequence asks), the decoder's replayed under the
        target when another adapter wrote it. Without a cached prefix the prefill itself
        writes every window."""
        seq.num_reencode_context_tokens = num_cached if seq.num_reencode_tokens else 0
        if seq.num_reencode_context_tokens:
            plan.reencodes.append(seq)
        if seq.num_replay_tokens and not seq.is_replay_done and num_cached:
            seq.is_replay_done = True
            seq.num_replay_context_tokens = num_cached
            plan.replays.append(seq)

    def max_decode_run_steps(self, plan: StepPlan) -> int:
        """Steps the pure-decode `plan` can repeat before a sequence finishes or KV runs out."""
        adv = self.num_tokens_per_decode_step
        bs, free = self.block_size, self.kv.num_free
        if plan.num_group_decodes:  # a pure-decode plan's decodes are all members, or none
            min_remaining = self.group.min_remaining()
        else:
            min_remaining = min(s.num_output_tokens - s.num_generated_tokens
                                for s in plan.decodes)
        num_steps = -(-min_remaining // adv)
        # A sequence holds the blocks of its computed tokens, so a run of span tokens adds at
        # most ceil(span / bs) blocks to each: when that fits (the usual case), nothing to count.
        if len(plan.decodes) * -(-num_steps * adv // bs) <= free:
            return num_steps
        if plan.num_group_decodes:
            remaining, computed, held = self.group.run_arrays()
        else:
            remaining, computed, held = np.array([
                (s.num_output_tokens - s.num_generated_tokens, s.num_computed_tokens,
                 s.num_blocks) for s in plan.decodes]).T

        def extra_blocks(k: int) -> int:
            total = computed + np.minimum(k * adv, remaining)
            return int(np.maximum(0, -(-total // bs) - held).sum())

        if extra_blocks(num_steps) <= free:
            return num_steps
        lo, hi = 1, num_steps  # extra_blocks(lo) == 0 <= free < extra_blocks(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if extra_blocks(mid) <= free else (lo, mid)
        return lo

    def commit(self, plan: StepPlan, num_steps: int, now: float) -> list[Sequence]:
        """Apply `plan` repeated `num_steps` times (decode runs only) ending at `now`."""
        finished, joining = [], []
        for seq, num_new in plan.prefills:
            seq.num_computed_tokens += num_new
            seq.num_prefill_tokens_computed += num_new
            if seq.num_computed_tokens == seq.num_tokens:
                self._register_full_blocks(seq)
                if seq.num_output_tokens > 0:
                    seq.num_generated_tokens += 1
                    if seq.first_token_s < 0:
                        seq.first_token_s = now
            if seq.is_finished:
                finished.append(seq)
            elif not seq.is_prefilling:
                joining.append(seq)
        bs = self.block_size
        step = self.num_tokens_per_decode_step * num_steps
        # One allocation for the run's new blocks (nothing frees any meanwhile); the group's
        # members first, as they come first in the plan's decodes.
        m = plan.num_group_decodes
        unallocated = 0
        if m:
            unallocated, done = self.group.advance(step)
            for seq in done:
                self.group.leave(seq)
            finished.extend(done)
        for seq in plan.decodes[m:]:
            emitted = min(step, seq.num_output_tokens - seq.num_generated_tokens)
            computed = seq.num_computed_tokens = seq.num_computed_tokens + emitted
            generated = seq.num_generated_tokens = seq.num_generated_tokens + emitted
            need = -(-computed // bs) - seq.num_blocks
            if need > 0:
                unallocated += need
                seq.num_blocks += need
            if seq.first_token_s < 0:
                seq.first_token_s = now
            if generated >= seq.num_output_tokens:  # Sequence.is_finished for a decoding one
                finished.append(seq)
            else:
                joining.append(seq)
        self.kv.allocate(unallocated)
        self.group.join_all(joining, [self._orders[seq] for seq in joining])
        for seq in finished:
            self._finish(seq, now)
        if self.check_invariants:
            self.kv.check_invariants()
            # Sequences sharing a cached prefix hold the same blocks: count each block once.
            keys = [k for s in self.running for run in s.block_runs for k in run]
            uncached = sum(s.num_blocks for s in self.running) - len(keys)
            held = uncached + len(set(keys))
            assert held == self.kv.num_used, (held, self.kv.num_used)
            assert len({s.adapter for s in self.running if s.adapter >= 0}) <= self.slots.max_loras
        return finished

    def _register_full_blocks(self, seq: Sequence) -> None:
        if seq.last_layer >= 0 or not seq.is_cacheable:
            return  # a pass over some layers only leaves no reusable whole-model KV
        num_full = seq.num_computed_tokens // self.block_size
        kv = self.kv
        if kv.enable_prefix_caching and num_full > seq.num_registered_blocks:
            new = kv.register(seq.block_key_runs(seq.num_registered_blocks, num_full,
                                                 self.block_size, kv))
            held = seq.block_runs
            if new and held and held[-1].stop == new[0].start:  # one range, not two
                held[-1] = range(held[-1].start, new.pop(0).stop)
            held += new
        seq.num_registered_blocks = num_full

    def _finish(self, seq: Sequence, now: float) -> None:
        self._register_full_blocks(seq)
        self.running.remove(seq)
        del self._orders[seq]
        self.kv.release(seq.block_runs, seq.num_blocks)
        self.slots.release(seq.adapter)
        seq.block_runs = []
        seq.num_blocks = 0
        seq.hash_key_table = None
        seq.finish_s = now
