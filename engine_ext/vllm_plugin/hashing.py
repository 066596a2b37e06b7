"""Adapter identity across processes: a 31-bit FNV-1a hash of the adapter path, and its registry.

A routing decision crosses from the prefill side to the decode side as one int (0 = no adapter),
as it would inside a KV-transfer message. Each side maps it back through its own
`AdapterHashRegistry`; two paths that hash alike are refused when they are registered, so a
lookup can never resolve to the wrong adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_ADAPTER_HASH = 0
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def adapter_hash(path: str) -> int:
    """31-bit FNV-1a of the UTF-8 path; never 0 (0 means "no adapter").

    The 31-bit value doubles as vLLM's positive `lora_int_id` for adapters the router picks.
    """
    value = _FNV_OFFSET
    for byte in path.encode("utf-8"):
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    value &= 0x7FFFFFFF
    return value or 1


class HashCollisionError(ValueError):
    """Two different adapter paths share one 31-bit hash."""


@dataclass(frozen=True)
class AdapterEntry:
    """One registered adapter."""

    name: str
    """Name used in vLLM's LoRARequest."""
    path: str
    """Adapter directory (the hashed identity)."""
    hash: int
    """adapter_hash(path)."""


class AdapterHashRegistry:
    """hash -> adapter for one process; refuses collisions and duplicate names."""

    def __init__(self) -> None:
        self._by_hash: dict[int, AdapterEntry] = {}
        self._by_name: dict[str, AdapterEntry] = {}

    def register(self, name: str, path: str) -> AdapterEntry:
        """Add an adapter; re-registering the same (name, path) is a no-op."""
        entry = AdapterEntry(name=name, path=path, hash=adapter_hash(path))
        old = self._by_hash.get(entry.hash)
        if old is not None and old.path != path:
            raise HashCollisionError(
                f"adapter {path!r} hashes to {entry.hash}, already taken by {old.path!r}"
            )
        named = self._by_name.get(name)
        if named is not None and named.path != path:
            raise ValueError(f"adapter name {name!r} already names {named.path!r}, not {path!r}")
        self._by_hash[entry.hash] = entry
        self._by_name[name] = entry
        return entry

    def lookup(self, value: int) -> AdapterEntry | None:
        """Adapter for a hash, or None when this process does not know it."""
        return self._by_hash.get(value)

    def by_path(self, path: str) -> AdapterEntry | None:
        """Adapter registered under `path`, if any."""
        return self._by_hash.get(adapter_hash(path))

    def __len__(self) -> int:
        return len(self._by_hash)
