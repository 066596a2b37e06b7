"""Train the small CED model on real text, then one LoRA per domain on it.

    python -m engine_ext.train [--out .cache/engine_ext/ced_small] [--steps 150] [--force]

Reproducible (fixed seeds, deterministic data order) and cached: an existing checkpoint in --out is
reused unless --force. The base model is trained on a mix of the four domains; each domain LoRA sits
on the decoder side only (layer-E FFN and layers E+1..), as the shared-KV placement rule demands.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from engine_ext.ced.engine import CEDEngine
from engine_ext.ced.model import CEDForCausalLM
from engine_ext.config import EngineConfig, get_preset
from engine_ext.data import DOMAINS, domain_splits, sample_windows
from engine_ext.lora import LoraSpec, apply_lora, extract_slot, init_slot, lora_modules
from engine_ext.peft_io import load_peft_adapter, save_peft_adapter

DEFAULT_OUT = Path(".cache/engine_ext/ced_small")
ALL_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def domain_lora_spec(cfg: EngineConfig, rank: int = 8) -> LoraSpec:
    """Decoder-side LoRA of a domain: every linear of layers E+1..L-1.

    (Layer-E FFN is allowed too, but one PEFT config cannot name "layer E FFN plus everything
    above" without a regex, so the trained adapters keep to the layers above E.)
    """
    return LoraSpec(rank=rank, alpha=2 * rank, target_modules=ALL_LINEARS,
                    layers=tuple(range(cfg.first_decoder_layer + 1, cfg.num_layers)),
                    base_model=f"ced-{cfg.num_layers}L-{cfg.d_model}d")


def lm_loss(engine: CEDEngine, windows: torch.Tensor, adapter: str | None) -> torch.Tensor:
    """Next-byte cross-entropy (nats) of windows [B, T+1] in one chunk from an empty state."""
    out = engine.prefill(engine.new_state(windows.shape[0]), windows[:, :-1], adapter)
    return F.cross_entropy(out.logits.flatten(0, 1), windows[:, 1:].flatten())


def _train_loop(engine, params, batches, steps: int, lr: float, adapter: str | None, label: str):
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    start = time.time()
    for step in range(steps):
        loss = lm_loss(engine, batches(), adapter)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"  [{label}] step {step:4d} loss {loss.item():.3f} ({time.time() - start:.0f}s)")


@torch.no_grad()
def eval_bits_per_byte(engine: CEDEngine, ids: torch.Tensor, adapter: str | None,
                       seq_len: int = 128, num_windows: int = 16) -> float:
    """Mean bits per byte on fixed held-out windows."""
    gen = torch.Generator().manual_seed(123)
    return lm_loss(engine, sample_windows(ids, num_windows, seq_len, gen), adapter).item() / 0.6931


def train_base(cfg: EngineConfig, splits: dict, steps: int, seq_len: int, batch: int,
               seed: int) -> CEDForCausalLM:
    """Full-parameter training of the CED model on a mix of all domains."""
    torch.manual_seed(seed)
    model = CEDForCausalLM(cfg)
    engine = CEDEngine(model)
    gen = torch.Generator().manual_seed(seed)

    def batches() -> torch.Tensor:
        per = [sample_windows(splits[d][0], batch // len(DOMAINS), seq_len, gen) for d in DOMAINS]
        return torch.cat(per)

    _train_loop(engine, list(model.parameters()), batches, steps, 3e-3, None, "base")
    return model.eval()


def train_domain_loras(model: CEDForCausalLM, splits: dict, steps: int, seq_len: int, batch: int,
                       seed: int, out: Path) -> dict[str, Path]:
    """One LoRA per domain on the frozen base; saved in PEFT format under out/lora_<domain>."""
    for p in model.parameters():
        p.requires_grad_(False)
    spec = domain_lora_spec(model.config)
    engine = CEDEngine(model, max_loras=len(DOMAINS), max_lora_rank=spec.rank)
    apply_lora(model, spec, max_loras=len(DOMAINS), max_lora_rank=spec.rank)
    gen, paths = torch.Generator().manual_seed(seed + 1), {}
    modules = list(lora_modules(model).values())
    for p in [m.lora_a for m in modules] + [m.lora_b for m in modules]:
        p.requires_grad_(True)
    for slot, domain in enumerate(DOMAINS):
        init_slot(model, spec, slot, gen)
        engine.registry.slots[domain] = slot  # trained in place, registered directly
        params = [m.lora_a for m in modules] + [m.lora_b for m in modules]

        def batches(d: str = domain) -> torch.Tensor:
            return sample_windows(splits[d][0], batch, seq_len, gen)

        _train_loop(engine, params, batches, steps, 3e-3, domain, f"lora {domain}")
        paths[domain] = save_peft_adapter(extract_slot(model, spec, slot), out / f"lora_{domain}")
    return paths


def save_base(model: CEDForCausalLM, out: Path) -> None:
    """config.json + model.safetensors."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(model.config.model_dump_json(indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(out / "model.safetensors"))


def load_base(out: Path = DEFAULT_OUT) -> CEDForCausalLM:
    """The trained base model, in eval mode."""
    cfg = EngineConfig.model_validate_json((out / "config.json").read_text())
    model = CEDForCausalLM(cfg)
    model.load_state_dict(load_file(str(out / "model.safetensors")))
    return model.eval()


def load_trained(out: Path = DEFAULT_OUT, max_loras: int = 6) -> CEDEngine:
    """The trained base model with every domain LoRA loaded (named by domain)."""
    model = load_base(out)
    cfg = model.config
    engine = CEDEngine(model, max_loras=max_loras, max_lora_rank=8)
    base_name = domain_lora_spec(cfg).base_model
    for domain in DOMAINS:
        path = out / f"lora_{domain}"
        weights = load_peft_adapter(path, model, base_model=base_name)
        engine.registry.add(domain, weights, source=str(path))
    return engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lora-steps", type=int, default=40)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    splits = {d: domain_splits(d) for d in DOMAINS}
    have_base = (args.out / "model.safetensors").exists() and not args.force
    have_loras = have_base and all((args.out / f"lora_{d}").exists() for d in DOMAINS)
    if have_base:
        print(f"reusing cached base model in {args.out} (--force retrains)")
        model = load_base(args.out)
    else:
        cfg = get_preset(args.preset)
        print(f"training base CED model ({args.preset}) for {args.steps} steps")
        model = train_base(cfg, splits, args.steps, args.seq_len, args.batch, args.seed)
        save_base(model, args.out)
    if not have_loras:
        train_domain_loras(model, splits, args.lora_steps, args.seq_len, args.batch, args.seed,
                           args.out)
    engine = load_trained(args.out)
    report = {}
    for domain in DOMAINS:
        held_out = splits[domain][1]
        row = {"base": eval_bits_per_byte(engine, held_out, None)}
        row.update({a: eval_bits_per_byte(engine, held_out, a) for a in DOMAINS})
        report[domain] = row
        cells = " ".join(f"{k}={v:.3f}" for k, v in row.items())
        print(f"held-out {domain:6s} bits/byte: {cells}")
    (args.out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
