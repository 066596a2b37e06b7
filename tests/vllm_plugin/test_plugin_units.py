"""Plugin pieces that need no engine: hash, registry, config file, mapping, counters, loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from vllm_helpers import colliding_paths

from engine_ext.forward_context import build_token_slots
from engine_ext.vllm_plugin.config import ConfigWatcher, PluginConfig, adapter_is_prefill_only
from engine_ext.vllm_plugin.counters import DecisionCounters, sum_counters
from engine_ext.vllm_plugin.hashing import AdapterHashRegistry, HashCollisionError, adapter_hash
from engine_ext.vllm_plugin.mapping import step_lora_mapping

ROOT = Path(__file__).resolve().parents[2]


def _colliding_paths() -> tuple[str, str]:
    """Two distinct paths with one 31-bit hash (birthday search, ~50k hashes)."""
    seen: dict[int, str] = {}
    i = 0
    while True:
        path = f"/adapters/{i}"
        value = adapter_hash(path)
        if value in seen:
            return seen[value], path
        seen[value] = path
        i += 1


def test_hash_is_31_bit_fnv1a_and_never_zero():
    # FNV-1a 32-bit reference values, masked to 31 bits.
    assert adapter_hash("") == 0x811C9DC5 & 0x7FFFFFFF
    assert adapter_hash("a") == 0xE40C292C & 0x7FFFFFFF
    assert adapter_hash("foobar") == 0xBF9CF968 & 0x7FFFFFFF
    values = [adapter_hash(f"/x/{i}") for i in range(1000)]
    assert all(0 < v < 2**31 for v in values)


def test_registry_refuses_a_collision_and_maps_hashes_back():
    first, second = _colliding_paths()
    assert first != second and adapter_hash(first) == adapter_hash(second)
    registry = AdapterHashRegistry()
    entry = registry.register("a", first)
    assert registry.register("a", first) == entry  # same adapter again: fine
    with pytest.raises(HashCollisionError, match="already taken"):
        registry.register("b", second)
    assert registry.lookup(entry.hash) == entry and registry.lookup(12345) is None
    with pytest.raises(ValueError, match="already names"):
        registry.register("a", "/elsewhere")
    config = PluginConfig(adapters=[{"name": "a", "path": first}, {"name": "b", "path": second}])
    with pytest.raises(HashCollisionError):
        config.build_registry()


def test_config_is_reread_only_when_its_mtime_changes(tmp_path):
    file = tmp_path / "plugin.yaml"
    file.write_text("adapters: [{name: a, path: /a}]\n")
    watcher = ConfigWatcher(file)
    assert [a.name for a in watcher.current().adapters] == ["a"] and watcher.num_loads == 1
    stat = file.stat()
    file.write_text("adapters: [{name: b, path: /b}]\n")
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: not re-read
    assert [a.name for a in watcher.current().adapters] == ["a"] and watcher.num_loads == 1
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert [a.name for a in watcher.current().adapters] == ["b"] and watcher.num_loads == 2
    file.write_text("adapters: [{name: c, path: /c, bogus: 1}]\n")  # invalid: keep the last good
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))
    assert [a.name for a in watcher.current().adapters] == ["b"]
    assert "bogus" in watcher.last_error


def test_config_rejects_router_options_naming_unknown_adapters():
    with pytest.raises(ValueError, match="unknown adapters"):
        PluginConfig(adapters=[], router={"route_layer": 1, "head_path": "h", "options": [
            {"adapter": "nope", "description_token_ids": [1]}]})


def test_prefill_only_flag_from_adapter_file_or_config(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"prefill_only": True}))
    assert adapter_is_prefill_only(str(tmp_path), PluginConfig())
    override = PluginConfig(adapters=[{"name": "x", "path": str(tmp_path), "prefill_only": False}])
    assert not adapter_is_prefill_only(str(tmp_path), override)
    assert not adapter_is_prefill_only(str(tmp_path / "missing"), PluginConfig())


def test_step_mapping_equals_engine_ext_per_request():
    # Ragged step: a chunk straddling the prompt end, a decode token, a fresh prompt, base.
    lora = np.array([7, 7, 9, 0])
    computed, scheduled = np.array([8, 12, 0, 5]), np.array([6, 1, 4, 3])
    prompt, sampled = np.array([10, 12, 4, 6]), np.array([1, 1, 1, 1])
    prefill_only = {7: True, 9: False}
    sampled_map, token_map = step_lora_mapping(lora, computed, scheduled, prompt, sampled,
                                               prefill_only.__getitem__)
    expected = []
    for i in range(4):
        slot = [7, 9].index(lora[i]) if lora[i] else -1
        pos = torch.arange(computed[i], computed[i] + scheduled[i])[None]
        slots = build_token_slots([slot], pos, [int(prompt[i])], [True, False]).tolist()
        expected += [0 if s < 0 else [7, 9][s] for s in slots]
    assert token_map == tuple(expected) == (7, 7, 0, 0, 0, 0, 0, 9, 9, 9, 9, 0, 0, 0)
    assert sampled_map == (0, 0, 9, 0)


def test_counters_from_several_processes_are_summed(tmp_path):
    DecisionCounters(tmp_path, role="prefill").add("written", "r1", 5, "/a")
    script = ("import sys; from pathlib import Path; "
              "from engine_ext.vllm_plugin.counters import DecisionCounters as C; "
              "c = C(Path(sys.argv[1]), role='decode'); c.add('read', 'r1', 5, None); "
              "c.add('unknown', 'r1', 5, None)")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, cwd=ROOT)
    totals = sum_counters(tmp_path)
    assert totals.counts == {"written": 1, "read": 1, "applied": 0, "unknown": 1, "unrouted": 0,
                             "rejected": 0}
    assert sorted(p["role"] for p in totals.per_process) == ["decode", "prefill"]
    assert totals.undelivered == 0 and sum_counters(tmp_path / "none").counts["written"] == 0


def test_importing_the_plugin_does_not_import_vllm():
    script = ("import sys, engine_ext.vllm_plugin as p, engine_ext.vllm_plugin.runtime, "
              "engine_ext.vllm_plugin.router; assert 'vllm' not in sys.modules, 'vllm imported'; "
              "assert not p.is_registered()")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_entry_point_loads_and_register_is_reentrant():
    # A fresh interpreter: vLLM finds the plugin through the installed entry point.
    script = """
from importlib.metadata import entry_points
names = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
assert names.get("molcap") == "engine_ext.vllm_plugin:register", names
from vllm.plugins import load_general_plugins
load_general_plugins()
import engine_ext.vllm_plugin as plugin
assert plugin.is_registered()
from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin as M
first = M.set_active_loras
plugin._REGISTERED = False
plugin.register()
from engine_ext.vllm_plugin import patches
patches.install()
assert M.set_active_loras is first and getattr(first, "__molcap_wrapped__")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("root", [
    "/tmp/pytest-of-root/pytest-0/test_a_hash_collision_is_refus0",  # had no "c{i}" collision
    "/tmp/pytest-of-root/pytest-1/test_a_hash_collision_is_refus0",
    "/home/runner/work/tmp/pytest-0/x", "relative", ""])
def test_the_engine_tests_collision_search_finds_a_pair_under_any_folder(root):
    # The engine test builds two colliding adapter folders under its tmp_path: the search must
    # not depend on that folder's name (it did, and failed on every new machine).
    first, second = colliding_paths(Path(root))
    assert first != second and first.parent == second.parent == Path(root)
    assert adapter_hash(str(first)) == adapter_hash(str(second))
