"""Per-process plugin state: config, hash registry, decision channel, counters, current step.

Where a request's adapter comes from, strongest first: the adapter it names (never rerouted), a
decision hash that arrived with it (`carried_hash`: in the KV transfer's `kv_transfer_params`, as
a decode engine receives it from the P/D proxy, or directly in `extra_args`), the local router's
decision (written to the channel on the prefill step, read back on the next step), else the base
model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine_ext.vllm_plugin.config import ConfigWatcher, PluginConfig, adapter_is_prefill_only
from engine_ext.vllm_plugin.counters import DecisionCounters, default_counter_dir
from engine_ext.vllm_plugin.direft import ModelShape, ReftStep, ReftStore
from engine_ext.vllm_plugin.guards import Support, log_refusal
from engine_ext.vllm_plugin.hashing import (
    NO_ADAPTER_HASH,
    AdapterEntry,
    AdapterHashRegistry,
    adapter_hash,
)

HASH_KEY = "molcap_adapter_hash"
logger = logging.getLogger(__name__)


def carried_hash(sampling_params) -> int | None:
    """The decision a request carries: `extra_args[HASH_KEY]`, else the one in its
    `extra_args["kv_transfer_params"]` (the prefill engine's transfer metadata); None: none."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    value = extra.get(HASH_KEY)
    if value is None:
        value = (extra.get("kv_transfer_params") or {}).get(HASH_KEY)
    return None if value is None else int(value)


@dataclass
class RoutePlan:
    """A request whose prompt ends in this step and is routed after layer k."""

    index: int
    """Row of the request in the batch."""
    request_id: str
    token_start: int
    """First of its prompt tokens in the step's flat token order."""
    token_end: int
    """One past its last prompt token in the step."""
    final: bool = True
    """Decide in this step (the prompt ends here, or a re-decision is due)."""
    whole: bool = True
    """All the tokens decided on are in this step: the decision applies from layer k+1 on.
    Otherwise the tokens computed earlier ran the layers above k under another adapter, and the
    request is recomputed under the decision (`PluginState.recompute`)."""
    redecide: bool = False
    """A re-decision of a request already routed (RouterConfig.redecide_every)."""


@dataclass
class StepState:
    """What the runner patch computed for the step now running (read by the layer-k hook)."""

    req_lora_ids: np.ndarray
    num_computed: np.ndarray
    num_scheduled: np.ndarray
    num_prompt: np.ndarray
    num_sampled: np.ndarray
    lora_paths: dict[int, str]
    mapping_type: object
    routes: list[RoutePlan] = field(default_factory=list)
    reft_ids: set[int] = field(default_factory=set)
    """lora ids of the DiReFT adapters in the step (out of vLLM's LoRA path)."""
    reft: ReftStep | None = None
    """The DiReFT edits the layer hooks apply."""


SUPPORT = Support()
"""Features refused in this process (kept across `reset_state`: they describe vLLM itself)."""


class PluginState:
    """Everything the plugin keeps in one process."""

    def __init__(self, watcher: ConfigWatcher | None = None,
                 support: Support | None = None) -> None:
        self.watcher = watcher or ConfigWatcher.from_env()
        self.config = PluginConfig()
        self.registry = AdapterHashRegistry()
        self.support = SUPPORT if support is None else support
        self.counters = DecisionCounters(default_counter_dir(), refused=self.support.refused)
        self.channel: dict[str, int] = {}
        """request id -> decision hash written by the local router (the "KV transfer")."""
        self.resolved: dict[str, int] = {}
        """request id -> lora id of a decision already read (0: base or unknown)."""
        self.pending_applied: dict[str, int] = {}
        self.step: StepState | None = None
        self.router = None
        self.route_module = None
        """The decoder layer whose output the router reads."""
        self.runner = None
        self.reft_store = ReftStore()
        self.model_shape: ModelShape | None = None
        """The served model, set when the runner loads it (DiReFT files are checked against it)."""
        self.loaded_versions: dict[int, tuple] = {}
        """lora id -> version of the adapter files this worker loaded."""
        self.pooled: dict[str, list] = {}
        """request id -> layer-k states of its tokens so far (routing across steps)."""
        self.routed: dict[str, int] = {}
        """request id -> hash the router gave it (kept for re-decisions only)."""
        self.recompute: dict[str, int] = {}
        """request id -> decision whose request must be recomputed (read by the scheduler)."""
        self.scheduler_here = False
        """vLLM's scheduler runs in this process (it then applies `recompute`)."""
        self.refresh()

    def refresh(self) -> PluginConfig:
        """Re-read the config if its mtime changed; rebuild what depends on it."""
        config = self.watcher.current()
        if config is not self.config:
            self.config = config
            self.registry = config.build_registry()
            directory = Path(config.counter_dir) if config.counter_dir else default_counter_dir()
            if directory != self.counters.directory:
                self.counters = DecisionCounters(directory, refused=self.support.refused)
                self.counters.flush()
            self.router = None  # rebuilt by the model hook with the new options
        return config

    def refuse(self, feature: str, reason: str) -> None:
        """Refuse a feature in this process: one log line, recorded in the counter file."""
        if self.support.refuse(feature, reason):
            log_refusal(feature, reason)
            self.counters.flush()

    def unrouted(self, request_id: str, reason: str) -> None:
        """A routing candidate the router cannot decide for: base model, counted, logged once."""
        if not self.counters.counts["unrouted"]:
            logger.warning("molcap: request %s not routed (runs on the base model): %s; "
                           "further cases are only counted (kind=unrouted)", request_id, reason)
        self.counters.add("unrouted", request_id, NO_ADAPTER_HASH, reason)
        self.resolved[request_id] = NO_ADAPTER_HASH

    def reject(self, request_id: str, reason: str) -> None:
        """Count a request refused at the front end because a feature it needs is refused."""
        self.counters.add("rejected", request_id, 0, reason)

    def is_prefill_only(self, path: str) -> bool:
        """Whether the adapter at `path` is LoRA_P under the current config."""
        return adapter_is_prefill_only(path, self.config)

    def entry_by_name(self, name: str | None) -> AdapterEntry | None:
        """Registered adapter of a config name (None: base)."""
        if name is None:
            return None
        path = next(a.path for a in self.config.adapters if a.name == name)
        return self.registry.lookup(adapter_hash(path))

    def write_decision(self, request_id: str, name: str | None) -> int:
        """Prefill side: publish the router's choice as a hash; returns it."""
        entry = self.entry_by_name(name)
        value = NO_ADAPTER_HASH if entry is None else entry.hash
        self.channel[request_id] = value
        self.counters.add("written", request_id, value, None if entry is None else entry.path)
        return value

    def request_recompute(self, request_id: str, value: int) -> None:
        """The decision arrived after tokens ran under another adapter: recompute the request.

        The scheduler drops the token sampled in this step, preempts the request and resumes it
        under the decision; its next step reads the decision like any other.
        """
        self.recompute[request_id] = value
        self.pooled[request_id] = []  # the recompute runs every token through layer k again
        self.resolved.pop(request_id, None)

    def read_decision(self, request_id: str, incoming: int | None) -> AdapterEntry | None:
        """Decode side: the adapter decided for a request, resolved once through the registry.

        Returns None for the base model, for an unknown hash (counted and logged) and for a
        request with no decision at all.
        """
        if request_id in self.resolved:
            return self.registry.lookup(self.resolved[request_id])
        value = self.channel.pop(request_id, incoming)
        if value is None:
            return None
        self.counters.add("read", request_id, value, None)
        entry = self.registry.lookup(value) if value != NO_ADAPTER_HASH else None
        if value != NO_ADAPTER_HASH and entry is None:
            self.counters.add("unknown", request_id, value, None)
            logger.warning("molcap: request %s carries adapter hash %d that this process's "
                           "registry does not hold; running it on the base model",
                           request_id, value)
            self.resolved[request_id] = NO_ADAPTER_HASH
            return None
        self.resolved[request_id] = value
        self.pending_applied[request_id] = value
        return entry

    def mark_applied(self) -> None:
        """Count the decisions read this step once their mapping is live in the engine."""
        for request_id, value in self.pending_applied.items():
            entry = self.registry.lookup(value)
            self.counters.add("applied", request_id, value, None if entry is None else entry.path)
        self.pending_applied.clear()

    def forget(self, live_request_ids: set[str]) -> None:
        """Drop decisions of requests that have left the engine."""
        for table in (self.channel, self.resolved, self.pooled, self.routed):
            for request_id in [r for r in table if r not in live_request_ids]:
                del table[request_id]


_STATE: PluginState | None = None


def get_state() -> PluginState:
    """This process's plugin state (created on first use)."""
    global _STATE
    if _STATE is None:
        _STATE = PluginState()
    return _STATE


def reset_state(watcher: ConfigWatcher | None = None,
                support: Support | None = None) -> PluginState:
    """Replace this process's state (tests, or a config path set after start-up)."""
    global _STATE
    _STATE = PluginState(watcher, support)
    return _STATE
