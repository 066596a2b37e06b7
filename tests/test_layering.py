"""The packages' layering (house style): imports point one way and no module imports itself back.

* `sim/` and `planner/` (and the `molcap` command line) never import torch, vLLM or streamlit,
  even indirectly.
* Packages import only downward: app -> planner -> sim; app -> calibrate -> sim, engine_ext;
  engine_ext imports nothing of ours but the router-card schema in sim. Imports inside functions
  count: a lazy upward import is still upward.
* No import cycle between files, lazy imports included.
"""

import ast
import graphlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import planner
import sim

BLOCKED = ("torch", "vllm", "streamlit")
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "planner", "calibrate", "engine_ext", "app")
ALLOWED = {
    "sim": ("sim",),
    "planner": ("planner", "sim"),
    "engine_ext": ("engine_ext", "sim.strategies.router_card", "sim.frozen"),
    "calibrate": ("calibrate", "sim", "engine_ext"),
    "app": ("app", "planner", "calibrate", "sim"),
}
"""Package -> the modules (or packages, by prefix) its files may import."""


def _modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the packages."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_modules(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """Modules of ours that `path` (module `name`) imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: None if path.name == "__init__.py" else -1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return {m for m in found if m.split(".")[0] in known_roots(known)}


def known_roots(known: dict[str, Path]) -> set[str]:
    return {name.split(".")[0] for name in known}


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    known = module_files(root, packages)
    return {name: imported_modules(path, name, known) - {name} for name, path in known.items()}


def upward_imports(graph: dict[str, set[str]], allowed=ALLOWED) -> list[str]:
    """`module -> import` for every import its package may not make."""
    def is_allowed(module: str, target: str) -> bool:
        rules = allowed[module.split(".")[0]]
        return any(target == rule or target.startswith(rule + ".") for rule in rules)

    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if not is_allowed(m, t))


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle between files, or None."""
    ours = {m: {t for t in targets if t in graph} for m, targets in graph.items()}
    try:
        tuple(graphlib.TopologicalSorter(ours).static_order())
    except graphlib.CycleError as err:
        return err.args[1]
    return None


def test_no_package_imports_upward():
    assert upward_imports(import_graph(ROOT)) == []


def test_no_import_cycle_between_files():
    assert cycle(import_graph(ROOT)) is None


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("lazy", [False, True])
def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path, lazy):
    indent = "def f():\n    " if lazy else ""
    _write(tmp_path, {
        "sim/__init__.py": "", "planner/__init__.py": "",
        "sim/a.py": f"{indent}from planner import b\n",
        "planner/b.py": f"{indent}from sim.a import x\n",
        "planner/c.py": f"{indent}import sim.a\n",
    })
    graph = import_graph(tmp_path, ("sim", "planner"))
    assert upward_imports(graph) == ["sim.a -> planner.b"]
    assert set(cycle(graph)) == {"sim.a", "planner.b"}
    (tmp_path / "sim/a.py").write_text("x = 1\n", encoding="utf-8")
    graph = import_graph(tmp_path, ("sim", "planner"))
    assert upward_imports(graph) == [] and cycle(graph) is None


def test_sim_planner_and_the_cli_import_without_heavy_modules():
    modules = _modules(sim) + _modules(planner) + ["app.cli", "app.calibrate_commands"]
    assert "sim.cost.cost_model" in modules and "planner.cli.commands" in modules
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
