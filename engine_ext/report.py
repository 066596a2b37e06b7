"""Replay-vs-oracle report on the trained CED model (run `python -m engine_ext.train` first).

    python -m engine_ext.report [--ckpt .cache/engine_ext/ced_small] [--contexts 128 256 512 1024]

For each context length: the history (held-out text of the target domain) is prefilled under a
source adapter, the session switches to the target by bounded replay, and the continuation is fed
token by token. It is compared with the oracle (one pass over history + continuation under the
target) and with a no-switch control (same chunking and token-by-token feeding under the target
throughout), which isolates incremental-computation error. Also checks, on this trained model,
that the post-switch logits are bitwise identical whichever adapter wrote the history.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from engine_ext.ced.engine import CEDEngine
from engine_ext.data import DOMAINS, domain_splits
from engine_ext.train import DEFAULT_OUT, load_trained

BUCKETS = ((0, 8), (8, 32), (32, 64))


def _run(engine: CEDEngine, history: torch.Tensor, cont: torch.Tensor, source: str | None,
         target: str, switch: bool):
    state = engine.new_state()
    engine.prefill(state, history, source, chunk_size=64)
    if switch:
        engine.switch(state, target)
    return engine.feed_tokens(state, cont, target, collect_hidden=True)


def _ppl(logits: torch.Tensor, cont: torch.Tensor) -> float:
    # logits[:, i] predicts cont[:, i + 1]
    loss = F.cross_entropy(logits[0, :-1], cont[0, 1:])
    return math.exp(loss.item())


@torch.no_grad()
def measure(engine: CEDEngine, ids: torch.Tensor, n_ctx: int, n_cont: int, source: str,
            target: str) -> dict:
    """One row of the table for a context of n_ctx tokens."""
    history, cont = ids[None, :n_ctx], ids[None, n_ctx : n_ctx + n_cont]
    switched = _run(engine, history, cont, source, target, switch=True)
    control = _run(engine, history, cont, target, target, switch=False)
    full = engine.prefill(engine.new_state(), torch.cat([history, cont], 1), target,
                          collect_hidden=True)
    oracle_logits = full.logits[:, n_ctx:]
    err = (switched.logits - oracle_logits).abs().amax(dim=(0, 2))  # [n_cont]
    ctrl_err = (control.logits - oracle_logits).abs().amax(dim=(0, 2))
    depth = []
    for hs, ho in zip(switched.decoder_hidden, full.decoder_hidden, strict=True):
        ho = ho[:, n_ctx:]
        depth.append(((hs - ho).norm() / ho.norm()).item())
    return {
        "context": n_ctx,
        "ppl_replay": _ppl(switched.logits, cont),
        "ppl_oracle": _ppl(oracle_logits, cont),
        "ppl_control": _ppl(control.logits, cont),
        "logit_err_by_pos": {f"{a}-{b}": err[a:b].max().item() for a, b in BUCKETS},
        "control_err_max": ctrl_err.max().item(),
        "hidden_rel_err_by_depth": depth,
    }


@torch.no_grad()
def bitwise_identity(engine: CEDEngine, ids: torch.Tensor, target: str, n_ctx: int = 256) -> bool:
    """Post-switch logits equal bit for bit across every other source adapter and the base."""
    torch.use_deterministic_algorithms(True)
    history, cont = ids[None, :n_ctx], ids[None, n_ctx : n_ctx + 16]
    outs = [_run(engine, history, cont, src, target, switch=True).logits
            for src in [None, *[d for d in DOMAINS if d != target]]]
    return all(torch.equal(outs[0], o) for o in outs[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--continuation", type=int, default=64)
    parser.add_argument("--source", default="chat")
    parser.add_argument("--target", default="legal")
    parser.add_argument("--out", type=Path, default=Path("out/engine/replay_vs_oracle.json"))
    args = parser.parse_args(argv)
    engine = load_trained(args.ckpt)
    ids = domain_splits(args.target)[1]
    rows = [measure(engine, ids, n, args.continuation, args.source, args.target)
            for n in args.contexts]
    identical = bitwise_identity(engine, ids, args.target)
    w = engine.config.window
    print(f"replay vs oracle: source={args.source} target={args.target} W={w} "
          f"continuation={args.continuation} tokens")
    head = f"{'context':>8} {'ppl_or/rep':>10} {'ppl_rep':>8} {'ppl_or':>8} {'ctrl_err':>9} "
    head += " ".join(f"{'err@' + k:>9}" for k in rows[0]["logit_err_by_pos"])
    print(head + "  hidden rel err by decoder depth")
    for r in rows:
        cells = " ".join(f"{v:9.2e}" for v in r["logit_err_by_pos"].values())
        depth = " ".join(f"{d:.1e}" for d in r["hidden_rel_err_by_depth"])
        print(f"{r['context']:>8} {r['ppl_oracle'] / r['ppl_replay']:10.4f} "
              f"{r['ppl_replay']:8.3f} {r['ppl_oracle']:8.3f} {r['control_err_max']:9.2e} "
              f"{cells}  {depth}")
    print(f"post-switch logits bitwise identical across sources: {identical}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "bitwise_identical": identical,
                                    "source": args.source, "target": args.target,
                                    "window": w}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
