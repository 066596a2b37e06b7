"""Pure cost and memory models: what one engine step costs (time, bytes), from model shapes, GPU
specs and fitted coefficients."""
