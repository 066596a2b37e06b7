"""sim/ and planner/ never import torch, vLLM or streamlit, even indirectly (house style)."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import planner
import sim

BLOCKED = ("torch", "vllm", "streamlit")
ROOT = Path(__file__).resolve().parents[1]


def _modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def test_sim_and_planner_import_without_heavy_modules():
    modules = _modules(sim) + _modules(planner)
    assert "sim.cost_model" in modules and "planner.cli" in modules
    script = f"""
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("blocked heavy module " + name)
sys.meta_path.insert(0, Block())
for name in {modules!r}:
    importlib.import_module(name)
print("imported", len({modules!r}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"imported {len(modules)}" in done.stdout


def test_the_blocker_catches_a_heavy_import():
    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "json":
            raise ImportError("blocked")
sys.meta_path.insert(0, Block())
sys.modules.pop("json", None)
import json
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode != 0 and "blocked" in done.stderr
