"""The prefill engine of the P/D test, run as its own process: route, store KV and decisions.

argv: model_dir storage_dir prompts.json out.json. Writes the first sampled token per prompt.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, str(Path(__file__).parent))

from vllm_helpers import create_llm, generate, pd_transfer_config, shutdown_llm  # noqa: E402


def main() -> None:
    model_dir, storage, prompts_file, out_file = sys.argv[1:5]
    prompts = json.loads(Path(prompts_file).read_text())
    llm = create_llm(Path(model_dir), enable_prefix_caching=False, max_num_batched_tokens=512,
                     kv_transfer_config=pd_transfer_config("kv_producer", storage))
    first = generate(llm, prompts, [None] * len(prompts), 1)
    Path(out_file).write_text(json.dumps(first))
    shutdown_llm(llm)


if __name__ == "__main__":
    main()
