"""Gradient profiles of tools/gpu_profile.py: the norm gradients' cluster path against the
paths it replaces or passes over, built with two mails taken in turn, and the holding paths
built to prefetch the next row into the L2 (cuda_src/grad.cu CUNORM_NORM_GRAD_MAILS,
CUNORM_NORM_GRAD_PREFETCH)."""

from __future__ import annotations

import cupy
import numpy as np
from profile_common import _build_with

import cunorm
from cunorm import _dispatch, _grad_dispatch, norm_grad
from cunorm._kernels import _KERNELS
from cunorm.bench.timing import CupyEventTimer, copy_bandwidth

# (dtype, cols): rows a block holds (3000-8192; 16-bit layer_norm 3000 on two 256-thread row
# groups a block), rows past a block (16384-32768)
CLUSTER_CASES = [(dt, cols) for dt in ("float16", "bfloat16", "float32")
                 for cols in (3000, 5120, 8192, 16384, 32768)]
_MAILS, _PREFETCH = "-DCUNORM_NORM_GRAD_MAILS=2", "-DCUNORM_NORM_GRAD_PREFETCH=1"
# (name, NVRTC options, forced path, whether clusters may be planned)
CLUSTER_VARIANTS = [("planned", (), None, True), ("no-cluster", (), None, False),
                    ("cluster", (), "cluster", True),
                    ("cluster-2-mails", (_MAILS,), "cluster", True),
                    ("planned-prefetch", (_PREFETCH,), None, True),
                    ("cluster-2-mails-prefetch", (_MAILS, _PREFETCH), "cluster", True)]


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
    """GB/s of x, dy and dx (49152 rows, 3072 past 32768 columns) of both norm gradients on
    each CLUSTER_VARIANTS variant, variants in turn within a round, with the plan's kernel,
    block, grid and registers (NVRTC); dx's first rows compared with the first variant's."""
    timer = CupyEventTimer(pad_us=100)
    print(f"copy {copy_bandwidth(timer):.0f} GB/s", flush=True)
    planned = _grad_dispatch.NORM_GRAD_CLUSTER_DTYPES
    cases = [(op, dt, cols) for op in _grad_dispatch.NORM_GRAD_OPS for dt, cols in CLUSTER_CASES]
    gbps: dict[tuple, dict[str, list[float]]] = {}
    first: dict[tuple, np.ndarray] = {}  # each case's dx rows on the first variant
    for rnd in range(rounds):
        for name, options, path, clusters in CLUSTER_VARIANTS:
            _build_with(options)
            _grad_dispatch.NORM_GRAD_CLUSTER_DTYPES = (
                planned if clusters else {op: () for op in planned})
            for op, dt, cols in cases:
                nbytes, call = _grad_case(op, dt, 49152 if cols <= 32768 else 3072, cols)
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
                    plan = next(p for p, *_ in reversed(norm_grad._PLANS.values()))
                    regs = _KERNELS[(0, plan.rows.kernel)].num_regs
                    print(f"  {name} {op[:3]} {dt} {cols}: {plan.rows.kernel} "
                          f"block {plan.rows.block} grid {plan.rows.grid} regs {regs} "
                          f"dx diff {np.abs(head - ref).max() / np.abs(ref).max():.1e}",
                          flush=True)
            _grad_dispatch.NORM_GRAD_CLUSTER_DTYPES = planned
    _build_with(())
    for (op, dt, cols), by in gbps.items():
        base = max(by.get("no-cluster", [np.nan]))
        cells = "  ".join(f"{n} {'/'.join(f'{v:.0f}' for v in r)} ({max(r) / base:.3f})"
                          for n, r in by.items())
        print(f"{op[:3]} {dt:8s} {cols:6d}  {cells}", flush=True)
