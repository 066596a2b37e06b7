"""vLLM plugin: LoRA_P, DiReFT_P and in-engine routing (also across a KV transfer), guarded.

Declared under the `vllm.general_plugins` entry point, so vLLM calls `register()` in every
process it starts (front end, engine core, workers), possibly several times: `register()` is
re-entrant and imports vLLM only when called. Configuration: the file named by
`MOLCAP_VLLM_PLUGIN_CONFIG` (see `config.py`); docs/vllm_plugin.md says how to enable it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_REGISTERED = False


def register() -> None:
    """Install the plugin's hooks into vLLM once per process."""
    global _REGISTERED
    if _REGISTERED:
        return
    from engine_ext.vllm_plugin import patches

    patches.install()
    _register_metrics()
    _REGISTERED = True
    logger.info("molcap vLLM plugin registered")


def is_registered() -> bool:
    """Whether `register()` has run in this process."""
    return _REGISTERED


def _register_metrics() -> None:
    """Expose the summed decision counters on vLLM's /metrics (prometheus_client registry)."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    from engine_ext.vllm_plugin.counters import MetricsCollector
    from engine_ext.vllm_plugin.runtime import get_state

    def directory():
        state = get_state()
        state.refresh()
        return state.counters.directory

    if getattr(REGISTRY, "_molcap_collector", None) is None:  # once per registry, not per call
        REGISTRY._molcap_collector = MetricsCollector(directory)
        REGISTRY.register(REGISTRY._molcap_collector)
