"""Pooled SmolLM2 states of every layer, computed once per text and cached on disk.

The probe sweep (`probe_layers`) asks which layer and which pooling carry a routing label. One
pass over a text gives every layer's output at once, so each text is run once through all 30
decoder layers with the routers' own code path (`DecoderOnlyEngine._run_layers`, one layer at a
time: the same numbers `states.pooled_states` gives at its route layer), and two poolings of
each layer are kept:

* `mean`: the mean over the turn's tokens (what MoL2 and Contextual MoL read today);
* `last`: the state of the turn's last token (what a causal model has summarised by then);
* `max`: the per-dimension maximum over the turn's tokens (a keyword anywhere in the turn).

Row 0 of a layer axis is the token embeddings, row i + 1 the output of decoder layer i. A cache
may stop after `num_layers` decoder layers (a router reading layers up to L needs no more, and
the pass costs in proportion). The cache is a folder of chunks (`chunk_<digest>.npz`: the
texts and float32 arrays [layers + 1, n, D] per pooling); a text is looked up by content, so
splits that share texts (a 30-per-class sample inside the whole training split) share their
rows, and an interrupted pass resumes at the next chunk.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine_ext.routing import pad_token_lists

POOLINGS = ("mean", "last", "max")
MAX_LAYER = 9
"""The deepest decoder layer cached: the single-layer sweep peaks at layers 8-9 on CLINC150
(docs/router_probe_layers.md), so a router there needs nothing deeper."""
DEFAULT_CACHE = Path("out/routers/layers_l9")


@dataclass(frozen=True)
class FeatureSpec:
    """Which cached states a router head reads, concatenated: layers (-1: the token
    embeddings, i: the output of decoder layer i) x poolings."""

    layers: tuple[int, ...]
    poolings: tuple[str, ...] = ("mean",)

    def __post_init__(self) -> None:
        bad = [p for p in self.poolings if p not in POOLINGS]
        if bad or not self.poolings:
            raise ValueError(f"poolings {self.poolings!r}: allowed {POOLINGS}")
        if not self.layers or min(self.layers) < -1:
            raise ValueError(f"layers {self.layers!r}: at least one, each >= -1")

    @property
    def route_layer(self) -> int:
        """The layer the router must wait for: the deepest it reads."""
        return max(self.layers)

    @property
    def label(self) -> str:
        """'L-1,0,2 mean+max'."""
        return "L" + ",".join(map(str, self.layers)) + " " + "+".join(self.poolings)


def features(cache: LayerCache, texts, spec: FeatureSpec) -> np.ndarray:
    """The spec's states of every text, side by side: [N, len(layers) * len(poolings) * D]
    (pooling-major, then layer in the spec's order)."""
    if cache.num_layers is not None and spec.route_layer >= cache.num_layers:
        raise ValueError(f"{spec.label}: the cache {cache.folder} stops after decoder layer "
                         f"{cache.num_layers - 1}")
    rows = [layer + 1 for layer in spec.layers]
    parts = [cache.states(texts, pooling, rows) for pooling in spec.poolings]  # [R, N, D] each
    stacked = np.concatenate(parts, axis=0)  # [P * R, N, D]
    return np.ascontiguousarray(stacked.transpose(1, 0, 2).reshape(len(texts), -1))


CHUNK = 250
"""Texts per cache file (what an interrupted pass loses at most)."""


def pool(h: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every pooling of right-padded states h [B, T, D] with mask [B, T] -> {name: [B, D]}."""
    weights = mask.to(h.dtype).unsqueeze(-1)  # [B, T, 1]
    mean = (h * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    last_pos = mask.long().sum(1).clamp(min=1) - 1  # [B]
    last = h[torch.arange(h.shape[0]), last_pos]
    peak = h.masked_fill(weights == 0, float("-inf")).amax(1)  # pads never win
    return {"mean": mean, "last": last, "max": peak}


@torch.no_grad()
def all_layer_states(engine, tokens: torch.Tensor, num_layers: int | None = None
                     ) -> list[torch.Tensor]:
    """The token embeddings and the output of the first `num_layers` decoder layers (all when
    None) of tokens [B, T]: a list of [B, T, D], the routers' own code path
    (`DecoderOnlyEngine._run_layers`, one layer at a time)."""
    cache = engine.new_cache(tokens.shape[0])
    positions = torch.arange(tokens.shape[1])
    h = engine.hf.model.embed_tokens(tokens)  # [B, T, D]
    found = [h]
    for idx in range(len(engine.layers) if num_layers is None else num_layers):
        h = engine._run_layers(h, cache, idx, idx + 1, positions)
        found.append(h)
    return found


@torch.no_grad()
def all_layer_pooled(engine, ids: list[list[int]], num_layers: int | None = None
                     ) -> dict[str, torch.Tensor]:
    """Pooled states of the embeddings and the first `num_layers` decoder layers (all when
    None) of right-padded sequences: {pooling: [num_layers + 1, B, D]}.

    Right padding is exact for a causal model: a real position never attends to a later pad.
    """
    tokens, mask = pad_token_lists(ids)
    found = [pool(h, mask) for h in all_layer_states(engine, tokens, num_layers)]
    return {name: torch.stack([f[name] for f in found]) for name in POOLINGS}


def query_from_states(states: list, spec):
    """The spec's features from unpadded layer states (row 0 the embeddings, i + 1 layer i;
    each [B, T, D], one turn per row, as the engine holds them) -> [B, width], in
    `probe_features.features`' order: what the decision computes in the engine."""
    reduce = {"mean": lambda h: h.mean(1), "max": lambda h: h.amax(1),
              "last": lambda h: h[:, -1]}
    return torch.cat([reduce[p](states[layer + 1]) for p in spec.poolings
                      for layer in spec.layers], -1)


def _digest(texts: list[str], num_layers: int | None) -> str:
    tag = "all-layers|v1" if num_layers is None else f"layers-{num_layers}|v2"
    digest = hashlib.sha256(f"smollm2-135m-instruct|{tag}".encode())
    for t in texts:
        digest.update(t.encode() + b"\x1f")
    return digest.hexdigest()[:20]


class LayerCache:
    """Every layer's pooled states of the texts it has seen, by text (`num_layers`: the decoder
    layers a fill runs, all when None; a folder holds one depth)."""

    def __init__(self, folder: Path, num_layers: int | None = None) -> None:
        self.folder, self.num_layers = Path(folder), num_layers
        self._where: dict[str, tuple[Path, int]] = {}
        for path in sorted(self.folder.glob("chunk_*.npz")):
            with np.load(path) as f:
                for row, text in enumerate(f["texts"].tolist()):
                    self._where.setdefault(text, (path, row))

    def missing(self, texts) -> list[str]:
        """Texts not cached yet, each once, in first-seen order."""
        return list(dict.fromkeys(t for t in texts if t not in self._where))

    def fill(self, texts, engine, tokenize, batch: int = 32, log=print) -> int:
        """Run the texts not cached yet through every layer, CHUNK texts per file; returns how
        many were computed."""
        todo = self.missing(texts)
        for start in range(0, len(todo), CHUNK):
            part = todo[start : start + CHUNK]
            self._write(part, self._compute(part, engine, tokenize, batch, self.num_layers))
            log(f"layer cache: {min(start + CHUNK, len(todo))}/{len(todo)} texts", flush=True)
        return len(todo)

    @staticmethod
    def _compute(texts: list[str], engine, tokenize, batch: int, num_layers: int | None
                 ) -> dict[str, np.ndarray]:
        ids = [tokenize(t) for t in texts]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: dict[str, np.ndarray] = {}
        for start in range(0, len(ids), batch):
            pick = order[start : start + batch]
            for name, v in all_layer_pooled(engine, [ids[i] for i in pick], num_layers).items():
                if name not in out:
                    out[name] = np.empty((v.shape[0], len(ids), v.shape[2]), np.float32)
                out[name][:, pick] = v.numpy()
        return out

    def _write(self, texts: list[str], arrays: dict[str, np.ndarray]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"chunk_{_digest(texts, self.num_layers)}.npz"
        tmp = path.with_name(f"tmp_{os.getpid()}_{path.name}")  # not matched by chunk_*
        np.savez(tmp, texts=np.array(texts), **arrays)
        tmp.replace(path)
        for row, text in enumerate(texts):
            self._where.setdefault(text, (path, row))

    def states(self, texts, pooling: str, rows: list[int] | None = None) -> np.ndarray:
        """Cached states of the texts [layers + 1, N, D] for one pooling, or only the layer
        axis `rows` (row 0 the embeddings, i + 1 layer i) [len(rows), N, D] (KeyError if a text
        is missing)."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r}: allowed {POOLINGS}")
        lost = self.missing(texts)
        if lost:
            raise KeyError(f"{len(lost)} texts not in the layer cache {self.folder}, e.g. "
                           f"{lost[0]!r}")
        by_file: dict[Path, list[tuple[int, int]]] = {}
        for i, t in enumerate(texts):
            path, row = self._where[t]
            by_file.setdefault(path, []).append((i, row))
        out = None
        for path, pairs in by_file.items():
            with np.load(path) as f:
                block = f[pooling] if rows is None else f[pooling][rows]
            if out is None:
                out = np.empty((block.shape[0], len(texts), block.shape[2]), np.float32)
            out[:, [i for i, _ in pairs]] = block[:, [r for _, r in pairs]]
        return out
