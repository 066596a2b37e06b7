"""Puts tests/ on the import path, so every test folder shares `sim_configs` (small ready-made
simulator configs, also used by bench/)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
