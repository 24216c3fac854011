"""Drive every softmax kernel path on small inputs, for compute-sanitizer.

Usage: ``compute-sanitizer --tool memcheck python tools/sanitize.py`` (also racecheck).
Exits non-zero if any result is wrong, so a sanitizer run also checks correctness.
"""

from __future__ import annotations

import sys

import cupy
import ml_dtypes
import numpy as np

import cunorm
from cunorm import _dispatch


def main() -> int:
    bad = 0
    rng = np.random.default_rng(0)
    cases = [(3, 5), (5, 33), (7, 1000), (3, 1537), (2, 3000), (2, 20001), (2, 70001)]
    for dt in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
        for rows, cols in cases:
            xh = rng.standard_normal((rows, cols)).astype(dt)
            x = cupy.asarray(xh)
            ref = np.exp(xh.astype(np.float64) - xh.astype(np.float64).max(-1, keepdims=True))
            ref /= ref.sum(-1, keepdims=True)
            for path in _dispatch.ROW_PATHS:
                for fn in (cunorm.softmax, cunorm.log_softmax):
                    try:
                        with _dispatch.force_path(path):
                            y = fn(x)
                    except ValueError:
                        continue
                    yv = cupy.asnumpy(y).astype(np.float64)
                    yv = np.exp(yv) if fn is cunorm.log_softmax else yv
                    if not np.allclose(yv, ref, atol=2e-2):
                        print(f"WRONG {fn.__name__} {path} {np.dtype(dt).name} {rows}x{cols}")
                        bad += 1
        for shape in [(2, 9, 7), (3, 40, 64), (2, 4096, 64)]:
            x = cupy.asarray(rng.standard_normal(shape).astype(dt))
            for path in ("strided-cached", "strided"):
                with _dispatch.force_path(path):
                    y = cunorm.softmax(x, axis=1)
                s = cupy.asnumpy(y.astype(np.float64).sum(1))
                if not np.allclose(s, 1, atol=2e-2):
                    print(f"WRONG strided {path} {np.dtype(dt).name} {shape}")
                    bad += 1
    cupy.cuda.Device().synchronize()
    print(f"sanitize driver: {bad} wrong results")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
