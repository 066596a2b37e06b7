"""Conversations as SimPy processes: each turn runs its strategy's hops on a replica.

A turn's hops (route, answer, summary, routing prefill) run one after another on the replica the
router chose for the turn. The strategy decides each hop's adapter, KV namespace (the adapter
where KV depends on it, shared otherwise), prompt, layers and replay; the engine then charges
whatever the prefix cache does not already hold. Nothing here computes a cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from sim.cluster import Router
from sim.config import SimConfig
from sim.metrics import MetricsRecorder, TurnRecord
from sim.replica import Replica
from sim.sequence import PRIVATE_STREAM, Sequence
from sim.workloads import Workload

SHARED_NAMESPACE = -1
ADAPTER_KV_KINDS = ("multi_lora", "preft", "mol")
NO_LORA_KINDS = ("base", "multi_agent")


@dataclass(slots=True)
class ConversationState:
    """What a conversation carries from turn to turn."""

    conv_id: int
    num_context_tokens: int
    prev_adapter: int | None = None
    last_replica: int | None = None


class TurnDriver:
    """Runs conversations of a workload under one strategy."""

    def __init__(self, env: simpy.Environment, config: SimConfig, workload: Workload,
                 router: Router, recorder: MetricsRecorder, disaggregation=None):
        self.env, self.config, self.workload = env, config, workload
        self.router, self.recorder = router, recorder
        self.strategy = config.strategy
        self.disaggregation = disaggregation
        self._num_seqs = 0
        self._is_multi_turn = bool((workload.conv_num_turns > 1).any())
        ced = config.arch.ced
        self.routing_last_layer = ced.routing_layer + 1 if ced else config.arch.num_layers

    def arrivals(self):
        """Start each conversation at its arrival time."""
        env, arrivals = self.env, self.workload.conv_arrival_s
        for conv in range(arrivals.size):
            if arrivals[conv] > env.now:
                yield env.timeout(arrivals[conv] - env.now)
            env.process(self.conversation(conv))

    def conversation(self, conv: int):
        """All turns of conversation `conv`, with think time in between."""
        wl = self.workload
        state = ConversationState(conv, int(wl.conv_initial_tokens[conv]))
        first = int(wl.conv_first_turn[conv])
        for turn in range(first, first + int(wl.conv_num_turns[conv])):
            if turn > first and wl.turn_think_s[turn] > 0:
                yield self.env.timeout(float(wl.turn_think_s[turn]))
            yield from self._turn(state, turn, turn - first)

    def _adapter_of(self, domain: int) -> int:
        if self.strategy.kind in NO_LORA_KINDS:
            return -1
        return domain % self.strategy.num_domains

    def _turn(self, state: ConversationState, turn: int, turn_index: int):
        wl, s = self.workload, self.strategy
        domain = int(wl.turn_domain[turn]) % s.num_domains
        adapter = self._adapter_of(domain)
        num_user, num_reply = int(wl.turn_user_tokens[turn]), int(wl.turn_reply_tokens[turn])
        is_switch = state.prev_adapter is not None and state.prev_adapter != domain
        group = domain if s.kind == "multi_agent" else 0
        replica = self.router.choose(group, adapter, state.last_replica)
        rec = TurnRecord(conv_id=state.conv_id, turn_index=turn_index, domain=domain,
                         is_switch=is_switch, replica=replica.index, arrival_s=self.env.now,
                         num_context_tokens=state.num_context_tokens, num_user_tokens=num_user)
        yield from self._route(state, replica, turn, num_user, rec)
        answer = yield from self._run(replica, self._answer_fields(
            state, turn, domain, adapter, num_user, num_reply, is_switch), rec)
        rec.on_answer(answer)
        if s.kind == "mol" and domain != s.router_adapter_index and s.max_summary_tokens:
            yield from self._run(replica, dict(
                hop="summary", adapter=adapter, kv_namespace=adapter,
                num_prompt_tokens=answer.num_prompt_tokens + num_reply,
                num_output_tokens=s.max_summary_tokens, stream_id=state.conv_id,
                num_stream_prompt_tokens=answer.num_prompt_tokens + num_reply), rec)
        self.recorder.on_turn(rec, self.env.now)
        state.num_context_tokens += num_user + num_reply
        state.prev_adapter, state.last_replica = domain, replica.index

    def _answer_fields(self, state, turn, domain, adapter, num_user, num_reply, is_switch):
        s, wl = self.strategy, self.workload
        num_prompt = state.num_context_tokens + num_user
        namespace = adapter if s.kind in ADAPTER_KV_KINDS else SHARED_NAMESPACE
        # A one-turn conversation's prompt is never seen again: keep it out of the cache.
        stream = state.conv_id if self._is_multi_turn else PRIVATE_STREAM
        fields = dict(hop="answer", adapter=adapter, kv_namespace=namespace,
                      num_prompt_tokens=num_prompt, num_output_tokens=num_reply,
                      stream_id=stream, num_stream_prompt_tokens=num_prompt,
                      is_output_in_stream=True, is_decode_adapted=s.kind != "preft")
        if wl.turn_hash_ids is not None:
            fields.update(hash_ids=wl.turn_hash_ids[turn], hash_block_tokens=wl.hash_block_tokens,
                          is_output_in_stream=False)
        if s.kind == "multi_agent" and is_switch and s.num_handover_tokens is not None:
            handover = min(state.num_context_tokens, s.num_handover_tokens)
            fields.update(num_prompt_tokens=handover + num_user, stream_id=PRIVATE_STREAM,
                          num_stream_prompt_tokens=0, is_output_in_stream=False)
        if s.kind in ("contextual_mol", "mol2") and is_switch:
            fields.update(num_replay_tokens=s.replay_window_tokens,
                          num_replay_context_tokens=state.num_context_tokens)
        if s.kind == "mol2" and s.routing == "in_engine" and s.measured_decision_time_s is None:
            fields.update(num_routing_decisions=1)
        return fields

    def _route(self, state: ConversationState, replica: Replica, turn: int, num_user: int, rec):
        """The routing phase of a turn: whatever the strategy runs before the answer."""
        s, start = self.strategy, self.env.now
        num_prompt = state.num_context_tokens + num_user
        if s.kind not in ("mol", "contextual_mol", "mol2"):
            return
        if s.measured_decision_time_s is not None:
            yield self.env.timeout(s.measured_decision_time_s)
        elif s.kind == "mol":
            router = s.router_adapter_index
            yield from self._run(replica, dict(
                hop="route", adapter=router, kv_namespace=router,
                num_prompt_tokens=num_prompt + s.num_route_prompt_tokens,
                num_output_tokens=s.num_route_decode_tokens, stream_id=state.conv_id,
                num_stream_prompt_tokens=num_prompt), rec)
        elif s.kind == "contextual_mol":
            options = s.num_domains * s.num_option_description_tokens
            yield from self._run(replica, dict(
                hop="route", adapter=-1, kv_namespace=SHARED_NAMESPACE,
                num_prompt_tokens=num_prompt + options, num_output_tokens=0,
                stream_id=state.conv_id, num_stream_prompt_tokens=state.num_context_tokens,
                last_layer=self.routing_last_layer, num_routing_decisions=1), rec)
        elif s.routing == "outside_engine":
            yield from self._run(replica, dict(
                hop="routing_prefill", adapter=-1, kv_namespace=SHARED_NAMESPACE,
                num_prompt_tokens=num_prompt, num_output_tokens=0,
                last_layer=self.routing_last_layer, num_routing_decisions=1), rec)
        rec.route_s = self.env.now - start

    def new_seq(self, fields: dict) -> Sequence:
        """A sequence submitted now, with its completion event."""
        self._num_seqs += 1
        seq = Sequence(seq_id=self._num_seqs, submit_s=self.env.now, **fields)
        seq.done = self.env.event()
        return seq

    def _run(self, replica: Replica, fields: dict, rec: TurnRecord):
        """Run one hop to completion; return its (decode-side, if disaggregated) sequence."""
        if self.disaggregation is not None and fields["num_output_tokens"] > 0 \
                and fields.get("last_layer", -1) < 0:
            return (yield from self.disaggregation.run(self, fields, rec))
        seq = self.new_seq(fields)
        replica.submit(seq)
        yield seq.done
        self.recorder.on_seq(seq, rec)
        return seq
