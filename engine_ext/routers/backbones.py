"""The frozen models the routers read: SmolLM2 up to layer k, and the small CED model trained here.

A backbone is seen as: text -> token ids, padded ids -> routing-layer states (one pass, nothing
kept), ids -> token embeddings (MoL2's option side), and cached mean-pooled states of texts (the
query of MoL2). Both models are causal up to the routing layer, so right padding is exact: a real
position never attends to a later pad.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import torch

from engine_ext.data import encode
from engine_ext.routers.contextual import StateFn
from engine_ext.routing import mean_pool, pad_token_lists

CED_MODEL_NAME = "ced-small"
"""The catalogue name (sim.hardware.catalogue) of engine_ext's small CED preset that
engine_ext.train
trains: router cards on it plug into contextual_mol and mol2 strategies on that model."""
CED_CHUNK = 256
"""Chunk of the CED routing pass: the local attention is computed densely per chunk, so one
chunk of a 2,000-byte Contextual-MoL pass (150 option names) costs ~7x the chunked pass."""


POOLED_CHUNK = 500
"""Texts per cached file of pooled states."""


class Backbone:
    """A frozen model as the routers see it."""

    def __init__(self, name: str, tokenize: Callable[[str], list[int]], state_fn: StateFn,
                 embed: Callable[[torch.Tensor], torch.Tensor], d_model: int, layer: int,
                 stamp: str, cache_dir: Path) -> None:
        self.name, self.tokenize, self.state_fn, self.embed = name, tokenize, state_fn, embed
        self.d_model, self.layer, self.stamp, self.cache_dir = d_model, layer, stamp, cache_dir
        self.d_query = d_model
        """Width of the query `pooled` returns (a feature set is wider than one state)."""

    @torch.no_grad()
    def pooled(self, texts: tuple[str, ...], batch: int = 32) -> torch.Tensor:
        """Mean-pooled routing-layer state per text [N, D], batched by length, disk-cached in
        chunks of POOLED_CHUNK texts (a pass over a full training split resumes where it
        stopped)."""
        return torch.cat([self._pooled_chunk(texts[i : i + POOLED_CHUNK], batch)
                          for i in range(0, len(texts), POOLED_CHUNK)])

    def _pooled_chunk(self, texts: tuple[str, ...], batch: int) -> torch.Tensor:
        digest = hashlib.sha256(f"{self.stamp}|k={self.layer}".encode())
        for t in texts:
            digest.update(t.encode() + b"\x1f")
        path = self.cache_dir / f"pooled_{digest.hexdigest()[:20]}.pt"
        if path.exists():
            return torch.load(path)
        ids = [self.tokenize(t) for t in texts]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty(len(ids), self.d_model)
        for start in range(0, len(ids), batch):
            pick = order[start : start + batch]
            tokens, mask = pad_token_lists([ids[i] for i in pick])
            out[pick] = mean_pool(self.state_fn(tokens), mask)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes may write the same states
        torch.save(out, tmp)
        tmp.replace(path)
        return out

    @torch.no_grad()
    def option_embeddings(self, descriptions: tuple[str, ...]
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token embeddings of each description [O, L, D] and the mask [O, L]."""
        tokens, mask = pad_token_lists([self.tokenize(d) for d in descriptions])
        return self.embed(tokens), mask


class LayerCacheBackbone(Backbone):
    """SmolLM2 read at any layer and pooling: queries come from the all-layer cache of
    `layer_cache` (filled on demand with the same pass), the rest from `base` (an engine whose
    route layer is `layer`, so `state_fn` stops there)."""

    def __init__(self, base: Backbone, cache, pooling: str) -> None:
        super().__init__(base.name, base.tokenize, base.state_fn, base.embed, base.d_model,
                         base.layer, base.stamp, base.cache_dir)
        self.cache, self.pooling, self._fill_engine = cache, pooling, None

    def with_engine(self, engine) -> LayerCacheBackbone:
        """Texts missing from the cache are run through this engine's layers."""
        self._fill_engine = engine
        return self

    @torch.no_grad()
    def pooled(self, texts: tuple[str, ...], batch: int = 32) -> torch.Tensor:
        """The `pooling` state of layer `layer` per text [N, D]."""
        if self.cache.missing(texts):
            if self._fill_engine is None:
                raise KeyError(f"texts missing from {self.cache.folder} and no engine to run")
            self.cache.fill(texts, self._fill_engine, self.tokenize, batch)
        return torch.from_numpy(self.cache.states(texts, self.pooling, [self.layer + 1])[0])


class FeatureBackbone(Backbone):
    """SmolLM2 read through a feature set (`probe_features.FeatureSpec`): the query is the
    concatenation of several layers' pooled states up to the spec's deepest layer, read from a
    filled `layer_cache` (`python -m engine_ext.routers.probe_layers --features --fill-only`)."""

    def __init__(self, base: Backbone, cache, spec) -> None:
        super().__init__(base.name, base.tokenize, base.state_fn, base.embed, base.d_model,
                         spec.route_layer, base.stamp, base.cache_dir)
        self.cache, self.spec, self.engine = cache, spec, None
        self.d_query = len(spec.layers) * len(spec.poolings) * base.d_model
        self.pooling = "+".join(spec.poolings)

    def with_engine(self, engine) -> FeatureBackbone:
        """Texts missing from the cache are run through this engine's layers (and the decision
        times are measured on it)."""
        self.engine = engine
        return self

    @torch.no_grad()
    def pooled(self, texts: tuple[str, ...], batch: int = 32) -> torch.Tensor:
        """The spec's features per text [N, d_query]."""
        from engine_ext.routers.layer_cache import features

        if self.cache.missing(texts) and self.engine is not None:
            self.cache.fill(texts, self.engine, self.tokenize, batch)
        return torch.from_numpy(features(self.cache, texts, self.spec))


def smollm2_backbone(engine, tokenizer) -> Backbone:
    """SmolLM2 up to layer k (layers above are not run); states cached as `states` caches them."""
    from engine_ext.routers.states import MODEL_NAME, STATE_CACHE, turn_ids

    def state_fn(tokens: torch.Tensor) -> torch.Tensor:
        return engine.prefill_shared(engine.new_cache(tokens.shape[0]), tokens)

    return Backbone(MODEL_NAME, lambda t: turn_ids(tokenizer, t), state_fn,
                    engine.hf.model.embed_tokens, engine.cfg.hidden_size, engine.route_layer,
                    "smollm2-135m-instruct", STATE_CACHE)


def ced_backbone(ced_engine, model_file: Path, cache_dir: Path) -> Backbone:
    """The trained byte-level CED model; states are its encoder output (the H19 of its layout),
    computed by the encoder alone (the decoder layers are not run), in chunks of CED_CHUNK."""
    cfg = ced_engine.model.config
    stat = model_file.stat()
    def state_fn(tokens: torch.Tensor) -> torch.Tensor:
        return ced_engine.encode(tokens, chunk_size=CED_CHUNK)

    return Backbone(CED_MODEL_NAME, encode, state_fn, ced_engine.model.model.embed_tokens,
                    cfg.d_model, cfg.first_decoder_layer - 1,
                    f"ced:{stat.st_size}:{stat.st_mtime_ns}", cache_dir)
