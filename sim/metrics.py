"""Metrics: typed records appended during the run, DataFrames and summaries computed after.

Tables: `requests` (one row per engine sequence: every hop of every turn), `turns` (one row per
user turn, with its hop breakdown), `timeseries` (per replica, sampled at most once per
`interval_s` of simulated time) and `kv_by_namespace` (KV blocks held per adapter namespace, -1
for the shared copy, at the same instants).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.engine.sequence import Sequence
from sim.records import RecordTable

HOPS = ("answer", "route", "summary", "routing_prefill", "prefill", "decode")

_SEQ_COLUMNS = dict(
    seq_id="q", conv_id="q", turn_index="q", hop="q", replica="q", adapter="q",
    submit_s="d", first_scheduled_s="d", first_token_s="d", finish_s="d",
    num_prompt_tokens="q", num_cached_tokens="q", num_prefill_tokens_computed="q",
    num_output_tokens="q", num_preemptions="q", num_replay_tokens="q", adapter_load_s="d",
    busy_prefill_s="d", busy_replay_s="d", busy_decode_s="d", busy_reencode_s="d")
_TURN_COLUMNS = dict(
    conv_id="q", turn_index="q", domain="q", is_switch="q", replica="q", arrival_s="d",
    route_s="d", first_token_s="d", finish_s="d", done_s="d", num_context_tokens="q",
    num_user_tokens="q", num_output_tokens="q", num_prefill_tokens_computed="q",
    num_cached_tokens="q", num_replay_tokens="q", num_reencode_tokens="q",
    num_recomputed_tokens="q",
    num_hop_prefill_tokens="q", num_preemptions="q", adapter_load_s="d", is_routed="q",
    is_misrouted="q", routing_busy_s="d", prefill_busy_s="d", reencode_busy_s="d",
    replay_busy_s="d", decode_busy_s="d", summary_busy_s="d")
_SAMPLE_COLUMNS = dict(
    time_s="d", replica="q", num_running="q", num_waiting="q", batch_size="q",
    kv_blocks_used="q", kv_blocks_cached="q", kv_blocks_occupied="q", num_resident_adapters="q",
    num_adapter_loads="q", num_preemptions="q", resident_adapter_mask="q")


@dataclass(slots=True)
class TurnRecord:
    """A turn in flight; filled by its hops."""

    conv_id: int
    turn_index: int
    domain: int
    is_switch: bool
    replica: int
    arrival_s: float
    num_context_tokens: int
    num_user_tokens: int
    route_s: float = 0.0
    first_token_s: float = -1.0
    finish_s: float = -1.0
    num_output_tokens: int = 0
    num_prefill_tokens_computed: int = 0
    num_cached_tokens: int = 0
    num_replay_tokens: int = 0
    num_reencode_tokens: int = 0
    """Encoder-window positions the answer re-encoded before its new tokens (CED)."""
    num_hop_prefill_tokens: int = 0
    num_preemptions: int = 0
    adapter_load_s: float = 0.0
    is_routed: bool = False
    """A router chose the adapter (the client did not name it)."""
    is_misrouted: bool = False
    """The router chose a wrong adapter: the turn was answered by another domain's."""
    routing_busy_s: float = 0.0
    """Replica seconds of the turn's routing pass (route hop or routing prefill)."""
    prefill_busy_s: float = 0.0
    """Replica seconds of the answer's new tokens: on a CED model the encoder over U, the
    global-KV write (once per position) and the decoder over U."""
    reencode_busy_s: float = 0.0
    """Replica seconds of the answer's encoder re-encoding C[-W:] before U (CED turns whose
    engine keeps no encoder window between requests)."""
    replay_busy_s: float = 0.0
    """Replica seconds of the answer's bounded replay of the last W positions."""
    decode_busy_s: float = 0.0
    """Replica seconds of the answer's decode."""
    summary_busy_s: float = 0.0
    """Replica seconds of MoL's summary hop."""

    def on_answer(self, seq: Sequence) -> None:
        """Take the user-visible timings from the answer hop."""
        self.first_token_s, self.finish_s = seq.first_token_s, seq.finish_s
        self.num_output_tokens = seq.num_output_tokens
        self.num_prefill_tokens_computed = seq.num_prefill_tokens_computed
        self.num_cached_tokens = seq.num_cached_tokens
        self.num_replay_tokens = seq.num_replay_tokens if seq.is_replay_done else 0
        self.num_reencode_tokens = min(seq.num_reencode_tokens, seq.num_reencode_context_tokens)


MASKED_ADAPTERS = 63
"""Adapters 0..62 are recorded in `resident_adapter_mask` (bit i: adapter i in a GPU slot)."""


def resident_mask(adapters) -> int:
    """Bit mask of the resident adapters (those past MASKED_ADAPTERS are left out)."""
    return sum(1 << a for a in adapters if 0 <= a < MASKED_ADAPTERS)


class MetricsRecorder:
    """Collects records during a run."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.seqs = RecordTable(_SEQ_COLUMNS)
        self.turns = RecordTable(_TURN_COLUMNS)
        self.samples = RecordTable(_SAMPLE_COLUMNS)
        self.kv_rows: list[tuple[float, int, int, int]] = []
        self._last_sample: dict[int, float] = {}

    def on_seq(self, seq: Sequence, turn: TurnRecord) -> None:
        """A sequence finished."""
        self.seqs.append(
            seq.seq_id, turn.conv_id, turn.turn_index, HOPS.index(seq.hop), seq.replica,
            seq.adapter, seq.submit_s, seq.first_scheduled_s, seq.first_token_s, seq.finish_s,
            seq.num_prompt_tokens, seq.num_cached_tokens, seq.num_prefill_tokens_computed,
            seq.num_output_tokens, seq.num_preemptions,
            seq.num_replay_tokens if seq.is_replay_done else 0, seq.adapter_load_s,
            seq.busy_prefill_s, seq.busy_replay_s, seq.busy_decode_s, seq.busy_reencode_s)
        if seq.hop not in ("answer", "decode"):
            turn.num_hop_prefill_tokens += seq.num_prefill_tokens_computed
        turn.num_preemptions += seq.num_preemptions
        turn.adapter_load_s += seq.adapter_load_s
        busy = seq.busy_prefill_s + seq.busy_replay_s + seq.busy_decode_s + seq.busy_reencode_s
        if seq.hop in ("route", "routing_prefill"):
            turn.routing_busy_s += busy
        elif seq.hop == "summary":
            turn.summary_busy_s += busy
        else:  # the answer, or its prefill and decode sides when disaggregated
            turn.prefill_busy_s += seq.busy_prefill_s
            turn.reencode_busy_s += seq.busy_reencode_s
            turn.replay_busy_s += seq.busy_replay_s
            turn.decode_busy_s += seq.busy_decode_s

    def on_turn(self, t: TurnRecord, now: float) -> None:
        """A turn finished (every hop done)."""
        # Tokens computed a second time: the first turn's context is new, never a recompute.
        new = t.num_user_tokens + (t.num_context_tokens if t.turn_index == 0 else 0)
        recomputed = max(0, t.num_prefill_tokens_computed - new)
        self.turns.append(
            t.conv_id, t.turn_index, t.domain, int(t.is_switch), t.replica, t.arrival_s,
            t.route_s, t.first_token_s, t.finish_s, now, t.num_context_tokens,
            t.num_user_tokens, t.num_output_tokens, t.num_prefill_tokens_computed,
            t.num_cached_tokens, t.num_replay_tokens, t.num_reencode_tokens, recomputed,
            t.num_hop_prefill_tokens,
            t.num_preemptions, t.adapter_load_s, int(t.is_routed), int(t.is_misrouted),
            t.routing_busy_s, t.prefill_busy_s, t.reencode_busy_s, t.replay_busy_s,
            t.decode_busy_s, t.summary_busy_s)

    def on_sample(self, replica, now: float, batch_size: int) -> None:
        """A replica finished a step or run; keep a sample if the interval has passed."""
        if now - self._last_sample.get(replica.index, -np.inf) < self.interval_s:
            return
        self._last_sample[replica.index] = now
        engine = replica.engine
        kv, slots = engine.kv, engine.slots
        self.samples.append(now, replica.index, len(engine.running), len(engine.waiting),
                            batch_size, kv.num_used, kv.num_cached,
                            kv.num_blocks - kv.num_free_uncached, len(slots.resident),
                            slots.num_loads, engine.num_preemptions,
                            resident_mask(slots.resident))
        held: dict[int, int] = {}
        for seq in engine.running:
            held[seq.kv_namespace] = held.get(seq.kv_namespace, 0) + seq.num_blocks
        self.kv_rows.extend((now, replica.index, ns, n) for ns, n in held.items())

    def frames(self) -> dict[str, pd.DataFrame]:
        """requests, turns, timeseries and kv_by_namespace DataFrames."""
        requests = self.seqs.to_frame()
        requests["hop"] = pd.Categorical.from_codes(requests["hop"], HOPS)
        requests["queue_s"] = requests["first_scheduled_s"] - requests["submit_s"]
        requests["ttft_s"] = requests["first_token_s"] - requests["submit_s"]
        requests["e2e_s"] = requests["finish_s"] - requests["submit_s"]
        turns = self.turns.to_frame()
        for flag in ("is_switch", "is_routed", "is_misrouted"):
            turns[flag] = turns[flag].astype(bool)
        turns["ttft_s"] = turns["first_token_s"] - turns["arrival_s"]
        turns["e2e_s"] = turns["finish_s"] - turns["arrival_s"]
        decode_tokens = (turns["num_output_tokens"] - 1).clip(lower=1)
        turns["tpot_s"] = (turns["finish_s"] - turns["first_token_s"]) / decode_tokens
        kv = pd.DataFrame(self.kv_rows, columns=["time_s", "replica", "namespace", "blocks"])
        return dict(requests=requests.sort_values("seq_id", ignore_index=True),
                    turns=turns.sort_values(["conv_id", "turn_index"], ignore_index=True),
                    timeseries=self.samples.to_frame(), kv_by_namespace=kv)


def summarize(turns: pd.DataFrame, requests: pd.DataFrame, *, ttft_slo_s: float | None = None,
              tpot_slo_s: float | None = None, e2e_slo_s: float | None = None,
              duration_s: float | None = None) -> dict:
    """Throughput, latency percentiles and goodput of a run (a pure function of its tables);
    rates are over `duration_s` when given (a measurement window), else from the first
    arrival to the last turn done."""
    if turns.empty:
        return {"num_turns": 0}
    start = float(turns["arrival_s"].min())
    duration = duration_s or max(float(turns["done_s"].max()) - start, 1e-12)
    generated = float(requests["num_output_tokens"].sum())
    out = {"num_turns": len(turns), "num_requests": len(requests), "duration_s": duration,
           "turns_per_s": len(turns) / duration, "output_tokens_per_s": generated / duration,
           "reply_tokens_per_s": float(turns["num_output_tokens"].sum()) / duration}
    for col in ("ttft_s", "tpot_s", "e2e_s", "route_s"):
        for q in (50, 90, 99):
            out[f"{col[:-2]}_p{q}_s"] = float(np.percentile(turns[col], q))
        out[f"{col[:-2]}_mean_s"] = float(turns[col].mean())
    ok = np.ones(len(turns), dtype=bool)
    for col, slo in (("ttft_s", ttft_slo_s), ("tpot_s", tpot_slo_s), ("e2e_s", e2e_slo_s)):
        if slo is not None:
            ok &= turns[col].to_numpy() <= slo
    out["slo_attainment"] = float(ok.mean())
    out["goodput_turns_per_s"] = float(ok.sum()) / duration
    out["num_preemptions"] = int(requests["num_preemptions"].sum())
    out["num_recomputed_tokens"] = int(turns["num_recomputed_tokens"].sum())
    out["num_replay_tokens"] = int(turns["num_replay_tokens"].sum())
    out["num_reencode_tokens"] = int(turns["num_reencode_tokens"].sum())
    num_routed = int(turns["is_routed"].sum())
    out["num_routed_turns"] = num_routed
    out["num_misroutes"] = int(turns["is_misrouted"].sum())
    out["misroute_rate"] = out["num_misroutes"] / num_routed if num_routed else 0.0
    return out
