"""Property-based fuzzing (Hypothesis) of the scenario loader and the trace reader: every
generated input yields either a valid result or located errors (`FILE:...`), never another
exception."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.scenario.loading import ScenarioError, load_scenario
from sim.workload.traces import TraceError, read_trace

REPO = Path(__file__).resolve().parents[2]
VALID = (REPO / "scenarios" / "sim_ced_switch.yaml").read_text(encoding="utf-8")
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

KEYS = ["name", "model", "hardware", "engine", "strategies", "workload", "slo", "search",
        "analysis", "simulation", "seed", "gpu", "tensor_parallel_size", "num_gpus_per_replica",
        "kind", "adapters", "rank", "layers", "target_modules", "path", "columns",
        "max_num_seqs", "block_size", "max_loras", "arrival_rate_per_s", "num_requests",
        "context_tokens", "tensor_parallel_sizes", "gpus", "<<", "x"]
KINDS = ["base", "multi_lora", "preft", "mol", "contextual_mol", "mol2", "multi_agent",
         "punica", "conversations", "trace"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(KINDS),
    st.sampled_from(["H100-SXM", "H200", "qwen2.5-0.5b", "ced-40", "llama-3.1-8b", "q_proj"]),
    st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5),
    st.dictionaries(st.sampled_from(KEYS), inner, max_size=6)), max_leaves=40)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)


def assert_located(err: ScenarioError, path: Path) -> None:
    assert err.messages, "an error without a message"
    for message in err.messages:
        assert message.startswith(f"{path}:") or message.startswith(f"{path.parent}"), message
        assert len(message) < 3000, message[:200]


def load(text: bytes | str, folder: Path) -> None:
    path = folder / "fuzz.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        load_scenario(path)
    except ScenarioError as err:
        assert_located(err, path)


@FUZZ
@given(documents)
def test_generated_scenarios_load_or_give_located_errors(document):
    with tempfile.TemporaryDirectory() as folder:
        load(yaml.safe_dump(document, allow_unicode=True), Path(folder))


@FUZZ
@given(st.data())
def test_mutated_scenario_files_load_or_give_located_errors(data):
    raw = bytearray(VALID.encode("utf-8"))
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw)))
        action = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        chunk = data.draw(st.binary(min_size=1, max_size=8) | st.sampled_from(
            [b": ", b"\n", b"- ", b"[", b"{", b"&a ", b"*a", b"<<: ", b"\t", b"\x00", b"'"]))
        if action == "insert":
            raw[at:at] = chunk
        elif action == "delete":
            del raw[at:at + len(chunk)]
        else:
            raw[at:at + len(chunk)] = chunk
    with tempfile.TemporaryDirectory() as folder:
        load(bytes(raw), Path(folder))


cells = st.one_of(st.integers(-10, 10**9).map(str), st.floats().map(repr),
                  st.sampled_from(["", "nan", "inf", "-inf", "-1", "1e400", "ten", " 5 ", "0x10",
                                   "2023-11-16 18:15:46.68", "1_000"]),
                  st.text(max_size=6))


@FUZZ
@given(st.lists(st.lists(cells, min_size=0, max_size=4), max_size=8),
       st.sampled_from(["s", "ms", "datetime"]), st.booleans())
def test_generated_csv_traces_read_or_give_located_errors(rows, unit, header):
    text = ("timestamp,input_length,output_length\n" if header else "") + "".join(
        ",".join(cell.replace(",", ";").replace("\n", " ") for cell in row) + "\n"
        for row in rows)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            table = read_trace(path, time_unit=unit)
        except TraceError as err:
            assert str(err).startswith(str(path)), err
            return
        assert len(table.where) >= 1 and all(math.isfinite(t) for t in table.arrival_s)
        assert (table.input_tokens >= 1).all() and (table.output_tokens >= 1).all()


json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(
        ["timestamp", "input_length", "output_length", "hash_ids", "x"]), inner, max_size=5)),
    max_leaves=20)


@FUZZ
@given(st.lists(json_values, max_size=6), st.booleans())
def test_generated_jsonl_traces_read_or_give_located_errors(lines, hash_ids):
    import json

    text = "".join(json.dumps(line) + "\n" for line in lines)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        path.write_text(text, encoding="utf-8")
        try:
            read_trace(path, fmt="jsonl", time_unit="ms",
                       hash_ids_column="hash_ids" if hash_ids else None)
        except TraceError as err:
            assert str(err).startswith(str(path)), err


@FUZZ
@given(st.lists(st.lists(cells, min_size=3, max_size=3), max_size=5))
def test_generated_trace_scenarios_validate_or_give_located_errors(rows):
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "t.csv"
        trace.write_text("timestamp,input_length,output_length\n" + "".join(
            ",".join(c.replace(",", ";").replace("\n", " ") for c in row) + "\n" for row in rows),
            encoding="utf-8", errors="surrogatepass")
        load("model: qwen2.5-0.5b\nhardware: {gpu: A100-80GB}\nstrategies: [{kind: base}]\n"
             "workload: {kind: trace, path: t.csv}\n", Path(folder))


small_ints = st.sampled_from([1, 2, 8, 16, 24, 32, 48, 64, 100, 320, 512, 4096])
odd_values = st.one_of(st.sampled_from([-1, 0, 2**31]), st.none(), st.booleans(),
                       st.text(max_size=6), st.floats(allow_nan=True, allow_infinity=True))
ENGINE_FIELDS = {
    "max_num_seqs": small_ints, "max_num_batched_tokens": small_ints, "block_size": small_ints,
    "max_loras": small_ints, "max_cpu_loras": small_ints, "max_lora_rank": small_ints,
    "gpu_memory_utilization": st.sampled_from([0.0, 0.5, 0.9, 1.0, 1.5]),
    "enable_chunked_prefill": st.booleans(), "enable_prefix_caching": st.booleans(),
    "ced_encoder_window": st.sampled_from(["recompute", "kept", "x"]),
    "version": st.sampled_from(["0.32.0", "", "x"]),
}
layer_lists = st.lists(st.integers(-2, 60), max_size=4)
ADAPTER_FIELDS = {
    "rank": small_ints, "layers": st.one_of(st.none(), layer_lists),
    "target_modules": st.lists(st.sampled_from(["q_proj", "v_proj", "down_proj", "x"]),
                               max_size=3),
}


def _fields(spec: dict) -> st.SearchStrategy:
    """Dicts of up to three of `spec`'s fields, each value from its pool (one in ten odd)."""
    def values(names: list[str]) -> st.SearchStrategy:
        return st.fixed_dictionaries({name: st.one_of(*[spec[name]] * 9, odd_values)
                                      for name in names})
    return st.lists(st.sampled_from(list(spec)), max_size=3, unique=True).flatmap(values)


engines = _fields(ENGINE_FIELDS)
adapters = st.lists(_fields(ADAPTER_FIELDS).map(lambda a: {"name": "a", **a}),
                    min_size=1, max_size=3).map(
    lambda items: [{**a, "name": f"a{i}"} for i, a in enumerate(items)])


@FUZZ
@given(engines, adapters, st.sampled_from(["multi_lora", "preft", "mol2"]))
def test_generated_engine_and_adapter_fields_load_or_give_located_errors(engine, adapters, kind):
    # A valid scenario whose engine and adapter fields are drawn: a loaded scenario keeps only
    # values vLLM accepts and adapters that adapt something; anything else is located.
    ced = kind == "mol2"
    document = {
        "model": "ced-40" if ced else "llama-3.1-8b",
        "hardware": {"gpu": "H200", "num_gpus_per_replica": 8, "tensor_parallel_size": 8}
        if ced else {"gpu": "H100-SXM"},
        "engine": engine, "strategies": [{"kind": kind, "adapters": adapters}],
        "workload": {"kind": "punica", "num_requests": 10, "num_adapters": 1,
                     "num_output_tokens": 4, "arrival_rate_per_s": 1.0}}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        try:
            scenario = load_scenario(path)
        except ScenarioError as err:
            assert_located(err, path)
            return
    e = scenario.engine
    assert e.block_size % 16 == 0 and e.max_num_batched_tokens >= e.max_num_seqs
    assert e.max_lora_rank in (1, 8, 16, 32, 64, 128, 256, 320, 512)
    assert e.max_cpu_loras >= e.max_loras
    for adapter in scenario.strategies[0].adapters:
        assert adapter.layers is None or len(adapter.layers) > 0
