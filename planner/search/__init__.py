"""Capacity search under SLOs: the pure search and the per-strategy plan that drives it with the
simulator."""
