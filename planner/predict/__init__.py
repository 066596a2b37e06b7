"""How the planner predicts a strategy's numbers: by simulating it, or analytically."""
