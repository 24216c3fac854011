"""Shared preamble of the GPU test modules (``from _gpu import ...``): CuPy or a module skip,
the ``gpu`` marker with a clear skip reason when no device is present, the four dtypes and
DESIGN section 3's error bounds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="GPU tests need CuPy")
try:
    N_GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # CuPy installed, no driver / no device
    N_GPUS = 0
#: assign to a test module's ``pytestmark``
GPU_MARKS = [pytest.mark.gpu,
             pytest.mark.skipif(N_GPUS == 0, reason="no CUDA GPU: GPU tests not run")]

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
#: DESIGN section 3: relative max-norm error per row against float64
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-12}


def row_errors(y, ref: np.ndarray) -> np.ndarray:
    """DESIGN section 3's measure for each row (the last axis) of ``y`` (a NumPy or CuPy
    array, or anything ``np.asarray`` takes): the largest ``|y - ref|`` over the row's
    largest ``|ref|``."""
    y = cupy.asnumpy(y) if isinstance(y, cupy.ndarray) else y
    y = np.asarray(y, np.float64).reshape(-1, ref.shape[-1])
    ref = ref.reshape(-1, ref.shape[-1])
    num = np.abs(y - ref).max(axis=-1, initial=0.0)
    den = np.abs(ref).max(axis=-1, initial=0.0)
    return num / np.maximum(den, 1e-300)


def spy_launches(monkeypatch) -> list[tuple[str, tuple, int]]:
    """Record every prepared kernel launch (``cunorm._driver_launch.KernelLaunch.fire``) as
    (kernel name, grid, block and shared memory, stream handle) and let it run."""
    from cunorm import _driver_launch

    launched = []
    fire = _driver_launch.KernelLaunch.fire

    def spy(self, stream, pointers, values=()):
        launched.append((self._name, self._dims, stream))
        return fire(self, stream, pointers, values)

    monkeypatch.setattr(_driver_launch.KernelLaunch, "fire", spy)
    return launched


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Inside, every CuPy allocation comes back filled with 0xFF bytes: NaN in each float
    dtype. An output element that no kernel writes then reads NaN, where a fresh array
    would hold whatever its recycled pool block last held (often the previous call's
    result, which a comparison of two calls cannot tell from a written one)."""
    pool = cupy.get_default_memory_pool()

    def malloc(size: int):
        mem = pool.malloc(size)
        if size:
            cupy.cuda.runtime.memsetAsync(mem.ptr, 0xFF, size,
                                          cupy.cuda.get_current_stream().ptr)
        return mem

    with cupy.cuda.using_allocator(malloc):  # this thread's, restored on the way out
        yield
