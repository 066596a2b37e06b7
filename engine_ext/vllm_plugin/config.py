"""The plugin's configuration file: adapters, prefill-only flags, the in-engine router.

The file (YAML or JSON) is named by the environment variable `MOLCAP_VLLM_PLUGIN_CONFIG` and
parsed only here. `ConfigWatcher` re-reads it only when its mtime changes, so a running engine
picks up new adapters or router options without a restart, and pays one `stat` per step.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine_ext.vllm_plugin.adapters import adapter_file
from engine_ext.vllm_plugin.hashing import AdapterHashRegistry

CONFIG_ENV = "MOLCAP_VLLM_PLUGIN_CONFIG"
logger = logging.getLogger(__name__)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AdapterConfig(_Frozen):
    """One adapter the plugin knows by name (the router picks among these)."""

    name: str
    """vLLM LoRARequest name."""
    path: str
    """PEFT adapter directory; its FNV-1a hash is the adapter's identity across processes."""
    prefill_only: bool | None = None
    """LoRA_P: prompt tokens only. None: read `prefill_only` from the adapter_config.json."""


class RouterOptionConfig(_Frozen):
    """One option of the pointer head."""

    adapter: str | None
    """Adapter name from `adapters`; None routes to the base model."""
    description_token_ids: list[int] = Field(min_length=1)
    """Token ids of the option's description (embedded once at start-up)."""


class RouterConfig(_Frozen):
    """In-engine routing on the layer-k hidden state (MoL2 pointer head from engine_ext)."""

    route_layer: int = Field(ge=0)
    """k: the mean-pooled output of decoder layer k is the query; adapters sit above k."""
    head_path: str
    """safetensors state dict of an engine_ext `PointerHead`."""
    d_head: int = Field(default=64, ge=1)
    """PointerHead d_head."""
    num_heads: int = Field(default=4, ge=1)
    """PointerHead num_heads."""
    option_depth: int = Field(default=2, ge=0)
    """PointerHead option_depth."""
    options: list[RouterOptionConfig] = Field(min_length=1)
    """The options scored per request."""
    redecide_every: int | None = Field(default=None, ge=1)
    """Re-route a routed request every k generated tokens on all its tokens so far (the
    agent/tool-call case); a changed decision recomputes the context under the new adapter.
    None: decide once, on the prompt."""


class PluginConfig(_Frozen):
    """Everything the plugin reads from its file."""

    adapters: list[AdapterConfig] = []
    """Adapters known by name (routing targets, prefill-only overrides)."""
    router: RouterConfig | None = None
    """In-engine routing; None disables it."""
    counter_dir: str | None = None
    """Folder for per-process decision counters; None: a folder under the system temp dir."""

    @model_validator(mode="after")
    def _options_name_adapters(self) -> PluginConfig:
        names = {a.name for a in self.adapters}
        if len(names) != len(self.adapters):
            raise ValueError(f"adapter names repeat: {[a.name for a in self.adapters]}")
        if self.router is not None:
            unknown = [o.adapter for o in self.router.options
                       if o.adapter is not None and o.adapter not in names]
            if unknown:
                raise ValueError(f"router options name unknown adapters {unknown}; "
                                 f"known: {sorted(names)}")
        return self

    def build_registry(self) -> AdapterHashRegistry:
        """hash -> adapter registry of this file; raises HashCollisionError on a collision."""
        registry = AdapterHashRegistry()
        for adapter in self.adapters:
            registry.register(adapter.name, adapter.path)
        return registry


def load_plugin_config(path: str | Path) -> PluginConfig:
    """Parse and validate the file (YAML or JSON)."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    return PluginConfig.model_validate(raw)


class ConfigWatcher:
    """The current config of a file, re-read only when the file's mtime changes."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        self.num_loads = 0
        self.last_error: str | None = None
        self._mtime_ns: int | None = None
        self._config = PluginConfig()

    @classmethod
    def from_env(cls) -> ConfigWatcher:
        """Watcher of the file named by MOLCAP_VLLM_PLUGIN_CONFIG (none: an empty config)."""
        return cls(os.environ.get(CONFIG_ENV) or None)

    def current(self) -> PluginConfig:
        """The config; re-parsed when the mtime moved. A bad new file keeps the last good one."""
        if self.path is None:
            return self._config
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError as err:
            self.last_error = str(err)
            return self._config
        if mtime != self._mtime_ns:
            self._mtime_ns = mtime
            try:
                config = load_plugin_config(self.path)
                config.build_registry()  # refuse hash collisions before switching over
            except (OSError, ValueError, ValidationError, yaml.YAMLError) as err:
                self.last_error = f"{self.path}: {err}"
                logger.error("molcap plugin config not reloaded: %s", self.last_error)
                return self._config
            self._config, self.last_error = config, None
            self.num_loads += 1
        return self._config


def adapter_is_prefill_only(path: str, config: PluginConfig) -> bool:
    """Whether the adapter at `path` is prefill-only (LoRA_P, DiReFT_P): the plugin config wins,
    else its adapter_config.json."""
    for adapter in config.adapters:
        if adapter.path == path and adapter.prefill_only is not None:
            return adapter.prefill_only
    return adapter_file(path).prefill_only
