"""The YAML loader never shows a traceback: every hostile file gives located lines
`FILE:LINE: ...`, merge keys work, huge values are cut short and huge files are refused by size
before parsing."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_helpers import molcap

import planner.scenario.loading
import sim.io.yaml_input
from planner.scenario.loading import ScenarioError, load_scenario
from planner.scenario.schema import Scenario

BOMB = "".join(f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n"
               for a, b in zip("abcdefg", "bcdefgh", strict=True))
HOSTILE: dict[str, tuple[bytes, int, str]] = {
    # name: (file bytes, line of the problem, words the message holds)
    "unhashable_key": (b"strategies: [{kind: base}]\n? [a, b]\n: 1\n", 2, "key"),
    "unhashable_flow_key": (b"strategies: [{kind: base}]\nx: {[1]: 2}\n", 2, "key"),
    "nul_byte": (b"strategies: [{kind: base}]\nname: a\x00b\n", 2, "#x0000"),
    "control_byte": (b"strategies: [{kind: base}]\nname: a\x07b\n", 2, "#x0007"),
    "deep_lists": (b"strategies: [{kind: base}]\nname: " + b"[" * 5000 + b"]" * 5000 + b"\n",
                   2, "deeper"),
    "deep_maps": (b"strategies: [{kind: base}]\nname: " + b"{a: " * 3000 + b"1" + b"}" * 3000
                  + b"\n", 2, "deeper"),
    "alias_bomb": (b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + BOMB.encode()
                   + b"strategies: [{kind: base}]\nanalysis: {context_tokens: *h}\n", 5,
                   "aliases"),  # e, on line 5, is the first node to expand past the bound
    "huge_int": (b"strategies: [{kind: base}]\nseed: 1" + b"0" * 5000 + b"\n", 2, "digits"),
    "undecodable": (b"strategies: [{kind: base}]\nname: \xff\xfe\n", 2, "offset 33"),
}


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_yaml_gives_a_located_error(tmp_path, case):
    data, line, words = HOSTILE[case]
    path = write(tmp_path, case, data)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    first = info.value.messages[0]
    assert first.startswith(f"{path}:{line}: "), first
    assert words in first, first
    assert len(first) < 400, first


def test_yaml_merge_keys_are_accepted(tmp_path):
    path = write(tmp_path, "merge", b"x-adapter: &adapter {name: chat, rank: 8}\n"
                 b"strategies:\n  - kind: multi_lora\n    adapters:\n"
                 b"      - {<<: *adapter, rank: 16}\n      - {<<: *adapter, name: code}\n")
    with pytest.raises(ScenarioError) as info:  # the anchor's own key is still unknown
        load_scenario(path)
    assert info.value.messages == [
        f"{path}:1: x-adapter: unknown key 'x-adapter'; allowed keys: "
        f"{sim.io.yaml_input.allowed_keys(('x-adapter',), Scenario)}"]
    merged = write(tmp_path, "merged", b"strategies:\n  - kind: multi_lora\n    adapters:\n"
                   b"      - &chat {name: chat, rank: 8}\n      - {<<: *chat, name: code}\n")
    adapters = load_scenario(merged).strategies[0].adapters
    assert [(a.name, a.rank) for a in adapters] == [("chat", 8), ("code", 8)]


def test_a_key_repeated_beside_a_merge_is_still_a_duplicate(tmp_path):
    path = write(tmp_path, "dup", b"strategies:\n  - kind: multi_lora\n    adapters:\n"
                 b"      - &chat {name: chat, rank: 8}\n"
                 b"      - {<<: *chat, name: code, name: other}\n")
    with pytest.raises(ScenarioError, match=r"dup.yaml:5: malformed YAML: duplicate key 'name'"):
        load_scenario(path)


def test_a_huge_value_is_cut_short_in_the_message(tmp_path):
    path = write(tmp_path, "long", b"strategies: [{kind: base}]\nseed: '" + b"9" * 100_000
                 + b"'\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (message,) = info.value.messages
    assert message.startswith(f"{path}:2: seed: ") and len(message) < 400
    assert "100000 characters" in message


def test_a_huge_file_is_refused_by_size_before_parsing(tmp_path, monkeypatch):
    path = write(tmp_path, "big", b"# padding\n" * 300_000 + b"strategies: [{kind: base}]\n")
    monkeypatch.setattr(planner.scenario.loading, "parse_yaml",
                        lambda *a, **k: pytest.fail("a huge file was parsed"))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (message,) = info.value.messages
    assert message.startswith(f"{path}: cannot read: ") and "3000027 bytes" in message


def test_the_cli_shows_no_traceback_for_any_hostile_file(tmp_path):
    paths = [str(write(tmp_path, case, data)) for case, (data, _, _) in HOSTILE.items()]
    result = molcap("validate", *paths, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    for path in paths:
        assert f"{path}:" in result.stderr


def test_a_huge_value_inside_a_rule_message_is_cut_short(tmp_path):
    big = "x" * 100_000
    for name, text in {"gpu": f"hardware: {{gpu: {big}}}\nstrategies: [{{kind: base}}]\n",
                       "model": f"model: {big}\nstrategies: [{{kind: base}}]\n",
                       "kind": f"strategies: [{{kind: {big}}}]\n"}.items():
        path = write(tmp_path, name, text.encode())
        with pytest.raises(ScenarioError) as info:
            load_scenario(path)
        assert all(len(m) < 1000 for m in info.value.messages), (name, len(max(
            info.value.messages, key=len)))
        assert any("100000 characters" in m for m in info.value.messages), name
