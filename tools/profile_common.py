"""Helpers shared by the GPU profiling tools (tools/gpu_profile.py): row-op cases, the plan
a call made, kernel rebuilds with extra compile options, peers."""

from __future__ import annotations

import functools
import sys

import cupy
import numpy as np

import cunorm
from cunorm import _dispatch


def _affine_case(op: str, dt: str, rows: int, cols: int):
    """Random (rows, cols) input of ``dt`` with a weight (and a bias for layer_norm), an output
    buffer, and the cunorm function with its positional arguments."""
    x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    w = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
    if op == "layer_norm":
        b = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
        return cupy.empty_like(x), cunorm.layer_norm, (x, w, b)
    return cupy.empty_like(x), cunorm.rms_norm, (x, w)


def _row_case(op: str, dt: str, rows: int, cols: int):
    """:func:`_affine_case`, softmax and log_softmax included (no parameters)."""
    if op not in _dispatch.SOFTMAX_OPS:
        return _affine_case(op, dt, rows, cols)
    x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    return cupy.empty_like(x), getattr(cunorm, op), (x,)


def _planned(op: str):
    """(kernel, block threads, dynamic smem) of the only plan in ``op``'s plan cache."""
    softmax = op in _dispatch.SOFTMAX_OPS
    entry = next(iter(sys.modules["cunorm.softmax" if softmax else "cunorm.norm"]
                      ._PLANS.values()))
    kern = next(e for e in entry if isinstance(e, cupy.RawKernel))
    plan = next(e for e in entry if isinstance(e, _dispatch.LaunchPlan))
    return kern, plan.block, plan.smem


def _call_case(op: str, dt: str, rows: int, cols: int):
    """(output, call, bytes moved) of a :func:`_row_case` op, where ``op`` may end in
    ``_residual`` (a random residual: x and r read, y and x + r written) or ``_offset`` (every
    row 200 off 0)."""
    base = op.removesuffix("_residual").removesuffix("_offset")
    y, fn, args = _row_case(base, dt, rows, cols)
    kwargs, nbytes = {}, 2 * args[0].nbytes
    if op.endswith("_offset"):
        args[0][...] += 200
    if op.endswith("_residual"):
        kwargs["residual"] = cupy.random.standard_normal(
            args[0].shape, dtype=np.float32).astype(dt)
        nbytes *= 2
    return y, functools.partial(fn, *args, out=y, **kwargs), nbytes


def _fresh_plan(op: str, run):
    """:func:`_planned` of the plan ``run()`` makes with every cached plan dropped first."""
    _dispatch._drop_cached_plans()
    run()
    return _planned(op)


def _triton_norm_gbps(op: str, args: tuple) -> float | None:
    """GB/s of the Triton norm peer on cunorm's arguments, None past its longest row."""
    import torch
    from triton.testing import do_bench

    from cunorm.bench import triton_kernels

    x = args[0]
    if x.shape[-1] > triton_kernels.MAX_COLS:
        return None
    tx, tw = torch.from_dlpack(x), torch.from_dlpack(args[1])
    tb = torch.from_dlpack(args[2]) if len(args) > 2 else None
    peer = functools.partial(triton_kernels.norm, tx, tw, tb, 1e-5, op == "rms_norm")
    return 2 * x.nbytes / do_bench(peer, warmup=10, rep=50, return_mode="median") / 1e6


def _build_with(options: tuple[str, ...]) -> None:
    """Compile kernels from now on with these NVRTC options added (empty: as shipped), the
    kernel and plan caches emptied."""
    from cunorm import _kernels

    base = getattr(_kernels, "_shipped_options", _kernels.compile_options)
    _kernels._shipped_options = base
    _kernels.compile_options = (lambda arch, op_file="": (*base(arch, op_file), *options))
    _kernels.drop_kernels()
    _dispatch._drop_cached_plans()
    drop_attention_plans()


def _warm_up() -> None:
    """The first timing of a process runs slow: time something first."""
    from triton.testing import do_bench

    warm = cupy.ones((4096, 4096), dtype=np.float32)
    do_bench(functools.partial(cunorm.softmax, warm), warmup=100, rep=200)


def block_variants(cases, variants, rows: int | None = None) -> None:
    """GB/s of each (op, dtype, cols[, rows]) case (norms with weight and bias; ``rows`` where
    a case names none) on each (name, dispatcher constants, forced path) variant, with the
    plan's block size, shared memory and the kernel's registers (NVRTC), next to Triton
    (rows it can hold)."""
    from triton.testing import do_bench

    from cunorm.bench import triton_kernels

    _warm_up()
    for case in cases:
        op, dt, cols = case[:3]
        n = case[3] if len(case) > 3 else rows
        y, fn, args = _row_case(op, dt, n, cols)
        print(f"{op} {dt} ({n}, {cols})", flush=True)
        for name, consts, path in variants:
            with _dispatch.override_constants(consts), _dispatch.force_path(path):
                try:
                    fn(*args, out=y)
                except Exception as err:  # noqa: BLE001 - a refused plan or a failed launch
                    print(f"  {name:10s} refused: {type(err).__name__}: {err}", flush=True)
                    continue
                kern, block, smem = _planned(op)
                ms = do_bench(functools.partial(fn, *args, out=y), warmup=10, rep=50,
                              return_mode="median")
            print(f"  {name:10s} {2 * y.nbytes / ms / 1e6:5.0f} GB/s  block={block} smem={smem} "
                  f"{kern.name[8:]} regs={kern.num_regs} local={kern.local_size_bytes}",
                  flush=True)
        if op in _dispatch.SOFTMAX_OPS and cols <= triton_kernels.MAX_COLS:
            import torch

            peer = functools.partial(triton_kernels.softmax, torch.from_dlpack(args[0]),
                                     op == "log_softmax")
            ms = do_bench(peer, warmup=10, rep=50, return_mode="median")
            print(f"  triton     {2 * y.nbytes / ms / 1e6:5.0f} GB/s", flush=True)
        elif op not in _dispatch.SOFTMAX_OPS and (peer := _triton_norm_gbps(op, args)):
            print(f"  triton     {peer:5.0f} GB/s", flush=True)
        del y, args


def _triton():
    try:
        import triton
    except ImportError:
        return None
    return triton


def _norm_inputs(dt: str, cols: int, rows: int = 49152):
    x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    w = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
    b = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
    return x, w, b


def drop_attention_plans() -> None:
    """Empty attention's plan cache and its call memo, after a change of sources or planner
    constants. The memo's prepared launches hold compiled kernels and plans: left in place
    (from the memo's start on 2026-11-21 until 2026-11-27), every attention A/B of sources or
    constants in one process timed the first arm's kernels in both arms."""
    from cunorm import _attn_dispatch, _attn_launch

    _attn_launch._PLANS.clear()
    _attn_launch._MERGES.clear()  # (they hold the merge kernel)
    _attn_dispatch.choose_splits.cache_clear()  # (planner constants may have changed)
    sys.modules["cunorm.attention"]._MEMO.clear()  # (cunorm.attention is the function)
    sys.modules["cunorm.attention"]._TORCH_MEMO.clear()


def _use_sources(folder) -> None:
    """Compile kernels from now on from the sources in ``folder()`` (a ``cuda_src`` of another
    commit, or ``_kernels.source_dir`` itself), every kernel and plan cache and attention's
    call memo emptied."""
    from cunorm import _kernels

    _kernels.source_dir = folder
    _kernels.kernel_source.cache_clear()
    _kernels.drop_kernels()
    _dispatch._drop_cached_plans()
    drop_attention_plans()
