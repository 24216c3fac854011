"""Long-row profiles of tools/gpu_profile.py (rows of 65536 to 262144 columns, the cluster and
uncached paths): dispatcher variants, and one launch per kernel for ncu."""

from __future__ import annotations

import os

import cupy
from profile_common import _build_with, _row_case, block_variants

# (op, dtype, cols, rows): the benchmark's long-row cells (about 400 MB of 16-bit input), and
# the norms' cells of the same sizes.
LONG_CASES = [("softmax", dt, cols, rows) for dt in ("float16", "bfloat16", "float32")
              for cols, rows in ((65536, 3072), (131072, 1536), (262144, 768))]
LONG_CASES += [("layer_norm", "float16", 65536, 3072), ("layer_norm", "float16", 262144, 768),
               ("layer_norm", "float32", 65536, 3072), ("layer_norm", "float32", 262144, 768),
               ("rms_norm", "bfloat16", 131072, 1536)]

# (name, dispatcher constants, forced path)
LONG_VARIANTS = [("default", {}, None),
                 ("cluster-b128", {"BLOCK_SIZES": (128,)}, "cluster"),
                 ("cluster-b256", {"BLOCK_SIZES": (256,)}, "cluster"),
                 ("cluster-b512", {"BLOCK_SIZES": (512,)}, "cluster"),
                 ("slice16k", {"SMEM_SLICE_PREFERRED_BYTES": 16 * 1024}, "cluster"),
                 ("slice64k", {"SMEM_SLICE_PREFERRED_BYTES": 64 * 1024}, "cluster"),
                 ("uncached-64k", {"UNCACHED_SLICE_MAX_BYTES": 64 * 1024}, "uncached"),
                 ("uncached-128k", {}, "uncached"),
                 ("uncached-256k", {"UNCACHED_SLICE_MAX_BYTES": 256 * 1024}, "uncached")]


def long_row_variants() -> None:
    """GB/s of LONG_CASES on each LONG_VARIANTS setting (forced path, dispatcher constants)."""
    block_variants(LONG_CASES, LONG_VARIANTS)


# One launch each for ncu: a cluster of 4 x 32 KB slices, one of 8 x 64 KB, uncached clusters.
KERNEL_CASES = [("softmax", "float16", 65536, 3072), ("softmax", "float16", 262144, 768),
                ("softmax", "float32", 262144, 768), ("layer_norm", "float32", 262144, 768)]


def long_row_kernels() -> None:
    """One call per KERNEL_CASES case after a warm-up call (extra compile options, e.g. -D
    macros, from the environment variable CUNORM_PROFILE_OPTIONS)."""
    options = tuple(os.environ.get("CUNORM_PROFILE_OPTIONS", "").split())
    if options:
        _build_with(options)
    for op, dt, cols, rows in KERNEL_CASES:
        y, fn, args = _row_case(op, dt, rows, cols)
        fn(*args, out=y)
        cupy.cuda.Device().synchronize()
        fn(*args, out=y)
        cupy.cuda.Device().synchronize()
