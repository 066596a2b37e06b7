"""Strategy behaviour lives in the strategy objects (`sim.strategies`): no code in sim/ or
planner/ outside sim/strategies/ compares a value with a registered kind string; it asks the
strategy (`get_strategy(kind).uses_adapters`, `.is_reference`, ...) instead."""

import ast
from pathlib import Path

from sim.strategies.registry import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("sim", "planner")
EXEMPT = Path("sim", "strategies")


def _strings(node: ast.AST) -> list[str]:
    """String constants a comparison operand names: itself, or the items of a literal tuple,
    list or set (`kind in ("mol", "mol2")`)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def kind_comparisons(source: str, kinds) -> list[tuple[int, str]]:
    """(line, kind) of each comparison with, or match case on, a kind string in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            out += [(node.lineno, s) for o in operands for s in _strings(o) if s in kinds]
        elif isinstance(node, ast.MatchValue):
            out += [(node.lineno, s) for s in _strings(node.value) if s in kinds]
    return out


def _checked_files():
    for package in CHECKED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.relative_to(ROOT).is_relative_to(EXEMPT):
                yield path


def test_no_kind_string_comparisons_outside_the_strategies():
    found = [f"{path.relative_to(ROOT)}:{line}: compares with {kind!r}"
             for path in _checked_files()
             for line, kind in kind_comparisons(path.read_text(), set(STRATEGIES))]
    assert not found, ("ask the strategy object (sim.strategies) instead of comparing kind "
                       "strings:\n" + "\n".join(found))


def test_the_check_sees_each_form_of_comparison():
    source = ('if s.kind != "base": pass\n'
              'x = kind in ("mol", "mol2")\n'
              'match kind:\n    case "multi_agent": pass\n'
              'y = adapter == "lora"\n')
    assert kind_comparisons(source, set(STRATEGIES)) == [
        (1, "base"), (2, "mol"), (2, "mol2"), (4, "multi_agent")]
    assert len(list(_checked_files())) > 50
