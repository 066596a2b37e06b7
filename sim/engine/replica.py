"""The SimPy process of one replica: plan a step, wait its time, commit, repeat.

In fast mode a step holding only decodes is repeated as one run up to the next event that could
change the batch (a sequence finishing, KV running out); a sequence submitted during a run cuts it
at the first step boundary at or after its arrival, exactly where the step-by-step reference
would first see it. The run's step ends are the reference's clock readings, bit for bit
(`sim.engine.decode_run.DecodeRun`); they are priced in chunks, so the run waits on a timer at
the end of the steps priced so far, which prices more and re-arms until the run's last step.
The cut is another timer, not an interrupt: the run waits on an event that whichever timer is
current triggers, and a superseded timer finds a newer `_run_id` and does nothing. The
replica's busy time is added step by step, as the reference adds it; each step's decode share
goes to the group's exact running sum (`DecodeGroup.add_shares`), as the reference's does.
Where the coefficients price a queue (`sim.cost.queue_cost`), a step scheduled while requests
wait is priced step by step with the queue's host time added, and any arrival cuts a run (the
arrival may wait, and from then on every step pays the queue).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from itertools import repeat
from operator import add, mul, truediv

import numpy as np
import simpy

from sim.cost.queue_cost import has_queue_cost, predict_queue_cost
from sim.engine.decode_group import SHARE_SCALE, add_decode_busy, share_units
from sim.engine.decode_run import DecodeRun, ListedDecodeRun, delay_to
from sim.engine.scheduler import Engine
from sim.engine.sequence import Sequence
from sim.engine.step_pricer import StepPricer, reencode_span


class SimulationError(RuntimeError):
    """The simulation cannot go on (a request that can never be scheduled, a bound hit)."""


class StepCounter:
    """Engine steps summed over replicas, with the bound that stops a runaway run."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.num_steps = 0
        self.num_events = 0

    def add(self, num_steps: int) -> None:
        """Count steps; raise when the bound is passed."""
        self.num_steps += num_steps
        self.num_events += 1
        if self.num_steps > self.max_steps:
            raise SimulationError(
                f"simulation.max_engine_steps={self.max_steps} reached (engine steps summed over "
                f"replicas); raise it or shorten the workload")


class Replica:
    """One engine replica driven by a SimPy process."""

    def __init__(self, env: simpy.Environment, index: int, engine: Engine, pricer: StepPricer,
                 counter: StepCounter, on_sample: Callable[[Replica, float, int], None]):
        self.env, self.index, self.engine, self.pricer = env, index, engine, pricer
        self.counter, self.on_sample = counter, on_sample
        self.prices_queue = has_queue_cost(pricer.coeffs)
        """A step's price depends on the requests waiting (`sim.cost.queue_cost`)."""
        self.busy_s = 0.0
        self._wakeup: simpy.Event | None = None
        self._run: DecodeRun | ListedDecodeRun | None = None
        """The decode run in progress that no arrival has cut yet."""
        self._priced_run: DecodeRun | ListedDecodeRun | None = None
        """The decode run in progress."""
        self._run_steps = 0
        self._run_id = 0
        self._run_end: simpy.Event | None = None
        self.process = env.process(self._loop())

    def submit(self, seq: Sequence) -> None:
        """Hand a sequence to this replica now."""
        seq.replica = self.index
        self.engine.add(seq)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()
        elif self._run is not None and (self.prices_queue
                                        or self.engine.can_start_during_run(seq)):
            self._cut_run()  # a waiting request changes the steps' price

    def _loop(self):
        env, engine = self.env, self.engine
        while True:
            if not engine.num_outstanding:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            plan = engine.schedule(env.now)
            if plan.is_empty:
                raise SimulationError(_stuck_message(engine))
            start = env.now
            num_waiting = len(engine.waiting) if self.prices_queue else 0
            if self.pricer.is_fast and plan.is_pure_decode and not num_waiting:
                run = yield from self._decode_run(plan, start)
                num_steps = self._run_steps
                step_s = run.step_s(num_steps)
                _attribute_run(plan, step_s, self.pricer.num_decode_compute_tokens)
                self.busy_s = reduce(add, step_s if isinstance(step_s, list)
                                     else step_s.tolist(), self.busy_s)
            else:
                num_steps = 1
                yield env.timeout(self._step_s(plan, num_waiting))
                self.busy_s += env.now - start
                _attribute(plan, env.now - start, self.pricer.num_decode_compute_tokens)
            self.counter.add(num_steps)
            self.on_sample(self, env.now, len(plan.decodes) + len(plan.prefills))
            finished = engine.commit(plan, num_steps, env.now)
            if finished:
                self._notify(finished)

    def _step_s(self, plan, num_waiting: int) -> float:
        """Seconds of one step of `plan` scheduled with `num_waiting` requests left waiting:
        the batch's price, then the host time the queue adds (it does not overlap the GPU)."""
        step_s = self.pricer.step_s(plan)
        if num_waiting:
            step_s += predict_queue_cost(self.pricer.coeffs, num_waiting,
                                         len(plan.decodes) + len(plan.prefills)).total_s
        return step_s

    def _notify(self, finished: list[Sequence]) -> None:
        """Run each finished sequence's `on_done` from one event now, in order, after this
        replica has planned its next step (as processes waiting on the sequences would). One
        event for them all calls them in the order one event each would: those events would
        follow each other in the queue (nothing this code schedules outranks them), and what
        a callback schedules at this time still runs after all of them."""
        event = self.env.event()
        event.callbacks.append(lambda _event: [seq.on_done(seq) for seq in finished])
        event.succeed()

    def _decode_run(self, plan, start: float):
        """Wait out a run of decode steps; return the run (`_run_steps` of it ran)."""
        max_steps = self.engine.max_decode_run_steps(plan)
        run = self.pricer.decode_run(plan, start, max_steps)
        self._run = run if max_steps > 1 else None
        self._priced_run, self._run_steps = run, max_steps
        self._run_end = self.env.event()
        self._time_run()
        yield self._run_end
        self._run = self._priced_run = self._run_end = None
        return run

    def _time_run(self) -> None:
        """(Re)time the current run's end, or if its last step is not priced yet the end of
        the steps priced next (then time it again from there); an earlier timer becomes
        stale."""
        self._run_id += 1
        run_id, run = self._run_id, self._priced_run
        target = min(run.price_more(self._run_steps), self._run_steps)

        def on_timer(_event) -> None:
            if run_id == self._run_id:
                if target >= self._run_steps:
                    self._run_end.succeed()
                else:
                    self._time_run()

        delay = delay_to(self.env.now, run.end_s(target))
        self.env.timeout(delay).callbacks.append(on_timer)

    def _cut_run(self) -> None:
        """A sequence arrived during the run: end it at the first step boundary from now."""
        run = self._run
        self._run = None  # later arrivals in this run change nothing
        num_steps = run.steps_to_reach(self.env.now, self._run_steps)
        if num_steps < self._run_steps:
            self._run_steps = num_steps
            self._time_run()


def _attribute(plan, elapsed_s: float, num_decode_tokens: int) -> None:
    """Share a step's (or a decode run's) seconds among its items by tokens computed; a run
    repeats the same decode items, so its share per item is the same at every step."""
    tokens = sum(n for _, n in plan.prefills) + num_decode_tokens * len(plan.decodes)
    replays = [(seq, min(seq.num_replay_tokens, seq.num_replay_context_tokens))
               for seq in plan.replays]
    tokens += sum(n for _, n in replays)
    reencodes = [(seq, reencode_span(seq)[0]) for seq in plan.reencodes]
    tokens += sum(n for _, n in reencodes)
    per_token = elapsed_s / tokens if tokens else 0.0
    for seq, num_new in plan.prefills:
        seq.busy_prefill_s += num_new * per_token
    if plan.decodes:
        units = share_units(num_decode_tokens * per_token)
        if plan.num_group_decodes:  # the group adds it to each member when the member leaves
            plan.group.add_units(units)
        for seq in plan.decodes[plan.num_group_decodes:]:
            add_decode_busy(seq, units)
    for seq, num_replay in replays:
        seq.busy_replay_s += num_replay * per_token
    for seq, num_reencode in reencodes:
        seq.busy_reencode_s += num_reencode * per_token


def _attribute_run(plan, step_s: list[float] | np.ndarray, num_decode_tokens: int) -> None:
    """`_attribute` for each step of a pure-decode run, given each step's seconds: the same
    shares (the same float operations), summed exactly."""
    tokens = num_decode_tokens * len(plan.decodes)
    if isinstance(step_s, list):  # a short run: C-level maps, no numpy call
        per_token = map(truediv, step_s, repeat(tokens))
        units = sum(map(int, map(mul, map(mul, repeat(num_decode_tokens), per_token),
                                 repeat(SHARE_SCALE))))
    else:
        units = share_units(num_decode_tokens * (step_s / tokens))
    if plan.num_group_decodes:
        plan.group.add_units(units)
    for seq in plan.decodes[plan.num_group_decodes:]:
        add_decode_busy(seq, units)


def _stuck_message(engine: Engine) -> str:
    seq = engine.waiting.first()
    return (f"sequence {seq.seq_id} ({seq.hop}, {seq.num_tokens} tokens) can never be scheduled: "
            f"KV pool has {engine.kv.num_blocks} blocks of {engine.block_size} tokens, "
            f"max_num_batched_tokens={engine.limits.max_num_batched_tokens}, chunked prefill "
            f"{'on' if engine.limits.enable_chunked_prefill else 'off'}")
