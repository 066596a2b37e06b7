"""Causal encoder-decoder model with a shared global KV and bounded replay."""
