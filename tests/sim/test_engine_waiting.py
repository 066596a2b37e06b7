"""The waiting queue filed by adapter and the adapter slots' pin count, each against a plain
model of what it must say: a list in FCFS order, and the slots' pins counted one by one."""

import numpy as np

from sim.engine.sequence import Sequence
from sim.engine.waiting import WaitingQueue
from sim.memory.adapter_slots import NO_ADAPTER, AdapterSlots


def _seq(i: int, adapter: int) -> Sequence:
    return Sequence(seq_id=i, hop="answer", adapter=adapter, kv_namespace=adapter,
                    num_prompt_tokens=10, num_output_tokens=5, submit_s=0.0)


def test_waiting_queue_keeps_fcfs_order_and_finds_each_adapters_first():
    rng = np.random.default_rng(0)
    queue, model = WaitingQueue(), []
    for i in range(3000):
        op = rng.integers(4)
        if op == 0 or not model:  # a new arrival, last
            seq = _seq(i, int(rng.integers(-1, 12)))
            queue.append(seq)
            model.append(seq)
        elif op == 1:  # a preempted sequence, first
            seq = _seq(i, int(rng.integers(-1, 12)))
            queue.appendleft(seq)
            model.insert(0, seq)
        elif op == 2:
            assert queue.first() is model[0]
            assert queue.popleft() is model.pop(0)
        else:  # the first waiter of some adapters, taken from the middle
            pinned = {int(a) for a in rng.choice(12, size=int(rng.integers(1, 6)), replace=False)}
            heads = queue.heads(pinned, NO_ADAPTER)
            wanted = [s for s in model if s.adapter in pinned or s.adapter == NO_ADAPTER]
            firsts = list(dict.fromkeys(s.adapter for s in wanted))  # adapters by first waiter
            assert [a for _, a in sorted(heads)] == firsts
            if firsts:
                seq = queue.first_of(firsts[0])
                assert seq is wanted[0]
                queue.remove_first_of(firsts[0])
                model.remove(seq)
        assert len(queue) == len(model) and list(queue) == model


def test_adapter_slots_count_pins_as_the_slots_hold_them():
    rng = np.random.default_rng(1)
    slots = AdapterSlots(max_loras=4, max_cpu_loras=6, load_s=[0.1] * 10)
    running = []
    for _ in range(5000):
        adapter = int(rng.integers(10))
        gpu = dict(slots._gpu)
        # What can_activate must say: a free slot, an unpinned one, or the adapter resident.
        can = len(gpu) < 4 or adapter in gpu or any(p == 0 for p in gpu.values())
        assert slots.can_activate(adapter) == can
        assert slots.num_pinned == sum(p > 0 for p in gpu.values())
        assert slots.is_saturated == (len(gpu) == 4 and all(p > 0 for p in gpu.values()))
        if slots.is_saturated:
            assert set(slots.pinned) == set(gpu)
        if can and (not running or rng.random() < 0.55):
            slots.activate(adapter)
            running.append(adapter)
        elif running:
            slots.release(running.pop(int(rng.integers(len(running)))))
