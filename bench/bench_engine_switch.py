"""Switch cost on the CED model: bounded replay vs full recompute as the context grows.

    python bench/bench_engine_switch.py [--contexts 512 1024 2048 4096 8192 16384]

Random weights, `ced40_scaled` preset (40 layers, W=128). The history grows in place (prefilled
once, in chunks), and at each length the session switches adapters both ways: bounded replay of the
last W positions, and a full recompute of the whole context under the target. Prints a table and
writes out/bench/engine_switch.json. Not a timed test: numbers depend on the machine. The full
recompute is O(T^2) in the indexer, so by default it is measured up to 4k tokens only
(--max-recompute); growing the history to 16k itself takes minutes on a small CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import get_preset
from engine_ext.lora import LoraSpec, random_lora


def build_engine(preset: str) -> CEDEngine:
    torch.manual_seed(0)
    model = CEDForCausalLM(get_preset(preset)).eval()
    engine = CEDEngine(model)
    cfg, gen = model.config, torch.Generator().manual_seed(1)
    spec = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj", "up_proj", "down_proj"),
                    layers=tuple(range(cfg.first_decoder_layer + 1, cfg.num_layers)))
    for name in ("source", "target"):
        engine.add_adapter(name, random_lora(model, spec, gen))
    return engine


def timed(fn, repeats: int, setup=lambda: None) -> float:
    """Median seconds of fn(setup()) over `repeats`; setup is not timed."""
    times = []
    for _ in range(repeats):
        arg = setup()
        start = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ced40_scaled")
    parser.add_argument("--contexts", type=int, nargs="+",
                        default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--max-recompute", type=int, default=4096,
                        help="skip the full recompute above this context (it is O(T^2))")
    parser.add_argument("--out", type=Path, default=Path("out/bench/engine_switch.json"))
    args = parser.parse_args(argv)
    engine = build_engine(args.preset)
    cfg = engine.config
    ids = torch.randint(0, cfg.vocab_size, (1, max(args.contexts)),
                        generator=torch.Generator().manual_seed(2))
    state, rows = engine.new_state(), []
    for n in sorted(args.contexts):
        engine.prefill(state, ids[:, state.num_positions : n], "source", chunk_size=args.chunk)
        replay_s = timed(lambda s: engine.switch(s, "target"), repeats=3, setup=state.clone)
        recompute_s = None
        if n <= args.max_recompute:
            recompute_s = timed(lambda _s, n=n: engine.oracle(ids[:, :n], "target",
                                                              chunk_size=args.chunk), repeats=1)
        rows.append({"context": n, "replay_s": replay_s, "recompute_s": recompute_s,
                     "replay_positions": cfg.window})
        rec = "skipped" if recompute_s is None else f"{recompute_s:10.3f}"
        print(f"context {n:6d}: replay {replay_s * 1e3:8.1f} ms   full recompute {rec} s",
              flush=True)
    print(f"\n{'context':>8} {'replay_ms':>10} {'recompute_s':>12} {'speedup':>8}")
    for r in rows:
        rec = r["recompute_s"]
        speed = f"{rec / r['replay_s']:8.1f}" if rec else f"{'-':>8}"
        rec_cell = f"{rec:12.3f}" if rec else f"{'-':>12}"
        print(f"{r['context']:>8} {r['replay_s'] * 1e3:10.1f} {rec_cell} {speed}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"preset": args.preset, "window": cfg.window, "num_layers": cfg.num_layers,
            "threads": torch.get_num_threads()}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
