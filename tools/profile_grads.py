"""Gradient profiles of tools/gpu_profile.py: the norm gradients' cluster path against the
paths it replaces or passes over, the holding kernels built without their L2 prefetch of
the next row and with it everywhere (cuda_src/grad.cu CUNORM_NORM_GRAD_PREFETCH), and the
softmax gradients' cluster path in its layouts against the block and uncached paths."""

from __future__ import annotations

import cupy
import numpy as np
from profile_common import _build_with

import cunorm
from cunorm import _dispatch, _grad_dispatch, norm_grad, softmax_grad
from cunorm._kernels import _KERNELS
from cunorm.bench.timing import CupyEventTimer, copy_bandwidth

# (dtype, cols): rows a block holds (3000-8192; 16-bit layer_norm 3000 on two 256-thread row
# groups a block), rows past a block (16384-32768)
CLUSTER_CASES = [(op, dt, cols) for op in _grad_dispatch.NORM_GRAD_OPS
                 for dt in ("float16", "bfloat16", "float32")
                 for cols in (3000, 5120, 8192, 16384, 32768)]
_NO_PREFETCH, _PREFETCH = "-DCUNORM_NORM_GRAD_PREFETCH=0", "-DCUNORM_NORM_GRAD_PREFETCH=1"
_NO_CLUSTERS = {"NORM_GRAD_CLUSTER_DTYPES": {op: () for op in _grad_dispatch.NORM_GRAD_OPS}}
# (name, NVRTC options, forced path, _grad_dispatch constants replaced)
CLUSTER_VARIANTS = [("planned", (), None, {}), ("no-cluster", (), None, _NO_CLUSTERS),
                    ("cluster", (), "cluster", {}),
                    ("planned-no-prefetch", (_NO_PREFETCH,), None, {}),
                    ("planned-prefetch", (_PREFETCH,), None, {}),
                    ("cluster-no-prefetch", (_NO_PREFETCH,), "cluster", {})]
# The prefetch rule over the warp, row-group and block kernels (128-8192 columns), and the
# cluster layouts of float32 rows of 12288 and 24576 columns (slices of at most 1024 or 256
# threads first; clusters of 3 and 6 blocks, whose slices of 12288 columns are 512 threads)
PREFETCH_CASES = [(op, dt, cols) for op in _grad_dispatch.NORM_GRAD_OPS
                  for dt in ("float16", "bfloat16", "float32")
                  for cols in (128, 256, 512, 1024, 2048, 3000, 4096, 5120, 8192)]
PREFETCH_VARIANTS = [("planned", (), None, {}), ("no-prefetch", (_NO_PREFETCH,), None, {}),
                     ("prefetch", (_PREFETCH,), None, {})]
SHAPE_CASES = [(op, "float32", cols) for op in _grad_dispatch.NORM_GRAD_OPS
               for cols in (12288, 24576)]
SHAPE_VARIANTS = [("planned", (), None, {}), ("no-cluster", (), None, _NO_CLUSTERS),
                  ("slices-1024", (), "cluster", {"NORM_GRAD_CLUSTER_THREADS": (1024,)}),
                  ("slices-256", (), "cluster", {"NORM_GRAD_CLUSTER_THREADS": (256, 1024)}),
                  ("sizes-2-3-4-6-8", (), "cluster",
                   {"NORM_GRAD_CLUSTER_SIZES": (2, 3, 4, 6, 8)}),
                  ("packs-swapped", (), "cluster",  # layer_norm 2 packs, rms_norm 1
                   {"NORM_GRAD_CLUSTER_PACKS": {"layer_norm_backward": {2: 1, 4: 2, 8: 1},
                                                "rms_norm_backward": {2: 1, 4: 1, 8: 1}}})]


# The softmax gradients past a block (float16 32776+, float32 16388+) and float16 rows of
# 32768 columns (a block of 1024 threads), on the bench's rows (49152 up to 32768 columns,
# then 3072, 1536, 768)
SOFTMAX_CLUSTER_CASES = [(op, dt, cols) for op in _grad_dispatch.GRAD_OPS
                         for dt in ("float16", "float32")
                         for cols in (32768, 65536, 131072, 262144)]
SOFTMAX_CLUSTER_VARIANTS = [
    ("planned", (), None, {}), ("no-cluster", (), None, {"GRAD_CLUSTER_DTYPES": ()}),
    ("packs-1", (), "cluster", {"GRAD_CLUSTER_LAYOUTS": ((1, 512), (1, 1024))}),
    ("packs-2-1024", (), "cluster", {"GRAD_CLUSTER_LAYOUTS": ((2, 1024),)}),
    ("packs-4", (), "cluster", {"GRAD_CLUSTER_LAYOUTS": ((4, 512), (4, 1024))}),
    ("no-prefetch", ("-DCUNORM_GRAD_CLUSTER_PREFETCH=0",), None, {})]
_BENCH_ROWS = {65536: 3072, 131072: 1536, 262144: 768}


def _softmax_grad_case(op: str, dt: str, rows: int, cols: int):
    """(bytes counted, call) of ``op`` on y = the forward of random data and a random dy."""
    rng = cupy.random.default_rng(cols)
    x = rng.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    log = op == "log_softmax_backward"
    y = (cunorm.log_softmax if log else cunorm.softmax)(x)
    del x
    dy = rng.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    bwd = cunorm.log_softmax_backward if log else cunorm.softmax_backward
    return 3 * y.nbytes, lambda: (bwd(y, dy),)


def softmax_grad_clusters(rounds: int = 2) -> None:
    """The softmax gradients' cluster path, in its layouts, against the block and uncached
    paths (SOFTMAX_CLUSTER_CASES, SOFTMAX_CLUSTER_VARIANTS)."""
    _grad_variants(SOFTMAX_CLUSTER_CASES, SOFTMAX_CLUSTER_VARIANTS, rounds,
                   _softmax_grad_case, lambda: next(reversed(softmax_grad._PLANS.values()))[0])


def _grad_case(op: str, dt: str, rows: int, cols: int):
    """(bytes counted, call) of ``op`` on random x, dy and weight, from its forward's stats."""
    rng = cupy.random.default_rng(cols)
    x = (rng.standard_normal((rows, cols), dtype=np.float32) * 2 + 0.5).astype(dt)
    dy = rng.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(cols, dtype=np.float32)).astype(dt)
    if op == "layer_norm_backward":
        _, mean, rstd = cunorm.layer_norm(x, w, return_stats=True)
        return 3 * x.nbytes, lambda: cunorm.layer_norm_backward(dy, x, mean, rstd, w)
    _, rstd = cunorm.rms_norm(x, w, return_stats=True)
    return 3 * x.nbytes, lambda: cunorm.rms_norm_backward(dy, x, rstd, w)


def norm_grad_clusters(rounds: int = 2) -> None:
    """The cluster path against the paths it replaces or passes over, and the holding kernels
    without and with their L2 prefetch everywhere (CLUSTER_CASES, CLUSTER_VARIANTS)."""
    _norm_grad_variants(CLUSTER_CASES, CLUSTER_VARIANTS, rounds)


def norm_grad_prefetch(rounds: int = 2) -> None:
    """The prefetch rule over the warp, row-group and block kernels, then cluster layouts of
    float32 rows (PREFETCH_* and SHAPE_* cases and variants)."""
    _norm_grad_variants(PREFETCH_CASES, PREFETCH_VARIANTS, rounds)
    _norm_grad_variants(SHAPE_CASES, SHAPE_VARIANTS, rounds)


def _norm_grad_variants(cases, variants, rounds: int) -> None:
    """GB/s of x, dy and dx (49152 rows, 3072 past 32768 columns) of each (op, dtype, cols)
    case on each variant (_grad_variants)."""
    _grad_variants(cases, variants, rounds, _grad_case,
                   lambda: next(p for p, *_ in reversed(norm_grad._PLANS.values())).rows)


def _grad_variants(cases, variants, rounds: int, make_case, last_plan) -> None:
    """GB/s of each (op, dtype, cols) case (``make_case(op, dtype, rows, cols)``: bytes
    counted and a call returning dx first; 49152 rows up to 32768 columns, then as the bench)
    on each (name, NVRTC options, forced path, _grad_dispatch constants) variant, variants in
    turn within a round, with the plan's kernel, block, grid and registers (NVRTC; the
    LaunchPlan ``last_plan()`` gives); dx's first rows compared with the first variant's."""
    timer = CupyEventTimer(pad_us=100)
    print(f"copy {copy_bandwidth(timer):.0f} GB/s", flush=True)
    gbps: dict[tuple, dict[str, list[float]]] = {}
    first: dict[tuple, np.ndarray] = {}  # each case's dx rows on the first variant
    for rnd in range(rounds):
        for name, options, path, consts in variants:
            _build_with(options)
            saved = {k: getattr(_grad_dispatch, k) for k in consts}
            for k, v in consts.items():
                setattr(_grad_dispatch, k, v)
            _dispatch._drop_cached_plans()
            for op, dt, cols in cases:
                nbytes, call = make_case(op, dt, _BENCH_ROWS.get(cols, 49152), cols)
                try:
                    with _dispatch.force_path(path):
                        dx = call()[0]
                        rate = nbytes / timer(call) / 1e6
                except ValueError as err:  # the forced path cannot hold the row
                    print(f"  {name} {op[:3]} {dt} {cols}: {err}", flush=True)
                    continue
                gbps.setdefault((op, dt, cols), {}).setdefault(name, []).append(rate)
                if rnd == 0:
                    head = cupy.asnumpy(dx[:64]).astype(np.float64)
                    ref = first.setdefault((op, dt, cols), head)
                    plan = last_plan()
                    regs = _KERNELS[(0, plan.kernel)].num_regs
                    print(f"  {name} {op[:3]} {dt} {cols}: {plan.kernel} "
                          f"block {plan.block} grid {plan.grid} regs {regs} "
                          f"dx diff {np.abs(head - ref).max() / np.abs(ref).max():.1e}",
                          flush=True)
            for k, v in saved.items():
                setattr(_grad_dispatch, k, v)
            _dispatch._drop_cached_plans()
    _build_with(())
    base_name = variants[0][0]
    for (op, dt, cols), by in gbps.items():
        base = max(by.get(base_name, [np.nan]))
        cells = "  ".join(f"{n} {'/'.join(f'{v:.0f}' for v in r)} ({max(r) / base:.3f})"
                          for n, r in by.items())
        print(f"{op[:3]} {dt:8s} {cols:6d}  {cells}", flush=True)
