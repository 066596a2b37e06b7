"""Fixtures for the engine_ext tests (helpers live in engine_helpers.py)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import make_engine

from engine_ext.ced.engine import CEDEngine


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # These models are tiny: a second intra-op thread buys nothing, and on a machine with few
    # free cores two OpenMP threads spin waiting for each other (a test runs many times slower).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def engine() -> CEDEngine:
    return make_engine()
