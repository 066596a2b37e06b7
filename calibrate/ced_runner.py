"""Profile the torch CED engine: prefill chunks, decode steps, bounded replays, routing decisions.

The engine is the "small" preset (8 layers, encoder 0-3, window 32) with two decoder-side LoRA
adapters (the shared-KV placement rule) and a MoL2 pointer head over four cached options. Each
probe builds a session of `context` tokens (untimed), then times one operation several times on
the engine thread's CPU clock; every timing is a `StepSample` shaped as the simulator prices it
(replays from the first decoder layer, routing as head decisions). `CED_SMALL_ARCH` is the
preset as a `ModelArch` so the simulator can price it; `fit_ced` fits a profile to the samples.
"""

from __future__ import annotations

import time
from pathlib import Path

from calibrate.host_allocator import keep_freed_memory
from calibrate.recorder import StepSample
from sim.hardware.catalogue import get_model

PRESET = "small"
ADAPTER_MODULES = ("gate_proj", "up_proj", "down_proj")
CED_SMALL_ARCH = get_model("ced-small")
"""The profiled preset as the simulator prices it (sim.hardware.catalogue)."""


def ced_probe_grid(num_repeats: int, quick: bool = False) -> list[dict]:
    """Operations x batch x context x chunk; repeats interleaved (`quick`: a smoke-test grid)."""
    probes = []
    for repeat in range(num_repeats):
        for context in (0, 64) if quick else (0, 128, 512, 1024):
            for batch in (1,) if quick else (1, 4):
                for chunk in (32, 256):
                    probes.append(dict(op="prefill", batch=batch, context=context, chunk=chunk,
                                       repeat=repeat))
                if context:
                    probes.append(dict(op="decode", batch=batch, context=context,
                                       repeat=repeat))
                    probes.append(dict(op="replay", batch=batch, context=context,
                                       repeat=repeat))
            probes.append(dict(op="route", batch=4, context=max(context, 32), repeat=repeat))
    return probes


class CedSession:
    """The small CED engine with two adapters and a pointer-head router, one torch thread."""

    def __init__(self, seed: int = 0):
        import torch

        from engine_ext.ced.engine import CEDEngine
        from engine_ext.ced.model import CEDForCausalLM
        from engine_ext.config import get_preset
        from engine_ext.lora import LoraSpec, random_lora
        from engine_ext.routing import PointerHead, Router

        torch.set_num_threads(1)
        self.host_allocator = keep_freed_memory()
        torch.manual_seed(seed)
        self.torch = torch
        cfg = get_preset(PRESET)
        model = CEDForCausalLM(cfg).eval()
        self.engine = CEDEngine(model, max_loras=2, max_lora_rank=8)
        decoder = tuple(range(cfg.first_decoder_layer + 1, cfg.num_layers))
        for i in range(2):
            spec = LoraSpec(rank=8, alpha=16, target_modules=ADAPTER_MODULES, layers=decoder)
            self.engine.add_adapter(f"a{i}", random_lora(model, spec,
                                                         torch.Generator().manual_seed(i)))
        head = PointerHead(d_query=cfg.d_model, d_option=cfg.d_model, d_head=32,
                           num_heads=2).eval()
        self.num_head_params = sum(p.numel() for p in head.parameters())
        options = [[5 + i, 9 + i, 12 + i] for i in range(4)]
        self.router = Router.create(head, model.model.embed_tokens, options,
                                    ["a0", "a1", "a0", "a1"])
        self.cfg = cfg

    def _tokens(self, batch: int, n: int, seed: int):
        gen = self.torch.Generator().manual_seed(seed)
        return self.torch.randint(3, self.cfg.vocab_size, (batch, n), generator=gen)

    def run_probe(self, probe: dict, num_timings: int = 4) -> list[StepSample]:
        """Time one operation `num_timings` times after an untimed context prefill."""
        b, ctx, op = probe["batch"], probe["context"], probe["op"]
        adapters = ["a0", "a1"] * (b // 2) + ["a0"] * (b % 2)
        out = []
        with self.torch.no_grad():
            state = self.engine.new_state(b)
            if ctx:
                self.engine.prefill(state, self._tokens(b, ctx, 1), adapters, chunk_size=512)
            for i in range(num_timings):
                out.append(self._timed(op, state, probe, adapters, seed=100 + i))
        return out

    def _timed(self, op: str, state, probe: dict, adapters, seed: int) -> StepSample:
        b = probe["batch"]
        e = self.engine
        n, ctx, first, replay, decisions = 1, state.num_positions, 0, False, 0
        if op == "prefill":
            work = state.clone()
            n = probe["chunk"]
            tokens = self._tokens(b, n, seed)
            run = lambda: e.prefill(work, tokens, adapters)  # noqa: E731
        elif op == "decode":
            token = self._tokens(b, 1, seed)
            run = lambda: e.decode_step(state, token, adapters, prompt_len=1)  # noqa: E731
        elif op == "replay":
            n, first, replay = self.cfg.window, self.cfg.first_decoder_layer, True
            ctx -= n
            run = lambda: e.switch(state, adapters[::-1])  # noqa: E731
        else:
            h19 = self.torch.randn(b, 16, self.cfg.d_model)
            run = lambda: self.router.route(h19)  # noqa: E731
            decisions = b
        start = time.thread_time()
        run()
        seconds = time.thread_time() - start
        items = 0 if op == "route" else b
        is_adapted = op in ("decode", "replay") or op == "prefill"
        return StepSample(
            group=f"ced_{op}", num_new_tokens=(n,) * items, num_context_tokens=(ctx,) * items,
            adapter_ids=tuple(i % 2 for i in range(items)), is_adapted=(is_adapted,) * items,
            measured_s=seconds, first_layer=(first,) * items, is_replay=(replay,) * items,
            num_routing_decisions=decisions, tags=probe)


def profile_ced(store_dir: Path, *, num_repeats: int = 3, quick: bool = False,
                on_progress=None) -> dict:
    """Run every CED probe not yet in `store_dir`; records by key."""
    from calibrate.runner import probe_key
    from sim.io.points import PointStore, PointTask, progress_counter, run_points

    tasks = [PointTask(probe_key("ced", p), p) for p in ced_probe_grid(num_repeats, quick)]
    session = CedSession()
    _write_meta(Path(store_dir).parent / "ced.json", session)
    session.run_probe(dict(op="prefill", batch=1, context=32, chunk=32), 2)  # warm-up

    def measure(probe: dict) -> dict:
        return {"samples": [s.to_json() for s in session.run_probe(probe)], "engine": "ced"}

    return run_points(tasks, measure, PointStore(store_dir), backend="inline",
                      on_done=progress_counter(len(tasks), on_progress))


def _write_meta(path: Path, session: CedSession) -> None:
    import json
    from importlib.metadata import version

    from calibrate.recorder import load_average, machine_fingerprint
    from sim.io.files import write_atomic

    meta = dict(engine=dict(name="molcap-ced", version=version("molcap"),
                            settings=dict(preset=PRESET, max_loras=2, max_lora_rank=8,
                                          num_head_params=session.num_head_params,
                                          num_threads=1,
                                          host_allocator=session.host_allocator)),
                hardware=dict(gpu="cpu", fingerprint=machine_fingerprint()),
                packages={"torch": version("torch"), "molcap": version("molcap")},
                load_average=load_average())
    write_atomic(path, json.dumps(meta, indent=2).encode("utf-8"))


def ced_group_profiles(num_head_params: int) -> dict:
    """Cost profile per CED sample group on the `cpu` entry."""
    from sim.cost.layer_costs import create_layer_costs
    from sim.hardware.catalogue import get_gpu

    decoder = range(CED_SMALL_ARCH.ced.num_encoder_layers + 1, CED_SMALL_ARCH.num_layers)
    placements = [(i, m) for i in decoder for m in ADAPTER_MODULES]
    lora = create_layer_costs(CED_SMALL_ARCH, get_gpu("cpu"), adapter_kind="lora",
                               adapter_rank=8, adapter_placements=placements,
                               num_head_params=num_head_params,
                               lora_wrapped_placements=placements)
    return {f"ced_{op}": lora for op in ("prefill", "decode", "replay", "route")}


def fit_ced(root: Path, *, name: str, out_dir: Path):
    """Fit the CED samples under `root` into OUT_DIR/NAME.yaml; (path, profile)."""
    import json

    from calibrate.commands import current_command, recorded_measure_command
    from calibrate.fitter import DEFAULT_TERMS, create_calibration_profile, fit, write_profile
    from calibrate.recorder import load_samples, split_held_out
    from sim.cost.cost_model import DEFAULT_COEFFS

    meta = json.loads((root / "ced.json").read_text())
    samples = [s for s in load_samples(root / "samples") if s.group.startswith("ced_")]
    if not samples:
        raise ValueError(f"{root / 'samples'}: no CED samples")
    profiles = ced_group_profiles(meta["engine"]["settings"]["num_head_params"])
    train, test = split_held_out(samples)
    # layer_overhead_s: the torch engine's per-layer host work (Python, small ops) whatever the
    # tokens; a bounded replay runs the decoder layers only, so it pays about half of it.
    terms = DEFAULT_TERMS + ("lora_flops_efficiency", "lora_launch_overhead_s",
                             "lora_slice_launch_s", "routing_overhead_s", "layer_overhead_s")
    # The torch engine applies LoRA per slot on the adapted modules only: no per-token gather.
    start = DEFAULT_COEFFS["cpu"].model_copy(update={"lora_token_gather_share": 0.0})
    result = fit(train, terms, profiles, start=start, held_out=test)
    profile = create_calibration_profile(
        result, name=name, model=CED_SMALL_ARCH.name, engine=meta["engine"],
        hardware=meta["hardware"], packages=meta["packages"], num_samples=len(samples),
        load_average=meta["load_average"],
        commands=(recorded_measure_command(root), current_command()),
        description="torch CED engine, preset 'small' (fp32, one thread): prefill, decode, "
                    "bounded replay and pointer-head routing; engine thread CPU seconds")
    path = Path(out_dir) / f"{name}.yaml"
    write_profile(profile, path)
    return path, profile


def measure_switch(contexts=(128, 512, 1024), num_repeats: int = 3) -> list[dict]:
    """Switch cost on the CED engine by context, both ways, repeats interleaved: bounded
    replay of the last W positions vs re-prefilling the whole context under the new adapter.
    One row per (way, context, repeat): CPU seconds."""
    session = CedSession()
    e, rows = session.engine, []
    with session.torch.no_grad():
        for repeat in range(num_repeats):
            for context in contexts:
                tokens = session._tokens(1, context, 7)
                state = e.new_state(1)
                e.prefill(state, tokens, "a0", chunk_size=512)
                start = time.thread_time()
                e.switch(state, "a1")
                rows.append(dict(way="replay", context=context, repeat=repeat,
                                 seconds=time.thread_time() - start))
                start = time.thread_time()
                e.prefill(e.new_state(1), tokens, "a1", chunk_size=512)
                rows.append(dict(way="re-prefill", context=context, repeat=repeat,
                                 seconds=time.thread_time() - start))
    return rows


def predict_switch(coeffs, way: str, context: int, num_head_params: int = 0) -> float:
    """The cost model's seconds for one switch (one step per 512-token prefill chunk)."""
    from sim.cost.cost_model import create_step_batch, predict_step

    profile = ced_group_profiles(num_head_params)["ced_replay"]
    arch = CED_SMALL_ARCH
    if way == "replay":
        w = arch.ced.sliding_window_tokens
        batch = create_step_batch([w], [context - w], num_layers=arch.num_layers,
                                  adapter_ids=[1], first_layer=[arch.ced.num_encoder_layers],
                                  is_replay=[True])
        return predict_step(coeffs, profile, batch).total_s
    total = 0.0
    for start in range(0, context, 512):
        n = min(512, context - start)
        batch = create_step_batch([n], [start], num_layers=arch.num_layers, adapter_ids=[1])
        total += predict_step(coeffs, profile, batch).total_s
    return total
