"""Fixtures for the engine_ext tests (helpers live in engine_helpers.py)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import make_engine

from engine_ext.ced.engine import CEDEngine


@pytest.fixture(autouse=True)
def _deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def engine() -> CEDEngine:
    return make_engine()
