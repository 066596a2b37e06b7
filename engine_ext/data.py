"""Real text per domain, byte-tokenized, for training and evaluating the small CED model.

Domains and where their text comes from (all installed with Python and Debian, or in data/text):
* code: the Python standard library source;
* legal: license texts under /usr/share/common-licenses;
* prose: the Python documentation shipped with the interpreter (`pydoc_data.topics`);
* chat: user utterances of CLINC150 and BANKING77, one per line: the full copies under
  $MOLCAP_DATA_DIR/text when that is set (as for the traces), else the repository's slices in
  data/text.
"""

from __future__ import annotations

import csv
import json
import os
import sysconfig
from pathlib import Path

import torch

BOS, EOS, SEP, PAD = 256, 257, 258, 259
VOCAB_SIZE = 260
DOMAINS = ("chat", "code", "legal", "prose")


REPO_TEXT_DIR = Path(__file__).resolve().parents[1] / "data" / "text"
"""Small slices of the labelled text with their licences (enough for the tests)."""


DATA_DIR_ENV = "MOLCAP_DATA_DIR"
"""The same setting that points the traces at their full copies (data/README.md)."""


def full_text_dir() -> Path | None:
    """The full copies of the labelled text ($MOLCAP_DATA_DIR/text), or None when not set."""
    root = os.environ.get(DATA_DIR_ENV)
    return Path(root) / "text" if root else None


def default_text_dir() -> Path:
    """The full text when $MOLCAP_DATA_DIR points at it, else the repository's slices."""
    full = full_text_dir()
    has_full = full is not None and (full / "clinc150" / "data_full.json").exists()
    return full if has_full else REPO_TEXT_DIR


def encode(text: str) -> list[int]:
    """UTF-8 bytes as token ids."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Inverse of `encode`, dropping special ids."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _code_text(max_bytes: int) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(errors="replace")
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "\n".join(parts)


def _legal_text(max_bytes: int) -> str:
    root = Path("/usr/share/common-licenses")
    files = sorted(p for p in root.iterdir() if p.is_file()) if root.exists() else []
    return "\n\n".join(p.read_text(errors="replace") for p in files)[:max_bytes]


def _prose_text(max_bytes: int) -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:max_bytes]


def _chat_text(max_bytes: int) -> str:
    root = default_text_dir()
    lines = []
    for name in ("data_full.json", "data_slice.json"):
        clinc = root / "clinc150" / name
        if clinc.exists():
            lines += [u for u, _ in json.loads(clinc.read_text())["train"]]
            break
    banking = root / "banking77" / "train.csv"
    if banking.exists():
        with banking.open() as f:
            lines += [row["text"] for row in csv.DictReader(f)]
    return "\n".join(lines)[:max_bytes]


def domain_text(domain: str, max_bytes: int = 400_000) -> str:
    """Raw text of one domain (deterministic: files in sorted order)."""
    loaders = {"code": _code_text, "legal": _legal_text, "prose": _prose_text, "chat": _chat_text}
    text = loaders[domain](max_bytes)
    if len(text) < 10_000:
        raise FileNotFoundError(f"domain {domain!r}: only {len(text)} bytes of text found")
    return text


def domain_splits(domain: str, max_bytes: int = 400_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte ids [N] of a domain, split 90/10 into train and held-out."""
    ids = torch.tensor(encode(domain_text(domain, max_bytes)), dtype=torch.long)
    cut = int(len(ids) * 0.9)
    return ids[:cut], ids[cut:]


def sample_windows(ids: torch.Tensor, batch: int, length: int,
                   generator: torch.Generator) -> torch.Tensor:
    """`batch` random windows of `length + 1` ids [batch, length + 1] (inputs plus next token)."""
    starts = torch.randint(0, len(ids) - length - 1, (batch,), generator=generator)
    return torch.stack([ids[s : s + length + 1] for s in starts.tolist()])
