"""Prefill/decode disaggregation: a hop prefills on a prefill worker, its KV crosses the link,
and a decode worker continues it with the prompt's KV already present (no recompute).

The chosen adapter travels with the transfer (the decode sequence carries it), so the decode
worker applies the adapter the prefill side routed to.
"""

from __future__ import annotations

from sim.config import DisaggregationSpec, SimConfig
from sim.cost.memory_model import kv_bytes_per_token, kv_replication
from sim.engine.cluster import Router
from sim.engine.sequence import Sequence


class Disaggregation:
    """Runs hops split over prefill and decode workers."""

    def __init__(self, config: SimConfig, spec: DisaggregationSpec, decode_router: Router):
        arch, tp = config.arch, config.tensor_parallel_size
        self.kv_bytes_per_token = kv_bytes_per_token(arch) * kv_replication(arch, tp)
        self.bandwidth = spec.kv_transfer_bandwidth_bytes_per_s
        self.decode_router = decode_router

    def transfer_s(self, num_tokens: int) -> float:
        """Seconds to move `num_tokens` of KV (each GPU sends its shard in parallel)."""
        return num_tokens * self.kv_bytes_per_token / self.bandwidth

    def start(self, driver, fields: dict, turn) -> None:
        """Prefill on the turn's prefill worker; the transfer and decode follow by callbacks,
        and `driver.on_hop_done` gets the decode sequence."""
        def on_prefilled(prefill: Sequence) -> None:
            driver.recorder.on_seq(prefill, turn.rec)
            driver.env.timeout(self.transfer_s(prefill.num_prompt_tokens)).callbacks.append(
                lambda _event: self._decode(driver, fields, turn, prefill))

        prefill = driver.new_seq(dict(fields, hop="prefill", num_output_tokens=1), turn,
                                 on_prefilled)
        turn.replica.submit(prefill)

    def _decode(self, driver, fields: dict, turn, prefill: Sequence) -> None:
        """The KV has arrived: continue on a decode worker."""
        def on_decoded(decode: Sequence) -> None:
            driver.recorder.on_seq(decode, turn.rec)
            decode.num_prefill_tokens_computed = prefill.num_prefill_tokens_computed
            decode.num_cached_tokens = prefill.num_cached_tokens
            decode.num_replay_tokens = prefill.num_replay_tokens
            decode.is_replay_done = prefill.is_replay_done
            decode.num_reencode_tokens = prefill.num_reencode_tokens
            decode.num_reencode_context_tokens = prefill.num_reencode_context_tokens
            driver.advance_after_hop(decode)

        decode_fields = dict(fields, num_replay_tokens=0, num_reencode_tokens=0,
                             num_routing_decisions=0, is_kv_preloaded=True)
        decode = driver.new_seq(decode_fields, turn, on_decoded)
        decode.num_generated_tokens = 1
        decode.first_token_s = prefill.first_token_s
        self.decode_router.choose(0, decode.adapter, None).submit(decode)
