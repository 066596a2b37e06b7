"""In-engine routing for `molcap verify`: the molcap vLLM plugin's configuration for a routed
strategy (its adapters, a seeded random MoL2 pointer head reading the route layer), what the
router decided during a replay, and one decision's cost as a client sees it.

Requests of a routed strategy name no adapter: the plugin's hook after decoder layer k pools the
prompt's states, the head picks an adapter, and the layers above k run under it in the same
prefill step. Nothing heavy at module level.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

NUM_DESCRIPTION_TOKENS = 12
"""Token ids of each option's (random) description, embedded once when the router is built."""
NUM_PROBE_REPEATS = 3
"""Times each probe prompt is sent each way (the fastest counts: a shared machine's pauses only
add time)."""


def build_router(names: list[str], paths: list[Path], route_layer: int, model_dir: Path,
                 folder: Path, seed: int) -> dict:
    """Write FOLDER/head.safetensors (a random pointer head of the model's width, seeded) and
    FOLDER/plugin.json (the adapters by name, one router option per adapter, a fresh counter
    folder). Returns the config path, the counter folder and the head's parameter count."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from engine_ext.vllm_plugin.config import RouterConfig
    from engine_ext.vllm_plugin.router import create_pointer_head

    model = AutoConfig.from_pretrained(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    shape = RouterConfig(route_layer=route_layer, head_path="-",
                         options=[{"adapter": None, "description_token_ids": [1]}])
    torch.manual_seed(seed)
    head = create_pointer_head(shape, model.hidden_size)
    save_file(head.state_dict(), str(folder / "head.safetensors"))
    rng = np.random.default_rng(seed)
    options = [dict(adapter=name, description_token_ids=rng.integers(
        3, model.vocab_size, NUM_DESCRIPTION_TOKENS).tolist()) for name in names]
    counters = folder / "counters"
    shutil.rmtree(counters, ignore_errors=True)  # counts of this run only
    config = dict(adapters=[dict(name=n, path=str(p)) for n, p in zip(names, paths, strict=True)],
                  router=dict(route_layer=route_layer, head_path=str(folder / "head.safetensors"),
                              options=options),
                  counter_dir=str(counters))
    (folder / "plugin.json").write_text(json.dumps(config, indent=1))
    return dict(config=str(folder / "plugin.json"), counter_dir=str(counters),
                num_head_params=sum(p.numel() for p in head.parameters()))


@contextmanager
def plugin_config(path: str | Path | None):
    """MOLCAP_VLLM_PLUGIN_CONFIG=path and a fresh plugin state while the block runs (None: the
    environment as it is); the next engine in this process starts without the router."""
    if path is None:
        yield
        return
    from engine_ext.vllm_plugin.config import CONFIG_ENV
    from engine_ext.vllm_plugin.runtime import reset_state

    old = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = str(path)
    reset_state()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = old
        reset_state()


def _generate_s(llm, prompt: list[int], lora, clock) -> float:
    """Seconds (on `clock`) of one request of one output token, alone on the engine."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    start = clock()
    llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, lora_request=lora,
                 use_tqdm=False)
    return clock() - start


def _as_routed(decision: dict):
    """The LoRARequest the plugin gives a request it routed to this adapter (its name and id:
    the same adapter slot); a request naming it is never rerouted, so it runs no head and
    writes no decision."""
    from vllm.lora.request import LoRARequest

    path = decision["adapter"]
    return LoRARequest(lora_name=f"molcap-routed:{Path(path).name}",
                       lora_int_id=int(decision["adapter_hash"]), lora_path=path)


def probe_decisions(llm, prompts: list[list[int]], counter_dir: str, clock: str) -> dict:
    """One decision's cost as a client sees it: each prompt sent alone for its first token,
    routed (no adapter named) and naming the router's choice as the plugin names it (the same
    adapter slot; no head, no decision written), NUM_PROBE_REPEATS times each way in
    alternating order, the prefix cache emptied before each. Per prompt the fastest of each
    way; the median over the prompts of routed minus named, and each prompt's pair."""
    from engine_ext.vllm_plugin.counters import sum_counters

    now = time.perf_counter if clock == "wall" else time.thread_time
    pairs = []
    for i, prompt in enumerate(prompts):
        before = sum_counters(counter_dir).counts["written"]
        _generate_s(llm, prompt, None, now)  # the router's choice for this prompt
        totals = sum_counters(counter_dir)
        if totals.counts["written"] == before:
            raise NotRouted(_refused(totals))
        chosen = [d for d in totals.decisions if d["kind"] == "written"][-1]
        named = _as_routed(chosen)
        timed = {"routed": math.inf, "named": math.inf}
        for repeat in range(NUM_PROBE_REPEATS):
            for way in (("routed", "named") if (i + repeat) % 2 == 0 else ("named", "routed")):
                llm.reset_prefix_cache()
                seconds = _generate_s(llm, prompt, None if way == "routed" else named, now)
                timed[way] = min(timed[way], seconds)
        llm.reset_prefix_cache()
        pairs.append(dict(num_prompt_tokens=len(prompt), routed_s=timed["routed"],
                          named_s=timed["named"], adapter=chosen["adapter"]))
    return dict(decision_s=statistics.median(p["routed_s"] - p["named_s"] for p in pairs),
                pairs=pairs, clock=clock)


class NotRouted(RuntimeError):
    """Requests sent without an adapter were not routed: the plugin declined in-engine routing
    (its reason is named)."""

    def __init__(self, refused: dict):
        super().__init__(f"the molcap vLLM plugin routed no request sent without an adapter "
                         f"(refused: {refused or 'nothing logged'}); in-engine routing needs "
                         "eager mode and a vLLM the plugin's guards accept (docs/vllm_plugin.md)")


def _refused(totals) -> dict:
    return {k: v for p in totals.per_process for k, v in p["refused"].items()}


def replay_decisions(counter_dir: str, before: dict, names: dict[str, str]) -> dict:
    """What the router did since `before` (`decision_snapshot`): the counter deltas (written,
    read, applied, ...), the adapters it chose for the requests not seen before (among the
    decisions the plugin keeps logged: the last few hundred) and the features it refused."""
    from engine_ext.vllm_plugin.counters import sum_counters

    totals = sum_counters(counter_dir)
    chosen: dict[str, int] = {}
    for d in totals.decisions:
        if d["kind"] == "written" and d["request_id"] not in before["request_ids"]:
            name = names.get(str(d["adapter"]), "base")
            chosen[name] = chosen.get(name, 0) + 1
    refused = _refused(totals)
    return dict(counts={k: v - before["counts"].get(k, 0) for k, v in totals.counts.items()},
                chosen=chosen, refused=refused)


def decision_snapshot(counter_dir: str) -> dict:
    """The plugin's decision counts so far and the request ids its log holds."""
    from engine_ext.vllm_plugin.counters import sum_counters

    totals = sum_counters(counter_dir)
    return dict(counts=dict(totals.counts),
                request_ids={d["request_id"] for d in totals.decisions})
