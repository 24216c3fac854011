"""Host overhead and per-kernel profiles for the softmax paths (run on the GPU machine).

``python tools/profile.py overhead`` prints the host time per call of a small softmax;
``ncu ... python tools/profile.py kernels`` runs one launch of each representative shape.
"""

from __future__ import annotations

import sys
import time

import cupy
import numpy as np

import cunorm

CASES = [("float16", 1024, 49152), ("float16", 8192, 24576), ("float32", 4096, 49152),
         ("float32", 32768, 6144), ("float16", 131072, 1536), ("float32", 65536, 3072)]


def overhead(n: int = 10_000) -> None:
    x = cupy.random.standard_normal((8, 128), dtype=np.float32)
    for _ in range(200):
        cunorm.softmax(x)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        cunorm.softmax(x)
    t1 = time.perf_counter()
    cupy.cuda.Device().synchronize()
    print(f"host time per cunorm.softmax((8,128) float32): {(t1 - t0) / n * 1e6:.2f} us")
    try:
        import torch

        t = torch.from_dlpack(x)
        for _ in range(200):
            torch.softmax(t, -1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            torch.softmax(t, -1)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"host time per torch.softmax (same): {(t1 - t0) / n * 1e6:.2f} us")
    except ImportError:
        pass


def kernels() -> None:
    for dt, cols, rows in CASES:
        x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
        y = cupy.empty_like(x)
        cunorm.softmax(x, out=y)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    {"overhead": overhead, "kernels": kernels}[sys.argv[1]]()
