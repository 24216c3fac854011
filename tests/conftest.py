"""Shared test setup: make a source checkout importable and give tests a fresh, reported RNG.

Markers (``gpu``, ``nvcc``, ``slow``) are registered in ``pyproject.toml``, not here. Tests
marked ``slow`` hold arrays of 13-20 GB, so they run one at a time across pytest-xdist workers.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

# JAX takes 75% of a GPU's memory when its backend starts unless told not to: a worker whose
# test touched JAX then held 105 GB of an H200, and the other workers' tests ran out of
# memory. Set before any test imports jax (some tests also set it, for when run alone).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

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


@pytest.fixture(autouse=True)
def _one_large_array_test_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Serialize the ``slow`` tests across xdist workers with a file lock: each holds up to
    20 GB, and several at once ran an 80 GB H100 out of memory (session 64's GPU suite).
    Before the lock passes on, the test's arrays go back to the device: a failed test's
    frames (kept by pytest as ``sys.last_traceback``) are cleared and CuPy's pool emptied."""
    if request.node.get_closest_marker("slow") is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (the GPU suite runs on Linux)
        yield
        return
    lock_path = Path(tempfile.gettempdir()) / "cunorm-tests-large-arrays.lock"
    # read-only is enough for flock, so a lock file another user created serves too
    fd = os.open(lock_path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if "cupy" in sys.modules:
            if getattr(sys, "last_traceback", None) is not None:
                traceback.clear_frames(sys.last_traceback)
            gc.collect()
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
        os.close(fd)  # releases the lock
