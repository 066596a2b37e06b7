"""Hardware and model catalogue: named GPUs and model architectures, each number sourced."""
