"""Instructions one `simulate()` call executes, counted by callgrind: a load-independent measure
for comparing two trees on a shared machine (wall and CPU seconds move with the load).

    valgrind --tool=callgrind --toggle-collect='*qsort*' --callgrind-out-file=cg.out \\
        python -m bench.callgrind_sim punica 5000

Builds the workload and config of `bench/bench_sim.py` (everything imported, nothing timed),
then calls `simulate` from inside libc's `qsort` comparator: `--toggle-collect='*qsort*'`
counts that call and nothing else (imports, set-up and teardown excluded). Prints a digest of
the result, so two trees' runs also say whether their results are equal bit for bit. Without
valgrind it just runs the case.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # sim_configs
sys.path.insert(0, str(ROOT))


def result_digest(result) -> str:
    """sha256 over every column of the requests and turns tables (their values' bytes)."""
    digest = hashlib.sha256()
    for table in (result.requests, result.turns):
        for name in sorted(table.columns):
            digest.update(name.encode())
            values = table[name].to_numpy()
            if values.dtype == object:  # strings: their text, not the pointers' bytes
                values = "\0".join(map(str, values)).encode()
            digest.update(values if isinstance(values, bytes) else values.tobytes())
    return digest.hexdigest()[:16]


def run_in_qsort(call) -> None:
    """Run `call()` inside libc's qsort (its comparator), so callgrind can toggle on it."""
    libc = ctypes.CDLL(None)
    compare_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    calls = []

    def compare(_a, _b) -> int:
        if not calls:
            calls.append(call())
        return 0

    pair = (ctypes.c_int * 2)(0, 0)
    libc.qsort(pair, 2, ctypes.sizeof(ctypes.c_int), compare_type(compare))
    if not calls:
        raise RuntimeError("qsort never called the comparator")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["punica", "conversations", "mooncake"])
    parser.add_argument("num_requests", type=int)
    parser.add_argument("--mode", choices=["fast", "reference"], default="fast")
    args = parser.parse_args()

    from sim_configs import small_config

    from bench.bench_sim import _workload
    from sim.simulate import simulate

    workload = _workload(args.workload, args.num_requests)
    config = small_config("multi_lora", mode=args.mode, max_num_seqs=32, max_loras=8,
                          num_adapters=8).model_copy(update={"check_invariants": False})
    results = []
    run_in_qsort(lambda: results.append(simulate(config, workload, timeseries_interval_s=10.0)))
    result = results[0]
    print(f"{args.workload} {args.num_requests} {args.mode}: {len(result.requests)} requests, "
          f"{result.stats['num_engine_steps']} steps, {result.stats['num_engine_events']} "
          f"events, digest {result_digest(result)}")


if __name__ == "__main__":
    main()
