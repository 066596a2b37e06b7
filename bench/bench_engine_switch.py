"""Switch cost on the CED model: bounded replay vs full recompute as the context grows.

    python bench/bench_engine_switch.py [--contexts 512 1024 2048 4096 8192 16384]

Random weights, `ced40_scaled` preset (40 layers, W=128). The history grows in place (prefilled
once, in chunks), and at each length the session switches adapters both ways: bounded replay of the
last W positions, and a full recompute of the whole context under the target. Prints a table and
writes out/bench/engine_switch.json (rows appended to bench/results/). Not a timed test: numbers
depend on the machine. The full recompute is O(T^2) in the indexer, so by default it is measured up
to 4k tokens only (--max-recompute, printed under the table); growing the history to 16k itself
takes minutes on a small CPU. Replay should stay roughly flat: its only context-dependent work is
the four decoder index layers scoring every global-KV entry (one [W, d_index] x [d_index, N] product
and a top-k). Runs on one thread by default (--threads): on a shared CPU, more threads than free
cores makes timings swing by several times; the 1-minute load average is recorded with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import get_preset
from engine_ext.lora import LoraSpec, random_lora

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.record import append_rows  # noqa: E402


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


def timed(fn, repeats: int, setup=lambda: None) -> tuple[float, float]:
    """Median wall and CPU seconds of fn(setup()) over `repeats`; setup is not timed.

    CPU time (of this process) is what a shared machine distorts least: with one thread, waiting
    for a core that another job holds shows in wall time only.
    """
    walls, cpus = [], []
    for _ in range(repeats):
        arg = setup()
        start, cpu_start = time.perf_counter(), time.process_time()
        fn(arg)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu_start)
    return statistics.median(walls), statistics.median(cpus)


def time_indexer(engine: CEDEngine, state, repeats: int) -> float:
    """CPU seconds the decoder index layers of one replay spend scoring the global KV (top-k)."""
    cfg = engine.config
    entries = state.latents.flatten(1, 2)  # [B, P*S, d_latent]
    positions = torch.arange(state.num_positions - cfg.window, state.num_positions)
    x = state.anchor_hidden  # [B, W, D]: stands in for the replayed hidden state
    layers = [engine.model.model.layers[i].self_attn for i in cfg.index_layers
              if i > cfg.first_decoder_layer]
    num_sources = len(cfg.kv_source_layers)
    return timed(lambda _s: [a.select(x, entries, positions, num_sources) for a in layers],
                 repeats=repeats)[1]


def print_table(rows: list[dict], max_recompute: int) -> None:
    """Replay and full-recompute times per context (CPU and wall); replay vs the shortest."""
    base = rows[0]["replay_cpu_s"]
    print(f"\n{'context':>8} | {'replay CPU ms':>13} {'x first':>7} {'indexer ms':>10} "
          f"{'wall ms':>8} | {'recompute CPU s':>15} {'wall s':>7} {'CPU ratio':>9} | "
          f"{'load 1m':>7}")
    for r in rows:
        rec, rec_wall = r["recompute_cpu_s"], r["recompute_s"]
        rec_cells = (f"{rec:15.2f} {rec_wall:7.2f} {rec / r['replay_cpu_s']:9.1f}" if rec
                     else f"{'skipped':>15} {'-':>7} {'-':>9}")
        print(f"{r['context']:>8} | {r['replay_cpu_s'] * 1e3:13.1f} "
              f"{r['replay_cpu_s'] / base:7.2f} {r['replay_index_cpu_s'] * 1e3:10.1f} "
              f"{r['replay_s'] * 1e3:8.1f} | {rec_cells} | {r['loadavg_1m']:7.2f}")
    print(f"full recompute measured up to {max_recompute} tokens (--max-recompute); replay "
          f"recomputes the last W positions; 'indexer' is the part of replay that scores the "
          f"global KV")


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ced40_scaled")
    parser.add_argument("--contexts", type=int, nargs="+",
                        default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--max-recompute", type=int, default=4096,
                        help="skip the full recompute above this context (it is O(T^2))")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=Path("out/bench/engine_switch.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    engine = build_engine(args.preset)
    cfg = engine.config
    ids = torch.randint(0, cfg.vocab_size, (1, max(args.contexts)),
                        generator=torch.Generator().manual_seed(2))
    state, rows = engine.new_state(), []
    for n in sorted(args.contexts):
        engine.prefill(state, ids[:, state.num_positions : n], "source", chunk_size=args.chunk)
        replay_s, replay_cpu_s = timed(lambda s: engine.switch(s, "target"), repeats=5,
                                       setup=state.clone)
        row = {"context": n, "replay_positions": cfg.window, "replay_s": replay_s,
               "replay_cpu_s": replay_cpu_s,
               "replay_index_cpu_s": time_indexer(engine, state, repeats=5),
               "recompute_s": None, "recompute_cpu_s": None}
        if n <= args.max_recompute:
            row["recompute_s"], row["recompute_cpu_s"] = timed(
                lambda _s, n=n: engine.oracle(ids[:, :n], "target", chunk_size=args.chunk),
                repeats=1)
        row["loadavg_1m"] = os.getloadavg()[0]
        rows.append(row)
        rec = row["recompute_cpu_s"]
        print(f"context {n:6d}: replay {replay_cpu_s * 1e3:.1f} ms CPU "
              f"(indexer {row['replay_index_cpu_s'] * 1e3:.1f}), full recompute "
              f"{'skipped' if rec is None else f'{rec:.2f} s CPU'}", flush=True)
    print_table(rows, args.max_recompute)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"preset": args.preset, "window": cfg.window, "num_layers": cfg.num_layers,
            "threads": torch.get_num_threads(), "max_recompute": args.max_recompute,
            "chunk": args.chunk, "loadavg_1m_start": load_before,
            "loadavg_1m_end": os.getloadavg()[0], "cpu_count": os.cpu_count()}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    results = append_rows(
        "bench_engine_switch", [{"preset": args.preset, "threads": meta["threads"]}
                                | {k: v for k, v in r.items() if k != "loadavg_1m"} for r in rows],
        source="bench/bench_engine_switch.py " + " ".join(argv or sys.argv[1:]),
        load_average=f"{load_before:.1f}-{meta['loadavg_1m_end']:.1f}")
    print(f"wrote {args.out}; appended to {results}")


if __name__ == "__main__":
    main()
