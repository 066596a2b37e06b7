"""The prefill engine of the P/D test, run as its own process: route, store KV and decisions.

argv: model_dir storage_dir requests.json out.json. requests.json: a list of {prompt, lora}
(lora: [name, id, path] or null). Writes, per request, the first sampled token and the
`kv_transfer_params` the engine returned (what a P/D proxy forwards to decode).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, str(Path(__file__).parent))

from vllm_helpers import create_llm, pd_transfer_config, shutdown_llm  # noqa: E402


def main() -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    model_dir, storage, requests_file, out_file = sys.argv[1:5]
    requests = json.loads(Path(requests_file).read_text())
    llm = create_llm(Path(model_dir), enable_prefix_caching=False, max_num_batched_tokens=512,
                     kv_transfer_config=pd_transfer_config("kv_producer", storage))
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt"]) for r in requests], params,
                        lora_request=[r["lora"] and LoRARequest(*r["lora"]) for r in requests],
                        use_tqdm=False)
    Path(out_file).write_text(json.dumps([
        {"first": out.outputs[0].token_ids[0], "kv_transfer_params": out.kv_transfer_params}
        for out in outs]))
    shutdown_llm(llm)


if __name__ == "__main__":
    main()
