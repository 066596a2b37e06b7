"""Checks of scenario values that `run` would otherwise fail on half-way: custom GPU numbers,
tensor parallelism against the attention heads, the KV block and pool sizes against the longest
request, the prefill budget without chunking, and the trace file itself (opened and read row by
row). Each returns problem lines `field.path: what is wrong` (trace rows: `FILE:LINE: ...`)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from sim.hardware.specs import GpuSpec, ModelArch
from sim.workload.traces import TraceError, read_trace

GPU_BOUNDS = {
    "bf16_dense_flops": (1e9, 1e18),
    "hbm_bytes": (1e8, 1e13),
    "hbm_bandwidth_bytes_per_s": (1e8, 1e14),
    "nvlink_bandwidth_bytes_per_s": (0.0, 1e14),
    "pcie_bandwidth_bytes_per_s": (1e6, 1e13),
    "price_per_hour_usd": (0.0, 1e4),
}
"""Plausible range of each custom GPU number (a GPU of 1e30 bytes is a typo, not a plan)."""


def custom_gpu_problems(raw: dict) -> list[str]:
    """Problems of a custom GPU spec as written (before pydantic coerces booleans to numbers)."""
    out = []
    for field, (low, high) in GPU_BOUNDS.items():
        value = raw.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if not isinstance(value, str):
                out.append(f"{field}: {value!r} is not a number; allowed: {low:g}..{high:g}")
            continue  # a string: pydantic parses it or says why not
        if not math.isfinite(value) or not low <= value <= high:
            out.append(f"{field}: {value!r} is outside the plausible range; allowed: "
                       f"{low:g}..{high:g}")
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_parallel_problem(field: str, tp: int, arch: ModelArch) -> str | None:
    """vLLM shards attention heads (and KV heads, unless it replicates them) over TP ranks."""
    heads, kv_heads = arch.num_attention_heads, arch.num_kv_heads
    if heads % tp == 0 and (tp >= kv_heads or kv_heads % tp == 0):
        return None
    allowed = [d for d in _divisors(heads) if d >= kv_heads or kv_heads % d == 0]
    return (f"{field}: {tp} does not divide the {heads} attention heads ({kv_heads} KV heads) "
            f"of {arch.name!r}; allowed: {allowed}")


def longest_request_problems(field: str, longest: int, longest_prompt: int, engine,
                             arch: ModelArch, gpu: GpuSpec, tp: int, uses_lora: bool) -> list[str]:
    """The KV block, the KV pool and the one-step prefill budget against the longest request."""
    mem = engine.memory(arch, gpu, tp, uses_lora=uses_lora)
    block_bytes = mem.kv_bytes_per_token_per_gpu * engine.block_size
    if mem.num_kv_blocks < 1 and 0 < mem.kv_pool_bytes < block_bytes:
        return [f"engine.block_size: one block of {engine.block_size} tokens needs "
                f"{block_bytes / 2**20:.0f} MiB of KV per GPU for {arch.name!r}, more than the "
                f"{mem.kv_pool_bytes / 2**20:.0f} MiB pool; allowed: a smaller block_size"]
    out = []
    if 0 < mem.num_kv_tokens < longest:
        out.append(f"{field}: requests reach {longest} tokens of context, more than the KV pool "
                   f"of one {arch.name!r} replica on {gpu.name} holds ({mem.num_kv_tokens} "
                   f"tokens); allowed: <= {mem.num_kv_tokens}, or more memory per replica")
    if not engine.enable_chunked_prefill and longest_prompt > engine.max_num_batched_tokens:
        out.append(f"engine.max_num_batched_tokens: {engine.max_num_batched_tokens} is below the "
                   f"longest prompt ({longest_prompt} tokens) with enable_chunked_prefill: false, "
                   f"so that prompt could never be scheduled; allowed: >= {longest_prompt}, or "
                   f"enable_chunked_prefill: true")
    return out


def trace_problems(scenario, source: str, line: int) -> list[str]:
    """Open and read the scenario's trace as a run would; problems name the bad row."""
    w = scenario.workload
    at = f"(workload.path, {source}:{line})"
    c = w.columns
    try:
        table = read_trace(Path(w.path), fmt=w.format, arrival_column=c.arrival_time,
                           input_column=c.num_input_tokens, output_column=c.num_output_tokens,
                           hash_ids_column=c.hash_ids, adapter_column=c.adapter,
                           time_unit=w.time_unit, length_scale=w.length_scale,
                           max_requests=w.max_requests)
    except TraceError as err:
        message = str(err)
        if not re.match(r":\d", message.removeprefix(str(w.path))):  # the file, not a row
            return [f"{source}:{line}: workload.path: {message}"]
        return [f"{message} {at}"]
    total = table.input_tokens + table.output_tokens
    out = []
    for i in range(len(scenario.strategies)):
        arch = scenario.strategy_arch(i)
        row = int(total.argmax())
        if total[row] > arch.max_context_tokens:
            out.append(f"{table.where[row]}: a request of {total[row]} tokens (input + output, "
                       f"after length_scale) is longer than {arch.name!r} allows "
                       f"({arch.max_context_tokens}) {at}")
            break
    return out
