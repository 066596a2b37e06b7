"""Conversations as plain state driven by SimPy callbacks: each turn runs its strategy's hops
on a replica.

A turn's hops (route, answer, summary, routing prefill) run one after another on the replica the
router chose for the turn. The strategy decides each hop's adapter, prompt and layers; where its
adapters sit (`StrategySpec.kv_layout`) decides the KV namespace (the adapter where KV depends
on it, shared otherwise) and whether a hop under another adapter than the one whose local KV
fills the conversation's window replays that window. The engine then charges whatever the
prefix cache does not already hold. Nothing here computes a cost.

One arrival process starts conversations; a turn is a small state record advanced by callbacks
on SimPy events (a hop's completion, a think or decision time), not a process of its own, so a
million queued requests hold no generator frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from sim.config import SimConfig
from sim.engine.cluster import Router
from sim.engine.replica import Replica
from sim.engine.sequence import PRIVATE_STREAM, Sequence
from sim.metrics import MetricsRecorder, TurnRecord
from sim.strategies.registry import get_strategy
from sim.workload.generate import Workload

SHARED_NAMESPACE = -1
ROUTING_HOPS = ("route", "routing_prefill")
ROUTE, ANSWER, SUMMARY, DONE = range(4)
MISROUTE_STREAM = 0x6D6973
"""Seeds the misroute draws apart from the workload's, so an accuracy change moves no request."""


@dataclass(slots=True)
class ConversationState:
    """What a conversation carries from turn to turn."""

    conv_id: int
    num_context_tokens: int
    first_turn: int
    """Index of the conversation's first turn in the workload's turn arrays."""
    last_turn: int
    """Index of its last turn."""
    turn: int = -1
    """Index of the current turn."""
    prev_adapter: int | None = None
    """Domain (adapter or agent) that answered the previous turn."""
    window_adapter: int | None = None
    """Adapter whose local KV fills the window (shared KV layout); None before the first hop."""
    last_replica: int | None = None


@dataclass(slots=True, eq=False)
class Turn:
    """A turn in flight: which hop runs next and what earlier hops left behind."""

    conv: ConversationState
    rec: TurnRecord
    replica: Replica
    domain: int
    """The domain that answers (a wrong one when the router misrouted the turn)."""
    adapter: int
    num_user_tokens: int
    num_reply_tokens: int
    is_switch: bool
    is_routed: bool
    """A router decides this turn's adapter (False when the client names it)."""
    is_decided: bool = False
    """The routing phase, and any wait up to a measured decision time, is over."""
    stage: int = ROUTE
    """The step `_advance` takes next (ROUTE, ANSWER, SUMMARY, DONE)."""
    answer: Sequence | None = None
    """The finished answer hop (its decode side when disaggregated)."""


class TurnDriver:
    """Runs conversations of a workload under one strategy."""

    def __init__(self, env: simpy.Environment, config: SimConfig, workload: Workload,
                 router: Router, recorder: MetricsRecorder, disaggregation=None,
                 router_pool: Router | None = None):
        self.env, self.config, self.workload = env, config, workload
        self.router, self.recorder = router, recorder
        self.router_pool = router_pool
        """Replicas that run only routing passes; None: the turn's own replica runs them."""
        self.strategy = config.strategy
        self.kind = get_strategy(config.strategy.kind)
        """The strategy object: what a turn's hops are."""
        self._num_groups = self.kind.num_replica_groups(config.strategy)
        self.num_domains = config.strategy.num_domains
        self.disaggregation = disaggregation
        self._num_seqs = 0
        self._is_multi_turn = bool((workload.conv_num_turns > 1).any())
        ced = config.arch.ced
        self.routing_last_layer = ced.routing_layer + 1 if ced else config.arch.num_layers
        self._is_routing = self.kind.is_routing
        self._misroute_offset = self._draw_misroutes(config, workload.num_turns)
        self._reencode_tokens = ced.sliding_window_tokens \
            if ced and config.engine.ced_encoder_window == "recompute" else 0

    def _draw_misroutes(self, config: SimConfig, num_turns: int) -> np.ndarray | None:
        """Per turn, 0 when the router is right, else the step to the wrong domain it picks."""
        s = config.strategy
        if not self._is_routing or s.routing_accuracy >= 1 or self.num_domains < 2:
            return None
        rng = np.random.default_rng([config.seed, MISROUTE_STREAM])
        wrong = rng.random(num_turns) >= s.routing_accuracy
        return np.where(wrong, rng.integers(1, self.num_domains, num_turns), 0)

    def arrivals(self):
        """The one arrival process: start each conversation's first turn at its arrival time."""
        env, wl = self.env, self.workload
        arrivals = wl.conv_arrival_s.tolist()
        first, num_turns = wl.conv_first_turn.tolist(), wl.conv_num_turns.tolist()
        initial = wl.conv_initial_tokens.tolist()
        for conv, arrival_s in enumerate(arrivals):
            if arrival_s > env.now:
                yield env.timeout(arrival_s - env.now)
            self._start_turn(ConversationState(conv, initial[conv], first[conv],
                                               first[conv] + num_turns[conv] - 1))

    def _after(self, delay_s: float, callback, *args) -> None:
        """Call `callback(*args)` `delay_s` from now (an event, not a process)."""
        self.env.timeout(delay_s).callbacks.append(lambda _event: callback(*args))

    def _end_turn(self, turn: Turn) -> None:
        conv, rec = turn.conv, turn.rec
        self.recorder.on_turn(rec, self.env.now)
        # The answer points back at the turn (its owner): break the cycle, or with the cyclic
        # collector paused for the run every finished turn would stay in memory.
        turn.answer = None
        conv.num_context_tokens += turn.num_user_tokens + turn.num_reply_tokens
        conv.prev_adapter, conv.last_replica = turn.domain, turn.replica.index
        if conv.turn == conv.last_turn:
            return
        think_s = float(self.workload.turn_think_s[conv.turn + 1])
        if think_s > 0:
            self._after(think_s, self._start_turn, conv)
        else:
            self._start_turn(conv)

    def _adapter_of(self, domain: int) -> int:
        if self.strategy.adapter_kind == "none":
            return -1
        return domain % self.strategy.num_domains

    def _namespace(self, adapter: int) -> int:
        """Prefix-cache namespace of a hop under `adapter`."""
        return adapter if self.strategy.kv_layout == "per_adapter" else SHARED_NAMESPACE

    def _window_fields(self, t: Turn, adapter: int, *, keeps_window: bool = True) -> dict:
        """Bounded replay of a hop under `adapter` when the window holds another adapter's KV
        (shared KV layout only); `keeps_window`: the hop's local KV stays (not rolled back)."""
        conv = t.conv
        if self.strategy.kv_layout != "shared" or adapter < 0:
            return {}
        holder = conv.window_adapter
        if keeps_window:
            conv.window_adapter = adapter
        if holder is None or holder == adapter:
            return {}
        # The engine replays the W cached positions before the first computed token.
        return dict(num_replay_tokens=self.strategy.replay_window_tokens)

    def _start_turn(self, conv: ConversationState) -> None:
        """The conversation's next turn arrives now: pick its replica and run its first hop."""
        wl = self.workload
        conv.turn = turn = conv.first_turn if conv.turn < 0 else conv.turn + 1
        domain = int(wl.turn_domain[turn]) % self.num_domains
        is_routed = self._is_routing and not (wl.turn_is_named is not None
                                              and wl.turn_is_named[turn])
        served = domain
        if is_routed and self._misroute_offset is not None:
            served = (domain + int(self._misroute_offset[turn])) % self.num_domains
        adapter = self._adapter_of(served)
        is_switch = conv.prev_adapter is not None and conv.prev_adapter != served
        group = served if self._num_groups > 1 else 0
        replica = self.router.choose(group, adapter, conv.last_replica)
        num_user = int(wl.turn_user_tokens[turn])
        rec = TurnRecord(conv_id=conv.conv_id, turn_index=turn - conv.first_turn, domain=domain,
                         is_switch=is_switch, replica=replica.index, arrival_s=self.env.now,
                         num_context_tokens=conv.num_context_tokens, num_user_tokens=num_user,
                         is_routed=is_routed, is_misrouted=served != domain)
        self._advance(Turn(conv, rec, replica, served, adapter, num_user,
                           int(wl.turn_reply_tokens[turn]), is_switch, is_routed))

    def _advance(self, t: Turn) -> None:
        """Start the turn's next hop, or end the turn when none is left."""
        s = self.strategy
        if t.stage == ROUTE:
            t.stage = ANSWER
            if self._route(t):
                return
        if t.stage == ANSWER:
            if t.is_routed and not t.is_decided:
                t.is_decided = True
                measured = s.measured_decision_time_s
                elapsed = self.env.now - t.rec.arrival_s
                # In the engine the head rides the answer's prefill, where its measured time
                # is priced as GPU work (`sim.simulate.in_engine_decision_floor_s`).
                if measured is not None and measured > elapsed \
                        and not self.kind.head_rides_answer(s):
                    self._after(measured - elapsed, self._advance, t)
                    return
            if t.is_routed:
                t.rec.route_s = self.env.now - t.rec.arrival_s
            t.stage = SUMMARY
            self._run(t, self._answer_fields(t))
            return
        if t.stage == SUMMARY:
            t.stage = DONE
            t.rec.on_answer(t.answer)
            num_summary = self.kind.summary_tokens(s, t.adapter)
            if num_summary:
                num_prompt = t.answer.num_prompt_tokens + t.num_reply_tokens
                self._run(t, dict(
                    hop="summary", adapter=t.adapter, kv_namespace=self._namespace(t.adapter),
                    num_prompt_tokens=num_prompt, num_output_tokens=num_summary,
                    stream_id=t.conv.conv_id, num_stream_prompt_tokens=num_prompt))
                return
        self._end_turn(t)

    def _answer_fields(self, t: Turn) -> dict:
        s, wl, conv = self.strategy, self.workload, t.conv
        num_prompt = conv.num_context_tokens + t.num_user_tokens
        namespace = self._namespace(t.adapter)
        # A one-turn conversation's prompt is never seen again: keep it out of the cache.
        stream = conv.conv_id if self._is_multi_turn else PRIVATE_STREAM
        fields = dict(hop="answer", adapter=t.adapter, kv_namespace=namespace,
                      num_prompt_tokens=num_prompt, num_output_tokens=t.num_reply_tokens,
                      stream_id=stream, num_stream_prompt_tokens=num_prompt,
                      is_output_in_stream=True, is_decode_adapted=self.kind.is_decode_adapted)
        if wl.turn_hash_ids is not None:
            fields.update(hash_ids=wl.turn_hash_ids[conv.turn],
                          hash_block_tokens=wl.hash_block_tokens, is_output_in_stream=False)
        fields.update(self.kind.answer_fields(
            s, is_routed=t.is_routed, is_switch=t.is_switch,
            num_context_tokens=conv.num_context_tokens, num_user_tokens=t.num_user_tokens))
        fields.update(self._window_fields(t, t.adapter))
        return fields

    def _route(self, t: Turn) -> bool:
        """Start the routing pass of a turn (real GPU work on the serving replica, cached by
        the same rule as any hop: the conversation's text is a stream, the route prompt and
        option descriptions a private tail); False when no pass runs before the answer.

        A measured decision time does not replace the pass: it is the least time the decision
        takes (`_advance` waits out the rest), so a router never becomes free."""
        s, conv = self.strategy, t.conv
        num_prompt = conv.num_context_tokens + t.num_user_tokens
        if not t.is_routed:
            return False
        hop = self.kind.route_hop(s, num_prompt, self.routing_last_layer)
        if hop is None:
            return False
        adapter = hop["adapter"]
        stream = dict(stream_id=conv.conv_id if self._is_multi_turn else PRIVATE_STREAM,
                      num_stream_prompt_tokens=num_prompt)
        self._run(t, dict(hop, kv_namespace=self._namespace(adapter), **stream,
                          **self._window_fields(t, adapter, keeps_window=False)))
        return True

    def new_seq(self, fields: dict, owner, on_done) -> Sequence:
        """A sequence submitted now; `on_done(seq)` runs (as an event) when it finishes."""
        self._num_seqs += 1
        return Sequence(seq_id=self._num_seqs, submit_s=self.env.now, owner=owner,
                        on_done=on_done, **fields)

    def _run(self, t: Turn, fields: dict) -> None:
        """Submit one hop; the turn advances when it (its decode side, if disaggregated) ends."""
        if self._reencode_tokens:  # every hop over the conversation encodes C[-W:] + its tokens
            fields["num_reencode_tokens"] = self._reencode_tokens
        if self.router_pool is not None and fields["hop"] in ROUTING_HOPS:
            replica = self.router_pool.choose(0, fields["adapter"], None)
            replica.submit(self.new_seq(fields, t, self.on_hop_done))
            return
        if self.disaggregation is not None and fields["num_output_tokens"] > 0 \
                and fields.get("last_layer", -1) < 0:
            self.disaggregation.start(self, fields, t)
            return
        t.replica.submit(self.new_seq(fields, t, self.on_hop_done))

    def on_hop_done(self, seq: Sequence) -> None:
        """A hop of `seq.owner` finished: record it and move the turn on."""
        self.recorder.on_seq(seq, seq.owner.rec)
        self.advance_after_hop(seq)

    def advance_after_hop(self, seq: Sequence) -> None:
        """Move `seq`'s turn on once the hop `seq` (already recorded) has ended."""
        t = seq.owner
        if t.stage == SUMMARY:  # the hop that just ended is the answer
            t.answer = seq
        self._advance(t)
