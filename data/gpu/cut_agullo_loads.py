"""Cut the adapter-load timings of agullo-dt's `predictor_loading` runs from the upstream
repository's server logs, which the shared copy of the dataset does not hold.

    python data/gpu/cut_agullo_loads.py UPSTREAM_CHECKOUT

UPSTREAM_CHECKOUT is a checkout of FerranAgulloLopez/GPULLMAdapterOptimization (Apache-2.0,
the licence in data/gpu/agullo-dt/LICENSE). For each run folder of
`digital_twin_dynamic/estimators/predictor_loading/<model>/adapter_rank_<r>/_<max_lora_rank>_/`
it copies the lines of `server_out.log` written by the fork's `vllm/lora/worker_manager.py`
(cumulative count and seconds of loads from disk into the host cache, and of loads from host
memory into a GPU slot), byte for byte and nothing else, to `server_out.loads.log` beside the
run's `launcher.sh` under data/gpu/agullo-dt/raw/. Rerunning reproduces the bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

SWEEP = Path("digital_twin_dynamic/estimators/predictor_loading")
OUT = Path(__file__).resolve().parent / "agullo-dt" / "raw" / SWEEP
MARK = b"[worker_manager.py:"


def main(upstream: Path) -> None:
    logs = sorted((upstream / SWEEP).glob("*/adapter_rank_*/_*_/server_out.log"))
    if not logs:
        sys.exit(f"{upstream / SWEEP}: no */adapter_rank_*/_*_/server_out.log")
    for log in logs:
        kept = [line for line in log.read_bytes().splitlines(keepends=True) if MARK in line]
        target = OUT / log.parent.relative_to(upstream / SWEEP) / "server_out.loads.log"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"".join(kept))
        print(f"{target.relative_to(OUT.parents[4])}: {len(kept)} lines")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
