"""Edit a scenario's YAML text one field at a time, keeping the user's comments and anchors.

The dashboard's knobs write through here: a scalar that sits on its own `key: value` line is
replaced in place; anything else (a missing key, a flow-style mapping, a list) falls back to
rewriting the whole document from the parsed data. Validation stays in `planner.scenario.loading`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from planner.scenario.schema import Scenario
from sim.io.yaml_input import parse_yaml

_SCALAR_LINE = re.compile(r"^(?P<head>\s*(?:- )?[\w.-]+:\s*)(?P<value>[^#\n{}\[\]&*]*?)"
                          r"(?P<tail>\s*(?:#.*)?)$")
"""`  key: value  # comment` with a plain scalar value (no flow collections, anchors, aliases)."""


def _scalar_text(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("...").strip()


def _get(data: Any, parts: list[str]) -> Any:
    for part in parts:
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def _set(data: dict, parts: list[str], value: Any) -> None:
    node: Any = data
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value


def set_field(text: str, path: str, value: Any) -> str:
    """`text` with the field at dotted `path` (e.g. `workload.arrival_rate_per_s`) set to
    `value`; raises ScenarioError when `text` itself is not YAML."""
    data, index = parse_yaml(text, "<edit>")
    if not isinstance(data, dict):
        data = {}
    parts = path.split(".")
    try:
        present = _get(data, parts)
        found = True
    except (KeyError, IndexError, TypeError, ValueError):
        present, found = None, False
    if found and not isinstance(present, (dict, list)) and not isinstance(value, (dict, list)):
        lines = text.split("\n")
        number = index.key_lines.get((id(_get(data, parts[:-1])), parts[-1]))
        if number is not None and number <= len(lines):
            match = _SCALAR_LINE.match(lines[number - 1])
            if match and match.group("value").strip():
                lines[number - 1] = match.group("head") + _scalar_text(value) + match.group("tail")
                return "\n".join(lines)
    inserted = _insert_line(text, data, index, parts, value)
    if inserted is not None:
        return inserted
    _set(data, parts, value)
    return dump(data)


def _insert_line(text: str, data: dict, index, parts: list[str], value: Any) -> str | None:
    """`text` with `key: value` added as the first child of an existing block mapping, or None
    when the parent is missing, a list or written in flow style."""
    try:
        parent = _get(data, parts[:-1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if not isinstance(parent, dict) or not parent or isinstance(value, (dict, list)):
        return None
    lines = text.split("\n")
    child = index.key_lines.get((id(parent), next(iter(parent))))
    if child is None or child > len(lines):
        return None
    line = lines[child - 1]
    indent = line[: len(line) - len(line.lstrip())]
    if line.lstrip().startswith(("- ", "{")) or not indent and parts[:-1]:
        return None
    lines.insert(child - 1, f"{indent}{parts[-1]}: {_scalar_text(value)}")
    return "\n".join(lines)


def dump(data: dict) -> str:
    """YAML text of parsed scenario data, in the order the keys were given."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def set_num_adapters(text: str, num_adapters: int) -> str:
    """Every adapter strategy serving `num_adapters` adapters: extra ones copy the first
    adapter's shape under the names domain<i>; fewer keep the first ones (the whole document is
    rewritten, so anchors expand)."""
    data, _ = parse_yaml(text, "<edit>")
    for strategy in data.get("strategies") or []:
        adapters = strategy.get("adapters") if isinstance(strategy, dict) else None
        if not adapters:
            continue
        names = {a.get("name") for a in adapters}
        grown = [dict(a) for a in adapters[:num_adapters]]
        i = 0
        while len(grown) < num_adapters:
            name = f"domain{i}"
            i += 1
            if name not in names:
                grown.append(dict(adapters[0], name=name))
        strategy["adapters"] = grown
        if strategy.get("router_adapter") not in (None, *(a.get("name") for a in grown)):
            strategy["router_adapter"] = grown[0].get("name")
    return dump(data)


def field_value(scenario: Scenario, path: str) -> Any:
    """The validated value at dotted `path` (defaults filled in)."""
    return _get(scenario.model_dump(mode="json"), path.split("."))


def num_adapters(scenario: Scenario) -> int:
    """Adapters of the scenario's strategy with the most (0 when none has any)."""
    return max((len(getattr(s, "adapters", ())) for s in scenario.strategies), default=0)


def field_spec(scenario: Scenario, path: str) -> dict:
    """What a form widget for the field at `path` needs: its description and numeric bounds
    (`ge`/`gt`/`le`/`lt`, from the model's constraints), read from the validated scenario."""
    node: Any = scenario
    parts = path.split(".")
    for part in parts[:-1]:
        node = getattr(node, part)
    info = type(node).model_fields[parts[-1]]
    spec = {"description": info.description or ""}
    for meta in info.metadata:
        for bound in ("ge", "gt", "le", "lt"):
            if getattr(meta, bound, None) is not None:
                spec[bound] = getattr(meta, bound)
    return spec
