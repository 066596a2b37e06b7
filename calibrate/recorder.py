"""Step samples: what one measured engine step computed, next to its measured seconds.

A `StepSample` holds the features the cost model prices (per item: new tokens, context, adapter,
whether the adapter applies, layer range, replay; routing decisions) and the seconds the engine
took. Probes store their samples in the planner's points store (`sim.io.points`), one JSON file
per finished probe, so an interrupted profile keeps what it measured. `machine_fingerprint()`
says where they were measured.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sim.cost.cost_model import StepBatch, create_step_batch
from sim.io.points import PointStore


@dataclass(frozen=True)
class StepSample:
    """One measured engine step."""

    group: str
    """What was running: the probe's kind ("base", "lora", "lora_p", "ced_decode", ...)."""
    num_new_tokens: tuple[int, ...]
    """Tokens each item computed in the step."""
    num_context_tokens: tuple[int, ...]
    """Tokens each item had in KV before the step."""
    adapter_ids: tuple[int, ...]
    """Adapter of each item, -1 for none."""
    is_adapted: tuple[bool, ...]
    """Whether the adapter applied to the item's tokens (False: LoRA_P decode, base)."""
    measured_s: float
    """Seconds of the step (the engine thread's CPU time by default; see the profiler)."""
    first_layer: tuple[int, ...] | None = None
    """First layer per item (None: 0)."""
    is_replay: tuple[bool, ...] | None = None
    """Bounded replay per item (None: no replay)."""
    num_routing_decisions: int = 0
    """Routing-head decisions in the step."""
    wall_s: float = 0.0
    """Wall seconds of the step (measured_s may be the engine thread's CPU seconds)."""
    adapter_load_s: float = 0.0
    """Seconds of adapter loads inside the step, on measured_s's clock (not in measured_s:
    the simulator prices loads with their own term)."""
    tags: dict = field(default_factory=dict)
    """Probe parameters (batch, prompt length, adapters, repeat) for grouping errors."""
    is_prompt: tuple[bool, ...] | None = None
    """Prompt chunk per item (None: an item of more than one token that is not a replay)."""

    def batch(self, num_layers: int) -> StepBatch:
        """The cost model's view of this step."""
        replay = self.is_replay
        return create_step_batch(
            list(self.num_new_tokens), list(self.num_context_tokens), num_layers=num_layers,
            adapter_ids=list(self.adapter_ids), is_adapted=list(self.is_adapted),
            first_layer=None if self.first_layer is None else list(self.first_layer),
            is_replay=None if replay is None else list(replay),
            is_prompt=None if self.is_prompt is None else list(self.is_prompt),
            num_routing_decisions=self.num_routing_decisions)

    def to_json(self) -> dict:
        """Plain dict for the points store."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> StepSample:
        """Inverse of `to_json`."""
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        return cls(**fields)


def samples_from_vllm_steps(timings, *, group: str, prefill_only_ids: set[int],
                            tags: dict, clock: str = "cpu") -> list[StepSample]:
    """StepSamples of vLLM steps; a step's time runs to the next step's start (the engine
    loop's scheduling and output handling belong to the step), the last one to its end.
    `clock`: "cpu" (the engine thread's CPU seconds) or "wall"."""
    out = []
    for i, t in enumerate(timings):
        nxt = timings[i + 1] if i + 1 < len(timings) else None
        if clock == "cpu":
            start, end, step_end = t.cpu_start_s, t.cpu_end_s, t.cpu_end_s
            end = nxt.cpu_start_s if nxt is not None else end
        else:
            start, step_end = t.start_s, t.end_s
            end = nxt.start_s if nxt is not None else step_end
        if end - start > 4 * (step_end - start) + 0.05:
            end = step_end  # the client paused between generate calls: not engine time
        load_s = t.adapter_load_cpu_s if clock == "cpu" else t.adapter_load_s
        adapted, is_prompt = [], []
        for new, computed, prompt, lora in zip(t.num_scheduled_tokens, t.num_computed_tokens,
                                               t.num_prompt_tokens, t.lora_ids, strict=True):
            in_prompt = computed + new <= prompt
            adapted.append(lora != 0 and (in_prompt or lora not in prefill_only_ids))
            is_prompt.append(in_prompt)
        out.append(StepSample(
            group=group, num_new_tokens=t.num_scheduled_tokens,
            num_context_tokens=t.num_computed_tokens,
            adapter_ids=tuple(x - 1 if x else -1 for x in t.lora_ids),
            is_adapted=tuple(adapted), measured_s=end - start - load_s,
            wall_s=t.end_s - t.start_s, adapter_load_s=load_s, tags=tags,
            is_prompt=tuple(is_prompt)))
    return out


def load_samples(store_dir: Path) -> list[StepSample]:
    """Every sample of every finished probe in a points folder (files in name order)."""
    samples = []
    for path in sorted(Path(store_dir).glob("*.json")):
        record = PointStore(store_dir).load(path.stem)
        if record and record.get("status") == "ok":
            samples += [StepSample.from_json(s) for s in record["result"]["samples"]]
    return samples


def load_adapter_loads(store_dir: Path) -> list[dict]:
    """Every adapter load of every finished probe in a points folder (kind, bytes, seconds)."""
    loads = []
    for path in sorted(Path(store_dir).glob("*.json")):
        record = PointStore(store_dir).load(path.stem)
        if record and record.get("status") == "ok":
            loads += record["result"].get("adapter_loads", [])
    return loads


def split_held_out(samples: list[StepSample], test_share: float = 0.25,
                    seed: int = 0) -> tuple[list[StepSample], list[StepSample]]:
    """Held-out split by probe configuration (all steps and repeats of one probe go to the same
    side, so a test probe was never seen in fitting), seeded."""
    probes = sorted({_probe_key(s) for s in samples})
    rng = np.random.default_rng(seed)
    test = set(rng.choice(len(probes), size=max(1, round(test_share * len(probes))),
                          replace=False).tolist()) if len(probes) > 1 else set()
    held = {probes[i] for i in test}
    return ([s for s in samples if _probe_key(s) not in held],
            [s for s in samples if _probe_key(s) in held])


def _probe_key(s: StepSample) -> str:
    return repr(sorted((k, v) for k, v in s.tags.items() if k != "repeat"))


def load_average() -> tuple[float, float, float]:
    """1, 5, 15-minute load averages (0s where the platform has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


def machine_fingerprint(device: str = "cpu") -> dict:
    """Processor, cores and (on CUDA) the GPU name: where samples were measured."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "num_cpus": os.cpu_count() or 0, "platform": platform.platform(),
            "device": device}
    if device == "cuda":
        import torch

        info["gpu"] = torch.cuda.get_device_name(0)
    return info
