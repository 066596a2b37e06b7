"""What an adapter directory holds, and which version of it: read once per file change.

An adapter named by a `LoRARequest` is a PEFT LoRA directory (all-token, or LoRA_P when
prefill-only) or an engine_ext DiReFT directory (`peft_type: DIREFT`, DiReFT_P when prefill-only).
Its version is the (mtime, size) of its two files: an adapter rewritten in place at the same path
gets a new version, which is part of its prefix-cache key (only that adapter's cached blocks stop
matching) and makes the worker reload it. Adding an adapter changes no key of any other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine_ext.peft_io import CONFIG_NAME, WEIGHTS_NAME
from engine_ext.reft_io import PEFT_TYPE as DIREFT_TYPE

Version = tuple[int, ...]


def adapter_version(path: str) -> Version:
    """(mtime_ns, size) of the adapter's config and weights files; () when they are missing."""
    stamp: list[int] = []
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        try:
            stat = (Path(path) / name).stat()
        except OSError:
            return ()
        stamp += [stat.st_mtime_ns, stat.st_size]
    return tuple(stamp)


@dataclass(frozen=True)
class AdapterFile:
    """The parts of an adapter's config the plugin acts on."""

    is_direft: bool
    prefill_only: bool


@lru_cache(maxsize=1024)
def _read(path: str, version: Version) -> AdapterFile:
    del version  # cache key only: a rewritten file is read again
    try:
        raw = json.loads((Path(path) / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    return AdapterFile(is_direft=raw.get("peft_type") == DIREFT_TYPE,
                       prefill_only=bool(raw.get("prefill_only", False)))


def adapter_file(path: str) -> AdapterFile:
    """The current content of the adapter's config (re-read when its files change)."""
    return _read(path, adapter_version(path))
