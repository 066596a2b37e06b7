"""Serving strategies in the simulator: the hops a turn issues, where adapters sit and what KV they
share, and router cards."""
