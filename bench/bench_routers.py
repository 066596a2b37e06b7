"""The router table: accuracy, decision time and parameters per router and setting, from the cards.

    python bench/bench_routers.py [--train [TRAIN ARGS...]] [--cards scenarios/router_cards]
                                  [--out out/bench/routers.json]

With --train it first runs `python -m engine_ext.routers.train` (the remaining arguments go to
it; run it under `nice -n 10` on a shared machine), which trains every router with 5 seeds and
writes one card per router; then it reads the cards, prints the table (markdown) and the MoL2
mixed-vs-staged table, and writes the same rows as JSON and the tables as markdown side by side
(`--out docs/router_table.json` for the committed copy). Accuracy is the test-split mean over
seeds +- the sample standard deviation; times are per request on the card's hardware (wall, and
the deciding thread's CPU time, which a loaded machine disturbs less).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

from sim.strategies.router_card import RouterCard, load_router_card


def card_rows(card: RouterCard) -> list[dict]:
    """One flat row per setting of a card."""
    rows = []
    for s in card.settings:
        d = s.decision or _PENDING  # not timed yet: the table says "pending"
        # each row's own head (a card's settings may train heads of different sizes); a
        # decoded label has no head: the card's trained parameters (L0's LoRA) stand
        num_params = s.work.num_head_params or card.num_params
        rows.append(dict(router=card.router, card=card.name, model=card.model,
                         routing_layer=card.routing_layer, num_params=num_params,
                         setting=s.setting, num_options=s.num_options, num_test=s.num_test,
                         num_seeds=len(card.seeds), accuracy_mean=s.accuracy_mean,
                         accuracy_std=s.accuracy_std, p50_ms=d.p50_ms, p99_ms=d.p99_ms,
                         batched_p50_ms=d.batched_p50_ms, batch_size=d.batch_size,
                         p50_cpu_ms=d.p50_cpu_ms, batched_p50_cpu_ms=d.batched_p50_cpu_ms,
                         standalone_p50_ms=s.standalone.p50_ms if s.standalone else None,
                         prefill_tokens=s.work.num_prefill_tokens,
                         decode_tokens=s.work.num_decode_tokens,
                         cached_prefix_tokens=s.work.num_cached_prefix_tokens,
                         num_timed=d.num_requests,
                         train_seconds=s.train_seconds_mean, cpu=cpu_short(card.hardware.cpu),
                         load_average=card.hardware.load_average[0]))
    return rows


_PENDING = SimpleNamespace(p50_ms=None, p99_ms=None, batched_p50_ms=None, batch_size=None,
                           p50_cpu_ms=None, batched_p50_cpu_ms=None, num_requests=None)


def cpu_short(cpu: str) -> str:
    """'Intel(R) Xeon(R) Processor (2 cores)' -> 'Intel Xeon' (the table's machine column)."""
    return re.sub(r"\(R\)|\(TM\)| Processor| CPU|\s*\(\d+ cores\)", "", cpu).strip()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _work(row: dict) -> str:
    cached = row.get("cached_prefix_tokens") or 0
    text = f"{row['prefill_tokens']}+{row['decode_tokens']}"
    return text + (f" (+{cached} cached)" if cached else "")


def table(rows: list[dict]) -> str:
    """Markdown table of the rows."""
    head = ("| router | model (layer) | params | setting | options | test | accuracy (5 seeds) "
            "| p50 / p99 ms (timed) | p50 CPU ms | batched p50 ms | out-of-engine p50 ms | work "
            "(prefill+decode tok) | train s/seed | CPU, load |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['router']} | {r['model']} ({r['routing_layer']}) | {r['num_params']:,} | "
            f"{r['setting']} | {r['num_options']} | {r['num_test']} | "
            f"{100 * r['accuracy_mean']:.1f} +- {100 * r['accuracy_std']:.1f}% | "
            + (f"{_ms(r['p50_ms'])} / {_ms(r['p99_ms'])} ({r['num_timed']}) | "
               f"{_ms(r['p50_cpu_ms'])} | {_ms(r['batched_p50_ms'])} (x{r['batch_size']}) | "
               if r["num_timed"] else "pending | pending | pending | ")
            + f"{_ms(r['standalone_p50_ms'])} | "
            f"{_work(r)} | {r['train_seconds']:.0f} | "
            f"{r['cpu']}, {r['load_average']:.1f} |")
    return "\n".join(lines)


def regime_rows(card: RouterCard) -> list[dict]:
    """Mixed vs staged rows of a card (MoL2)."""
    return [dict(regime=r.regime, setting=setting, accuracy_mean=statistics.fmean(accs),
                 accuracy_std=statistics.stdev(accs) if len(accs) > 1 else 0.0)
            for r in card.regimes for setting, accs in r.accuracy_per_seed.items()]


def regime_table(rows: list[dict]) -> str:
    """Markdown table: accuracy per regime and setting."""
    settings = sorted({r["setting"] for r in rows})
    lines = ["| regime | " + " | ".join(settings) + " |",
             "|---|" + "---|" * len(settings)]
    for regime in dict.fromkeys(r["regime"] for r in rows):
        cells = {r["setting"]: r for r in rows if r["regime"] == regime}
        lines.append(f"| {regime} | " + " | ".join(
            f"{100 * cells[s]['accuracy_mean']:.1f} +- {100 * cells[s]['accuracy_std']:.1f}%"
            for s in settings) + " |")
    return "\n".join(lines)


SUMMARY_SETTINGS = ("domains4", "clinc_domains10", "banking77", "clinc_intents150")
SAMPLE_TEXT = {"heads": "30 rows per class (domains4 100)",
               "contextual": "Contextual MoL's subsample", "l0": "L0's training rows",
               "full": "whole training split"}


def summary_table(rows: list[dict], baselines: list[dict]) -> str:
    """Accuracy per router and reference row (columns: the settings, fewest options first):
    the routers' seed mean +- std; the TF-IDF baseline and the probes (deterministic) with the
    number of training rows they saw."""
    lines = ["| router or reference | " + " | ".join(SUMMARY_SETTINGS) + " |",
             "|---|" + "---|" * len(SUMMARY_SETTINGS)]
    by_card: dict[str, dict[str, dict]] = {}
    layers: dict[str, set[int]] = {}
    cards: dict[tuple, set[str]] = {}
    for r in rows:
        layers.setdefault(f"{r['router']} on {r['model']}", set()).add(r["routing_layer"])
        cards.setdefault((r["router"], r["model"], r["routing_layer"]), set()).add(r.get("card"))
    for r in rows:  # cards of one router and model at several layers: one row per layer
        name = f"{r['router']} on {r['model']}"
        if len(layers[name]) > 1:
            name += f" layer {r['routing_layer']}"
        if len(cards[(r["router"], r["model"], r["routing_layer"])]) > 1:  # and per card
            name += f" ({r['card']})"
        by_card.setdefault(name, {})[r["setting"]] = r
    for name, found in by_card.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{100 * found[s]['accuracy_mean']:.1f} +- {100 * found[s]['accuracy_std']:.1f}%"
            if s in found else "-" for s in SUMMARY_SETTINGS) + " |")
    by_ref: dict[str, dict[str, dict]] = {}
    for b in baselines:
        label = ("TF-IDF + logistic regression, " + SAMPLE_TEXT[b["sample"]]
                 if b["method"] == "tfidf_logreg" else
                 "linear probe, " + b["method"].removeprefix("probe_").replace("_L", " layer "))
        by_ref.setdefault(label, {})[b["setting"]] = b
    for name, found in by_ref.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{100 * found[s]['accuracy']:.1f}% ({found[s]['num_train']:,})"
            if s in found else "-" for s in SUMMARY_SETTINGS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = None
    if "--train" in argv:
        at = argv.index("--train")
        argv, train_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=Path, default=Path("scenarios/router_cards"))
    parser.add_argument("--out", type=Path, default=Path("out/bench/routers.json"))
    parser.add_argument("--baselines", type=Path, default=Path("data/routers/baselines.json"),
                        help="reference rows (python -m engine_ext.routers.baselines)")
    args = parser.parse_args(argv)
    if train_args is not None:
        from engine_ext.routers.train import main as train

        train(train_args + ["--cards", str(args.cards)])
    cards = [load_router_card(p) for p in sorted(args.cards.glob("*.json"))]
    if not cards:
        print(f"no router cards in {args.cards}; run with --train", file=sys.stderr)
        return 2
    rows = [row for c in cards for row in card_rows(c)]
    regimes = [row for c in cards for row in regime_rows(c)]
    baselines = (json.loads(args.baselines.read_text())["rows"]
                 if args.baselines.exists() else [])
    text = ("Test accuracy per setting (routers: mean +- std over their seeds; references: "
            "one deterministic fit, training rows in brackets):\n"
            + summary_table(rows, baselines) + "\n\n" + table(rows))
    if regimes:
        text += "\n\nMoL2 training regimes (test accuracy):\n" + regime_table(regimes)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"routers": rows, "regimes": regimes,
                                        "references": baselines}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(text + "\n")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
