"""Time a fresh process's first and second softmax call (cold or warm kernel cache).

Usage: ``python tools/first_call.py`` (run twice: the first run fills CuPy's disk cache).
"""

from __future__ import annotations

import time

import cupy
import numpy as np

import cunorm

x = cupy.asarray(np.random.default_rng(0).random((4096, 1000), dtype=np.float32))
dev = cupy.cuda.Device()
dev.synchronize()
t0 = time.perf_counter()
cunorm.softmax(x)
dev.synchronize()
t1 = time.perf_counter()
cunorm.softmax(x)
dev.synchronize()
t2 = time.perf_counter()
print(f"first call {1e3 * (t1 - t0):.1f} ms, second {1e3 * (t2 - t1):.3f} ms")
