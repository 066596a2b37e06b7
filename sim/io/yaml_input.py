"""The one place YAML is parsed: text in, a validated pydantic model or located errors out.

Every problem becomes one line `FILE:LINE: field.path: what is wrong (given: VALUE)`, so a user
can jump to it; duplicate keys, malformed YAML, deep nesting and alias bombs are caught before
validation. Scenarios (`planner.scenario.loading`), sweep specs and cost profiles all come
through here.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

_PATH_PREFIX = re.compile(r"^[A-Za-z_]\w*(\.\w+)*: ")
"""Cross-field rules start each problem with the field path they are about: "a.b.0.c: ..."."""


class ScenarioError(Exception):
    """An input file (scenario, sweep spec, cost profile) that cannot be used; `messages` holds
    one located line per problem."""

    def __init__(self, messages: list[str]):
        super().__init__("\n".join(messages))
        self.messages = messages


MAX_FILE_BYTES = 1_000_000
"""Largest scenario or spec file read (real ones are a few kB): a bigger one is refused by size,
before it is read or parsed."""
MAX_DEPTH = 50
"""Deepest nesting of YAML collections accepted (scenarios nest about 5 deep)."""
MAX_NODES = 100_000
"""Most YAML nodes a document may expand to, aliases counted at every use (an alias bomb
expands exponentially)."""
MAX_SHOWN_CHARS = 120
"""Longest value echoed in a message; longer ones are cut and their length given."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


def shorten(value: object) -> str:
    """`repr(value)`, cut to MAX_SHOWN_CHARS with the full length named."""
    text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    length = len(value) if isinstance(value, str) else len(text)
    return f"{text[:MAX_SHOWN_CHARS]}... ({length} characters)"


_LONG_QUOTED = re.compile(r"(['\"])([^'\"\n]{" + str(MAX_SHOWN_CHARS + 1) + r",})\1")


def _cut_quoted(message: str) -> str:
    """A rule's message with every long quoted value in it cut short (rules echo values)."""
    def cut(match: re.Match) -> str:
        quote, body = match.group(1), match.group(2)
        return f"{quote}{body[:MAX_SHOWN_CHARS]}...{quote} ({len(body)} characters)"

    return _LONG_QUOTED.sub(cut, message)


def read_text_file(path: Path, what: str = "scenario") -> str:
    """A small UTF-8 text file, or a ScenarioError `FILE[:LINE]: cannot read: ...` (missing,
    a folder, too big, undecodable bytes with their offset)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ScenarioError([f"{path}: cannot read: {size} bytes; a {what} file is at most "
                                 f"{MAX_FILE_BYTES} bytes"])
        data = path.read_bytes()
    except OSError as err:
        raise ScenarioError([f"{path}: cannot read: {err.strerror or err}"]) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ScenarioError([f"{path}:{line}: cannot read: byte 0x{data[err.start]:02x} at "
                             f"offset {err.start} is not UTF-8 text"]) from None


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, non-scalar keys, deep nesting and huge alias
    expansion, and records the line of every key."""

    def __init__(self, stream):
        super().__init__(stream)
        self.key_lines: dict[tuple, int] = {}
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"collections nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value)} digits is too large",
                node.start_mark) from None


_LineLoader.add_constructor("tag:yaml.org,2002:int", _LineLoader.construct_yaml_int)


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand it past MAX_NODES nodes, at the first node (in
    document order) that does."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) not in sizes:
            children = (node.value if isinstance(node, yaml.SequenceNode) else
                        [n for pair in node.value for n in pair]
                        if isinstance(node, yaml.MappingNode) else [])
            sizes[id(node)] = 1 + sum(size(child) for child in children)
            if sizes[id(node)] > MAX_NODES:
                raise yaml.composer.ComposerError(
                    None, None, f"aliases expand the document past {MAX_NODES} nodes",
                    node.start_mark)
        return sizes[id(node)]

    size(root)


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False):
    explicit = {id(key) for key, _ in node.value if key.tag != _MERGE_TAG}
    loader.flatten_mapping(node)  # `<<: *anchor` merge keys first; explicit keys override them
    mapping, given = {}, set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, typing.Hashable):
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a plain value, got a {type(key).__name__}",
                key_node.start_mark)
        if key in given and id(key_node) in explicit:
            first = loader.key_lines[(id(mapping), key)]
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {shorten(key)} (first given on line {first})",
                key_node.start_mark)
        if id(key_node) in explicit:
            given.add(key)
        mapping[key] = loader.construct_object(value_node, deep=True)
        loader.key_lines[(id(mapping), key)] = key_node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(err: yaml.YAMLError, text: str) -> tuple[str, str]:
    """(line, problem) of a YAML error; a reader error (a forbidden character) has a position."""
    if isinstance(err, yaml.reader.ReaderError):
        line = text[: err.position].count("\n") + 1 if isinstance(err.position, int) else "?"
        return str(line), (f"unacceptable character #x{err.character:04x}: control characters "
                           "are not allowed")
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    return (f"{mark.line + 1}" if mark else "?"), getattr(err, "problem", None) or str(err)


def parse_yaml(text: str, source: str) -> tuple[object, LineIndex]:
    """Parse YAML text; raise ScenarioError on malformed input or duplicate keys."""
    loader = None
    try:
        loader = _LineLoader(text)
        node = loader.get_single_node()
        if node is not None:
            _check_expansion(node)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        line, problem = _yaml_problem(err, text)
        raise ScenarioError([f"{source}:{line}: malformed YAML: {problem}"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, LineIndex(data, loader.key_lines)


class LineIndex:
    """Finds the line of a field path in parsed YAML (skipping union tags that are not keys)."""

    def __init__(self, data: object, key_lines: dict[tuple, int]):
        self.data, self.key_lines = data, key_lines

    def _walk(self, loc: tuple) -> tuple[list, int | None]:
        node, line, path = self.data, None, []
        for i, part in enumerate(loc):
            if isinstance(node, dict) and part in node:
                line = self.key_lines.get((id(node), part), line)
                node, path = node[part], path + [part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node, path = node[part], path + [part]
            elif i == len(loc) - 1:
                path.append(part)  # a missing field: name it although the file lacks it
        return path, line

    def line_of(self, loc: tuple) -> int:
        """Line of the deepest key of `loc` present in the file (1 when the file leaves the whole
        path to defaults, as for a default `hardware` too small for the model)."""
        return self._walk(loc)[1] or 1

    def path_of(self, loc: tuple) -> str:
        """`loc` as the user wrote it: dotted keys, without union tags the file does not have."""
        return ".".join(str(p) for p in self._walk(loc)[0]) or "<top>"


def _unwrap(annotation) -> list:
    """The model/container types inside Optional, Union, Annotated and tuple annotations."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _unwrap(arg)]
    return [annotation]


def allowed_keys(loc: tuple, root: type[BaseModel]) -> list[str] | None:
    """Field names accepted at the model that `loc` (a pydantic error location) points into."""
    candidates: list = [root]
    for part in loc[:-1]:
        nxt = []
        for cand in candidates:
            if isinstance(cand, type) and issubclass(cand, BaseModel) and part in cand.model_fields:
                nxt += _unwrap(cand.model_fields[part].annotation)
            elif typing.get_origin(cand) in (tuple, list) and isinstance(part, int):
                nxt += _unwrap(typing.get_args(cand)[0])
            elif isinstance(cand, type) and issubclass(cand, BaseModel):
                kind = cand.model_fields.get("kind")
                if kind is not None and kind.default == part:  # a discriminated-union tag
                    nxt.append(cand)
        candidates = nxt
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    return sorted({name for m in models for name in m.model_fields}) if models else None


def _format_error(err: dict, source: str, index: LineIndex,
                  root: type[BaseModel]) -> list[str]:
    loc = tuple(err["loc"])
    msg = _cut_quoted(re.sub(r"^(Value|Assertion) error, ", "", err["msg"]))
    if err["type"] == "extra_forbidden":
        keys = allowed_keys(loc, root)
        msg = f"unknown key {shorten(loc[-1])}" + (f"; allowed keys: {keys}" if keys else "")
        return [f"{source}:{index.line_of(loc) or '?'}: {index.path_of(loc)}: {msg}"]
    if err["type"] == "value_error" and _PATH_PREFIX.match(msg):
        # Cross-field rules name their own field paths, one problem a line: "a.b.0.c: ..."
        lines = []
        for problem in msg.split("\n"):
            if not _PATH_PREFIX.match(problem):
                lines.append(f"{source}:{index.line_of(loc)}: {index.path_of(loc)}: {problem}")
                continue
            path = problem.split(":", 1)[0]
            sub = tuple(int(p) if p.isdigit() else p for p in path.split("."))
            line = index.line_of(loc + sub) or index.line_of(loc) or "?"
            prefix = f"{index.path_of(loc)}." if loc else ""
            lines.append(f"{source}:{line}: {prefix}{problem}")
        return lines
    given = err.get("input")
    shown = "" if isinstance(given, (dict, list)) else f" (given: {shorten(given)})"
    return [f"{source}:{index.line_of(loc) or '?'}: {index.path_of(loc)}: {msg}{shown}"]


def model_from_text(model: type[BaseModel], text: str, source: str, what: str):
    """Validate YAML text as `model` (a cost profile, ...); ScenarioError with located
    messages on any problem."""
    data, index = parse_yaml(text, source)
    return validate_model(model, data, source, index, what)


def validate_model(model: type[BaseModel], data, source: str, index: LineIndex, what: str):
    if not isinstance(data, dict):
        got = type(data).__name__
        raise ScenarioError([f"{source}:1: <top>: {what} must be a mapping, got {got}"])
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = _without_echoes(err.errors())
        messages = [m for e in errors for m in _format_error(e, source, index, model)]
        raise ScenarioError(messages) from None


def _without_echoes(errors: list[dict]) -> list[dict]:
    """Drop a container's "too short" error when one of its items failed: the item is the cause
    (pydantic reports both for a non-empty tuple whose only item is invalid)."""
    def has_item_error(loc: tuple) -> bool:
        return any(tuple(e["loc"])[: len(loc)] == loc and len(e["loc"]) > len(loc)
                   for e in errors)

    return [e for e in errors if not (e["type"] == "too_short" and has_item_error(tuple(e["loc"])))]
