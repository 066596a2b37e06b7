"""Routing across a real prefill -> decode KV transfer: two vLLM engine processes joined by vLLM's
shared-storage connector; the decision travels with the KV, counters add up across both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from vllm_helpers import (
    create_llm,
    generate,
    pd_transfer_config,
    prompt_ids,
    reference_engine,
    save_adapter,
    shutdown_llm,
    tiny_llama,
)

from engine_ext.vllm_plugin.config import CONFIG_ENV, RouterConfig, load_plugin_config
from engine_ext.vllm_plugin.counters import sum_counters
from engine_ext.vllm_plugin.hashing import adapter_hash
from engine_ext.vllm_plugin.kv_transfer import DECISION_FILE
from engine_ext.vllm_plugin.router import InEngineRouter, create_pointer_head
from engine_ext.vllm_plugin.runtime import reset_state

ROUTE_LAYER = 1
MAX_TOKENS = 12
NUM_PROMPTS, NUM_DELIVERED = 4, 3
HERE = Path(__file__).parent


def _plugin_config(root: Path, paths: dict[str, Path]) -> Path:
    torch.manual_seed(1)  # a head whose decisions depend on the prompt
    stub = RouterConfig(route_layer=ROUTE_LAYER, head_path="-",
                        options=[{"adapter": None, "description_token_ids": [1]}])
    save_file(create_pointer_head(stub, 256).state_dict(), str(root / "head.safetensors"))
    config = {
        "adapters": [{"name": n, "path": str(p)} for n, p in paths.items()],
        "router": {"route_layer": ROUTE_LAYER, "head_path": str(root / "head.safetensors"),
                   "options": [{"adapter": "r1", "description_token_ids": prompt_ids(90, 12)},
                               {"adapter": "r2", "description_token_ids": prompt_ids(91, 9)}]},
        "counter_dir": str(root / "counters"),
    }
    (root / "plugin.json").write_text(json.dumps(config))
    # The decode side knows the adapters but has no router: a decision must come across.
    (root / "decode.json").write_text(json.dumps({**config, "router": None}))
    return root / "plugin.json"


def _run_prefill(root: Path, config: Path, prompts: list[list[int]]) -> list[int]:
    """The prefill engine in its own process (max_tokens=1, as a P/D proxy sends it)."""
    (root / "prompts.json").write_text(json.dumps(prompts))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **{CONFIG_ENV: str(config)})
    done = subprocess.run([sys.executable, str(HERE / "pd_prefill.py"), str(root / "model"),
                           str(root / "kv"), str(root / "prompts.json"), str(root / "first.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return [out[0] for out in json.loads((root / "first.json").read_text())]


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    root = tmp_path_factory.mktemp("pd")
    model = tiny_llama(root / "model")
    paths = {name: save_adapter(model, root / name, seed=seed, prefill_only=False,
                                layers=(2, 3)) for name, seed in (("r1", 5), ("r2", 6))}
    config = _plugin_config(root, paths)
    # Prompts of 2-3 KV blocks (block 32): the full blocks cross in files, the tail is recomputed.
    prompts = [prompt_ids(700 + i, 70 + 9 * i) for i in range(NUM_PROMPTS)]
    first = _run_prefill(root, config, prompts)
    old = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = str(root / "decode.json")
    reset_state()
    decode = create_llm(root / "model", enable_prefix_caching=False, max_num_batched_tokens=256,
                        kv_transfer_config=pd_transfer_config("kv_consumer", str(root / "kv")))
    # The last prompt never reaches decode: its decision must show as undelivered.
    sent = [p + [t] for p, t in zip(prompts[:NUM_DELIVERED], first, strict=False)]
    outs = generate(decode, sent, [None] * NUM_DELIVERED, MAX_TOKENS - 1)
    ref = reference_engine(model, paths, route_layer=ROUTE_LAYER)
    router = InEngineRouter(load_plugin_config(config).router, model.model.embed_tokens, 256)
    yield dict(prompts=prompts, first=first, outs=outs, ref=ref, router=router, paths=paths,
               root=root)
    shutdown_llm(decode)
    if old is None:
        os.environ.pop(CONFIG_ENV, None)
    else:
        os.environ[CONFIG_ENV] = old


@torch.no_grad()
def _reference_choice(pd, prompt: list[int]) -> str | None:
    cache = pd["ref"].new_cache()
    pd["ref"].forward(cache, torch.tensor([prompt]), None)
    return pd["router"].choose(cache.boundary[0])


def test_decode_after_the_transfer_equals_the_chosen_adapter_named_explicitly(pd):
    chosen = set()
    for prompt, first, out in zip(pd["prompts"], pd["first"], pd["outs"], strict=False):
        name = _reference_choice(pd, prompt)
        assert [first, *out] == pd["ref"].generate(prompt, name, max_new_tokens=MAX_TOKENS)
        chosen.add(name)
    assert chosen - {None}  # an adapter was applied on the decode side


def test_the_decision_travels_in_the_transfer_and_counters_add_up(pd):
    decisions = sorted((pd["root"] / "kv").glob(f"*/{DECISION_FILE}"))
    assert len(decisions) == NUM_PROMPTS
    hashes = {json.loads(f.read_text())["adapter_hash"] for f in decisions}
    assert hashes <= {adapter_hash(str(p)) for p in pd["paths"].values()}
    totals = sum_counters(pd["root"] / "counters")
    by_pid = {p["pid"]: p["counts"] for p in totals.per_process}
    prefill = next(c for pid, c in by_pid.items() if pid != os.getpid())
    decode = by_pid[os.getpid()]
    assert len(by_pid) == 2
    assert prefill["written"] == NUM_PROMPTS and prefill["read"] == 0
    assert decode["read"] == decode["applied"] == NUM_DELIVERED and decode["unknown"] == 0
    assert totals.undelivered == NUM_PROMPTS - NUM_DELIVERED
