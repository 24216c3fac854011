"""Shared test setup: make a source checkout importable and give tests a fresh, reported RNG.

Markers (``gpu``, ``nvcc``, ``slow``) are registered in ``pyproject.toml``, not here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

# Running ``pytest`` (not ``python -m pytest``) from a checkout without cunorm installed.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("cunorm") is None:
    sys.path.insert(0, str(_ROOT))


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh random generator per test; its seed is printed (shown on failure) and can be
    pinned with ``CUNORM_TEST_SEED`` to replay a failure."""
    seed = int(os.environ.get("CUNORM_TEST_SEED", np.random.SeedSequence().entropy % 2**63))
    print(f"rng seed: {seed} (replay with CUNORM_TEST_SEED={seed})")
    return np.random.default_rng(seed)
