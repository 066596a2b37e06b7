"""Decode step time vs number of distinct adapters in a batch: LoRA, LoRA_P and DiReFT_P.

    python bench/bench_engine_multilora.py [--batch 32] [--distinct 1 2 4 8 16 32]

A small random Llama (decoder-only runner) decodes one token for each of `batch` requests whose
adapters are spread round-robin over `distinct` adapters. All-token LoRA pays one grouped low-rank
pair per distinct adapter in every decode step; prefill-only adapters (LoRA_P, DiReFT_P) leave
decode tokens on the base weights, so their step time should stay at the base model's. Prints a
table, writes out/bench/engine_multilora.json and appends the rows to
bench/results/bench_engine_multilora.json. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine_ext.decoder_only import DecoderOnlyEngine
from engine_ext.lora import LoraSpec, random_lora
from engine_ext.reft import ReftSpec, random_reft

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.record import append_rows  # noqa: E402

KINDS = ("base", "lora", "lora_p", "direft_p")


def build(kind: str, num_adapters: int, args) -> DecoderOnlyEngine:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4)
    engine = DecoderOnlyEngine(LlamaForCausalLM(cfg).eval(), max_loras=max(num_adapters, 1),
                               max_lora_rank=args.rank)
    gen = torch.Generator().manual_seed(1)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for i in range(num_adapters if kind != "base" else 0):
        if kind == "direft_p":
            reft = random_reft(ReftSpec(rank=args.rank, layers=tuple(range(args.layers))),
                               args.hidden, gen)
            engine.add_adapter(f"a{i}", reft=reft)
        else:
            spec = LoraSpec(rank=args.rank, alpha=2 * args.rank, target_modules=targets,
                            prefill_only=kind == "lora_p")
            engine.add_adapter(f"a{i}", random_lora(engine.hf, spec, gen))
    return engine


@torch.no_grad()
def decode_step_s(kind: str, num_adapters: int, args) -> float:
    engine = build(kind, num_adapters, args)
    names = [None if kind == "base" else f"a{i % num_adapters}" for i in range(args.batch)]
    prompt = torch.randint(0, 1000, (args.batch, args.prompt),
                           generator=torch.Generator().manual_seed(3))
    cache = engine.new_cache(args.batch)
    engine.forward(cache, prompt, names)
    token = prompt[:, -1:]
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        logits = engine.forward(cache, token, names, prompt_len=args.prompt)
        times.append(time.perf_counter() - start)
        token = logits[:, -1:].argmax(-1)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--distinct", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("out/bench/engine_multilora.json"))
    args = parser.parse_args(argv)
    rows = []
    for n in args.distinct:
        row = {"distinct": n}
        row.update({f"{k}_ms": decode_step_s(k, n, args) * 1e3 for k in KINDS})
        rows.append(row)
        print(f"distinct {n:3d}: " + " ".join(f"{k}={row[k + '_ms']:.2f}ms" for k in KINDS),
              flush=True)
    print(f"\ndecode step (ms), batch {args.batch}")
    print(f"{'distinct':>8} " + " ".join(f"{k:>9}" for k in KINDS))
    for r in rows:
        print(f"{r['distinct']:>8} " + " ".join(f"{r[k + '_ms']:9.2f}" for k in KINDS))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(args, k) for k in ("batch", "hidden", "layers", "rank", "prompt", "steps")}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    command = "bench/bench_engine_multilora.py " + " ".join(argv or sys.argv[1:])
    results = append_rows("bench_engine_multilora", [meta | r for r in rows], source=command)
    print(f"wrote {args.out}; appended to {results}")


if __name__ == "__main__":
    main()
