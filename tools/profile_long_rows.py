"""Long-row profiles of tools/gpu_profile.py (rows of 65536 to 262144 columns, the cluster and
uncached paths): dispatcher variants, and one launch per kernel for ncu."""

from __future__ import annotations

import functools
import os

import cupy
import numpy as np
from profile_common import (
    _affine_case,
    _build_with,
    _call_case,
    _planned,
    _row_case,
    _warm_up,
    block_variants,
)

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


# layer_norm's rows of 32768+ columns since its 16-bit rows sum once (kOnePass): as dispatched
# (16-bit 32768: a cluster of 2 x 32 KB, LAYER_NORM_SMEM_MAX_COLS), on one block caching the
# whole row as rms_norm does (16-bit up to 49152 columns, float32 up to 32768), on clusters
# preferring 64 KB slices, and on the uncached path; rms_norm at 32768 for reference.
# (op, dtype, cols, rows): the benchmark's cells.
LN_SLICE_CASES = [("layer_norm", dt, 32768, 49152) for dt in ("float16", "bfloat16", "float32")]
LN_SLICE_CASES += [("rms_norm", "bfloat16", 32768, 49152), ("layer_norm", "float16", 49152, 8192)]
LN_SLICE_CASES += [("layer_norm", dt, cols, rows) for dt in ("bfloat16", "float32")
                   for cols, rows in ((65536, 3072), (262144, 768))]
LN_SLICE_VARIANTS = [("default", {}, None),
                     ("one-block", {"LAYER_NORM_SMEM_MAX_COLS": {2: 49152, 4: 32768, 8: 12288}},
                      None),
                     ("slice64k", {"SMEM_SLICE_PREFERRED_BYTES": 64 * 1024}, "cluster"),
                     ("uncached", {}, "uncached")]


def ln_long_slices(rounds: int = 2) -> None:
    """GB/s of LN_SLICE_CASES on each LN_SLICE_VARIANTS setting, ``rounds`` times."""
    for _ in range(rounds):
        block_variants(LN_SLICE_CASES, LN_SLICE_VARIANTS)


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


# The norm cluster kernels' resident-block caps (cuda_src/norm.cu norm_cluster_blocks): the
# shipped counts against (512, 1) and every count of 3 or 4 forced, weight and bias for
# layer_norm, weight for rms_norm, and both with a residual ("res", bytes: x and r read, y and
# x + r written), rows = 201326592 / cols.
CLUSTER_BLOCK_CASES = [(op, dt, cols, p) for dt in ("float16", "bfloat16", "float32")
                       for cols in (32768, 65536, 131072, 262144)
                       for op, p in (("layer_norm", ""), ("rms_norm", ""), ("layer_norm", "res"),
                                     ("rms_norm", "res"))]
CLUSTER_BLOCK_VARIANTS = [("(512,1)", ("-DCUNORM_NORM_CLUSTER_BLOCKS=1",)), ("shipped", ()),
                          ("all-3", ("-DCUNORM_NORM_CLUSTER_BLOCKS=3",)),
                          ("all-4", ("-DCUNORM_NORM_CLUSTER_BLOCKS=4",))]


def cluster_blocks(rounds: int = 2) -> None:
    """GB/s of CLUSTER_BLOCK_CASES built as each CLUSTER_BLOCK_VARIANTS, builds interleaved
    over ``rounds`` rounds, with the plan's block size and the kernel's registers."""
    from triton.testing import do_bench

    _warm_up()
    for op, dt, cols, kind in CLUSTER_BLOCK_CASES:
        rows = 201326592 // cols
        y, fn, args = _affine_case(op, dt, rows, cols)
        if kind == "res":
            r = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
            nbytes, call = 4 * y.nbytes, functools.partial(fn, *args, residual=r)
        else:
            nbytes, call = 2 * y.nbytes, functools.partial(fn, *args, out=y)
        cells: dict[str, list[str]] = {}
        for _ in range(rounds):
            for name, opts in CLUSTER_BLOCK_VARIANTS:
                _build_with(opts)
                call()
                kern, block, _ = _planned(op)
                ms = do_bench(call, warmup=10, rep=50, return_mode="median")
                cells.setdefault(name, [f"{block}t/{kern.num_regs}r"]).append(
                    f"{nbytes / ms / 1e6:.0f}")
        print(f"{op:10s} {kind or 'param':5s} {dt:8s} {cols:6d} | " + "  ".join(
            f"{n}: {'/'.join(v[1:])} ({v[0]})" for n, v in cells.items()), flush=True)
        del y, args, call
        cupy.get_default_memory_pool().free_all_blocks()
    _build_with(())


# Rows of 4096-32768 columns on the uncached path (read twice, the second read from L2) with a
# block per row, as torch.compile's looped-reduction kernels run them at 4.26-4.31 TB/s (ncu,
# compile-long-kernels), built for 1-4 resident 512-thread blocks (CUNORM_UNCACHED_BLOCKS),
# against the dispatched plan.
UNCACHED_ROW_CASES = [("rms_norm", "float32", 4096), ("rms_norm", "float32", 8192),
                      ("rms_norm", "float32", 32768), ("rms_norm", "float16", 12288),
                      ("layer_norm", "float16", 16384), ("layer_norm", "float32", 8192),
                      ("softmax", "float16", 8192), ("softmax", "float32", 32768)]
UNCACHED_ROW_BUILDS = [("1blk", ()), ("2blk", ("-DCUNORM_UNCACHED_BLOCKS=2",)),
                       ("3blk", ("-DCUNORM_UNCACHED_BLOCKS=3",)),
                       ("4blk", ("-DCUNORM_UNCACHED_BLOCKS=4",))]


def uncached_rows(rows: int = 49152) -> None:
    """GB/s (padded event timer) of UNCACHED_ROW_CASES as dispatched and on the uncached path
    with one block per row in each UNCACHED_ROW_BUILDS build, with registers and local bytes."""
    import importlib
    from unittest import mock

    from cunorm import _dispatch
    from cunorm.bench.timing import CupyEventTimer, gbps

    # the modules (cunorm.softmax is also the name of the function)
    norm_module = importlib.import_module("cunorm.norm")
    softmax_module = importlib.import_module("cunorm.softmax")

    timer = CupyEventTimer(pad_us=100)
    per_row = mock.patch.multiple(norm_module, occupancy=lambda k, b, s: 1 << 20)
    per_row_sm = mock.patch.multiple(softmax_module, occupancy=lambda k, b, s: 1 << 20)
    for op, dt, cols in UNCACHED_ROW_CASES:
        y, fn, args = _row_case(op, dt, rows, cols)
        call = functools.partial(fn, *args, out=y)
        _build_with(())
        call()
        kern, block, _ = _planned(op)
        cells = [f"default {gbps(2 * y.nbytes, timer(call)):.0f} ({block}t/{kern.num_regs}r)"]
        for name, opts in UNCACHED_ROW_BUILDS:
            _build_with(opts)
            with per_row, per_row_sm, _dispatch.force_path("uncached"):
                _dispatch._drop_cached_plans()
                call()
                kern, block, _ = _planned(op)
                rate = gbps(2 * y.nbytes, timer(call))
            cells.append(f"{name} {rate:.0f} ({kern.num_regs}r/{kern.local_size_bytes}l)")
        print(f"{op:10s} {dt:8s} {cols:6d} | " + "  ".join(cells), flush=True)
        del y, args, call
        cupy.get_default_memory_pool().free_all_blocks()
    _build_with(())
    _dispatch._drop_cached_plans()


# Rows of 512 KB (16-bit 262144 columns, float32 131072), which 16 x 32 KB and 8 x 64 KB
# slices can both cache: the shipped plan, every op on a cluster of 16 first (the rule before
# NORM_PORTABLE_CLUSTER_ITEMSIZES), and on portable clusters only; residual cells count x and
# r read, y and x + r written.
CLUSTER_SIZE_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "layer_norm_residual",
                    "rms_norm_residual")
CLUSTER_SIZE_VARIANTS = [("shipped", {}), ("16-first", {"NORM_PORTABLE_CLUSTER_ITEMSIZES": ()}),
                         ("portable", {"ROW_CLUSTER_SIZES": (2, 4, 8)})]


def cluster_sizes(rounds: int = 2) -> None:
    """GB/s (padded event timer) of CLUSTER_SIZE_OPS on 512 KB rows under each
    CLUSTER_SIZE_VARIANTS setting, alternated ``rounds`` times, with each plan's cluster,
    block threads, slice and registers."""
    from cunorm import _dispatch
    from cunorm.bench.timing import CupyEventTimer, gbps

    timer = CupyEventTimer(pad_us=100)
    for op in CLUSTER_SIZE_OPS:
        base = op.removesuffix("_residual")
        for dt, cols, rows in (("float16", 262144, 768), ("bfloat16", 262144, 768),
                               ("float32", 131072, 1536)):
            y, call, nbytes = _call_case(op, dt, rows, cols)
            cells: dict[str, list[str]] = {}
            for _ in range(rounds):
                for name, consts in CLUSTER_SIZE_VARIANTS:
                    with _dispatch.override_constants(consts):
                        call()
                        kern, block, smem = _planned(base)
                        plan = (f"{cols * y.itemsize // smem} x {smem // 1024} KB, {block}t/"
                                f"{kern.num_regs}r")
                        cells.setdefault(name, [plan]).append(f"{gbps(nbytes, timer(call)):.0f}")
            print(f"{op:19s} {dt:8s} {cols:6d} | " + "  ".join(
                f"{n} {'/'.join(v[1:])} ({v[0]})" for n, v in cells.items()), flush=True)
            del y, call
            cupy.get_default_memory_pool().free_all_blocks()
