"""Drive every softmax, layer_norm, rms_norm, gradient and attention kernel path on small
inputs, for compute-sanitizer.

Usage: ``compute-sanitizer --tool memcheck python tools/sanitize.py [PART ...]`` (also
racecheck), PART one of ``softmax`` (softmax and log_softmax on every row path and the
strided paths), ``norms`` (layer_norm and rms_norm on every row path), ``grad``
(softmax_backward and log_softmax_backward on every path, in place too), ``norm_grad``
(layer_norm_backward and rms_norm_backward on every path) and ``attention``; all five
without one. Under racecheck a part takes minutes (attention minutes a shape), so
the parts can run in separate calls, and dtype names among the arguments (``float16``,
``bfloat16``, ``float32``, ``float64``) keep only those dtypes, so one part can run as
parallel processes. Exits non-zero if any result is wrong, so a sanitizer
run also checks correctness.
"""

from __future__ import annotations

import functools
import sys
import time

import cupy
import ml_dtypes
import numpy as np

import cunorm
from cunorm import _dispatch, _grad_dispatch

PARTS = ("softmax", "norms", "grad", "norm_grad", "attention")
DTYPES = (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
# (rows, cols) of the row ops. 32: 16-bit norm rows on the exact two-lane kernel that loads
# its parameters with the row; 256: 16-bit layer_norm rows that load them with the row, on
# the general 16-lane kernel and (main) on the exact one, 5 rows leaving the block's last row
# groups empty (their loads read the last row again); 200: narrowed warp groups with padding
# packs (16-bit: 25 packs on 16 lanes); 1000 and 1024: 16-bit layer_norm rows staging weight
# and bias in shared memory (rows.cuh rows_warp STAGE), in the general and the exact kernel;
# 12288 and 16384: the block path in 768- and 1024-thread blocks; 512: float32 softmax rows
# on the 32-register exact warp kernel (softmax.cu softmax_warp_blocks); 7168: float32
# layer_norm rows the planner puts on 224 x 32 (_dispatch.BLOCK_MID_PAST_COLS), as it puts
# 12288 and 16384 on BLOCK_MID blocks (the norms run the planner's choice too)
ROW_CASES = [(3, 5), (6, 32), (5, 33), (5, 200), (5, 256), (3, 512), (7, 1000), (3, 1024),
             (3, 1537), (2, 3000), (3, 7168), (3, 12288), (2, 16384), (2, 20001), (2, 70001),
             (2, 262144)]


def main(parts: tuple[str, ...] = PARTS) -> int:
    bad = 0
    if "softmax" in parts:
        bad += check_softmax(np.random.default_rng(0))
    if "norms" in parts:
        bad += check_norms(np.random.default_rng(2), ROW_CASES)
        # 16-bit layer_norm rows of 256 columns on their exact kernel, which the dispatcher
        # plans on large grids only (_dispatch.warp_exact_min_blocks)
        with _dispatch.override_constants({"WARP_EXACT_EARLY_SM_BLOCKS": 0}):
            bad += check_norms(np.random.default_rng(3), [(5, 256)])
    if "grad" in parts:
        bad += check_grad(np.random.default_rng(4))
    if "norm_grad" in parts:
        bad += check_norm_grad(np.random.default_rng(5))
    if "attention" in parts:
        bad += check_attention(np.random.default_rng(1))
    cupy.cuda.Device().synchronize()
    print(f"sanitize driver ({', '.join(parts)}): {bad} wrong results")
    return 1 if bad else 0


def _progress(what: str, started: float) -> None:
    """A line a dtype (attention: a shape), so a sanitizer run that stalls or times out
    shows how far it got."""
    print(f"{what}: {time.perf_counter() - started:.1f} s", flush=True)


def check_softmax(rng: np.random.Generator) -> int:
    """softmax and log_softmax on every row path, then softmax on the strided paths: wrong
    results are counted."""
    bad = 0
    for dt in DTYPES:
        started = time.perf_counter()
        for rows, cols in ROW_CASES:
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
        # (2, 8192, 64): cached on a cluster in one-sector tiles; (2, 20000, 64): read twice
        # on a cluster
        for shape in [(2, 9, 7), (3, 40, 64), (3, 4096, 64), (2, 8192, 64), (2, 20000, 64)]:
            x = cupy.asarray(rng.standard_normal(shape).astype(dt))
            # MAX_GRID 8: blocks (and clusters) that loop over tiles, reusing their mail
            for path, consts in [("strided-cached", {}), ("strided", {}),
                                 ("strided-cached", {"MAX_GRID": 8}),
                                 ("strided", {"MAX_GRID": 8})]:
                try:
                    with _dispatch.force_path(path), _dispatch.override_constants(consts):
                        y = cunorm.softmax(x, axis=1)
                except ValueError:  # the cached path cannot hold every dim
                    continue
                s = cupy.asnumpy(y.astype(np.float64).sum(1))
                if not np.allclose(s, 1, atol=2e-2):
                    print(f"WRONG strided {path} {consts} {np.dtype(dt).name} {shape}")
                    bad += 1
        _progress(f"softmax {np.dtype(dt).name}", started)
    return bad


def check_grad(rng: np.random.Generator) -> int:
    """softmax_backward and log_softmax_backward on every path that holds the row (into a
    fresh array and in place over dy): wrong results are counted."""
    bad = 0
    for dt in DTYPES:
        started = time.perf_counter()
        # 140 x 131072: clusters of 8 looping over rows (float64 does not fit one)
        for rows, cols in [*ROW_CASES, (3, 2056), (2, 32768), (2, 32776), (140, 131072)]:
            for log in (False, True):
                fwd = cunorm.log_softmax if log else cunorm.softmax
                bwd = cunorm.log_softmax_backward if log else cunorm.softmax_backward
                y = fwd(cupy.asarray(rng.standard_normal((rows, cols)).astype(dt)))
                dyh = rng.standard_normal((rows, cols)).astype(dt)
                # the NumPy path on float64 copies (tests/test_cpu_softmax_grad.py holds it to
                # the Jacobian)
                ref = bwd(cupy.asnumpy(y).astype(np.float64), dyh.astype(np.float64))
                for in_place in (False, True):
                    def call(bwd=bwd, y=y, dyh=dyh, in_place=in_place):
                        dy = cupy.asarray(dyh)  # afresh for each path: in place overwrites it
                        return (bwd(y, dy, out=dy if in_place else None),)

                    bad += _wrong_on_paths(call, (ref,), f"{bwd.__name__} in_place={in_place} "
                                           f"{np.dtype(dt).name} {rows}x{cols}",
                                           _grad_dispatch.GRAD_PATHS)
        _progress(f"grad {np.dtype(dt).name}", started)
    return bad


def _wrong_on_paths(call, refs, what: str, paths: tuple[str, ...]) -> int:
    """Outputs of ``call()`` (a tuple of arrays) with each gradient path of ``paths`` forced
    that can hold the row, against float64 ``refs``: the number of wrong outputs, each
    printed."""
    bad = 0
    for path in paths:
        try:
            with _dispatch.force_path(path):
                outs = call()
        except ValueError:  # the path cannot hold the row
            continue
        for out, ref in zip(outs, refs, strict=True):
            got = cupy.asnumpy(out).astype(np.float64)
            if not np.allclose(got, ref, atol=2e-2 * np.abs(ref).max()):
                print(f"WRONG {what} {path}")
                bad += 1
    return bad


def check_norm_grad(rng: np.random.Generator) -> int:
    """layer_norm_backward and rms_norm_backward on every path that holds the row, with and
    without a weight, on row counts whose grids loop: wrong dx or column sums are counted."""
    bad = 0
    for dt in DTYPES:
        started = time.perf_counter()
        # 257 x 16384: cluster grids looping over rows (a cluster holds them in every dtype)
        for rows, cols in [*ROW_CASES, (3000, 64), (700, 1000), (3, 2056), (2, 8200),
                           (257, 16384), (3, 32768)]:
            x = cupy.asarray((rng.standard_normal((rows, cols)) + 0.5).astype(dt))
            dy = cupy.asarray(rng.standard_normal((rows, cols)).astype(dt))
            w = cupy.asarray(rng.standard_normal(cols).astype(dt))
            for rms in (False, True):
                for weight in (w, None):
                    if rms:
                        _, rstd = cunorm.rms_norm(x, weight, return_stats=True)
                        stats = (rstd,)
                        bwd = cunorm.rms_norm_backward
                    else:
                        _, mean, rstd = cunorm.layer_norm(x, weight, return_stats=True)
                        stats = (mean, rstd)
                        bwd = cunorm.layer_norm_backward
                    # the NumPy path on float64 copies (tests/test_cpu_norm_grad.py holds it
                    # to finite differences)
                    ref = bwd(*(None if a is None else cupy.asnumpy(a).astype(np.float64)
                                for a in (dy, x, *stats, weight)))
                    bad += _wrong_on_paths(
                        functools.partial(bwd, dy, x, *stats, weight),
                        ref, f"{bwd.__name__} weight={weight is not None} "
                        f"{np.dtype(dt).name} {rows}x{cols}", _grad_dispatch.NORM_GRAD_PATHS)
        _progress(f"norm_grad {np.dtype(dt).name}", started)
    return bad


def norm_reference(rms: bool, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float):
    """float64 (y, mean, rstd) over the last axis."""
    xf = x.astype(np.float64)
    mean = np.zeros((xf.shape[0], 1)) if rms else xf.mean(-1, keepdims=True)
    d = xf - mean
    rstd = 1.0 / np.sqrt((d * d).mean(-1, keepdims=True) + eps)
    y = d * rstd * w.astype(np.float64)
    if b is not None:
        y += b.astype(np.float64)
    return y, mean[:, 0], rstd[:, 0]


def check_norms(rng: np.random.Generator, cases: list[tuple[int, int]]) -> int:
    """layer_norm / rms_norm with weight (and bias), with and without a residual, with
    return_stats, on the planner's path and every row path the dispatcher can force: wrong
    results are counted."""
    bad = 0
    for dt in DTYPES:
        name = np.dtype(dt).name
        started = time.perf_counter()
        for rows, cols in cases:
            xh = (rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt)
            rh = rng.standard_normal((rows, cols)).astype(dt)
            wh = (rng.standard_normal(cols) * 0.5 + 1).astype(dt)
            bh = (rng.standard_normal(cols) * 0.5).astype(dt)
            xh[0] = 0  # a zero row: 0 * rsqrt(0 + eps), so a lost eps shows as NaN
            rh[0] = 0
            x, r, w, b = (cupy.asarray(a) for a in (xh, rh, wh, bh))
            hh = (xh.astype(np.float64) + rh.astype(np.float64)).astype(dt)
            for op in ("layer_norm", "rms_norm"):
                rms = op == "rms_norm"
                eps = 1e-6 if rms else 1e-5
                for residual in (False, True):
                    ref, mean, rstd = norm_reference(rms, hh if residual else xh, wh,
                                                     None if rms else bh, eps)
                    kwargs = {"return_stats": True}
                    if residual:
                        kwargs["residual"] = r
                    for path in (None, *_dispatch.ROW_PATHS):
                        try:
                            with _dispatch.force_path(path):
                                if rms:
                                    res = cunorm.rms_norm(x, w, **kwargs)
                                else:
                                    res = cunorm.layer_norm(x, w, b, **kwargs)
                        except ValueError:
                            if path is None:  # the planner's own path must run
                                raise
                            continue
                        got = [cupy.asnumpy(a).astype(np.float64) for a in res]
                        ok = np.allclose(got[0], ref, rtol=2e-2, atol=2e-2)
                        if residual:
                            ok &= np.allclose(got[1], hh.astype(np.float64), rtol=1e-2,
                                              atol=1e-2)
                        ok &= np.allclose(got[-1], rstd, rtol=1e-3)
                        if not rms:
                            ok &= np.allclose(got[-2], mean, rtol=1e-3, atol=1e-3)
                        if not ok:
                            tag = " residual" if residual else ""
                            print(f"WRONG {op}{tag} {path} {name} {rows}x{cols}")
                            bad += 1
        _progress(f"norms {name}", started)
    return bad


def check_attention(rng: np.random.Generator) -> int:
    """Every attention kernel (tensor-core, SIMT, split-KV merge; on sm_90 the warpgroup
    kernel with one and two warpgroups per block and persistent grids forced, and the
    warp-specialized kernel, at head dims up to 32 padded to 64 too) on ragged shapes, GQA,
    causal with Lq != Lk, masks, odd head dims and a strided layout."""
    from cunorm import _attn_dispatch

    bad = 0
    shapes = [(1, 4, 2, 37, 70, 64, 64), (2, 2, 1, 1, 300, 128, 128), (1, 2, 2, 5, 9, 17, 33),
              (1, 2, 1, 70, 40, 256, 256), (1, 1, 1, 19, 33, 96, 96),
              (1, 2, 1, 40, 90, 128, 128), (1, 2, 1, 70, 90, 24, 24)]
    # (split-KV count, warpgroups per block, persistent grid blocks, warp-specialized kernel):
    # None keeps the planner's choice; one-block persistent grids take every row tile in turn
    choices = ((1, None, None, None), (3, None, None, None), (1, 1, None, None),
               (1, 2, None, None), (1, 1, 1, None), (1, 2, 1, None), (None, None, None, True))
    for dt in DTYPES:
        for b, hq, hkv, lq, lk, d, dv in shapes:
            started = time.perf_counter()
            q = cupy.asarray(rng.standard_normal((b, lq, hq, d)).astype(dt)).transpose(0, 2, 1, 3)
            k = cupy.asarray(rng.standard_normal((b, hkv, lk, d)).astype(dt))
            v = cupy.asarray(rng.standard_normal((b, hkv, lk, dv)).astype(dt))
            mask = cupy.asarray(rng.random((lq, lk)) < 0.8)
            for split, groups, blocks, ws in choices:
                for causal, m in ((False, None), (True, None), (False, mask)):
                    with _attn_dispatch.force_split(split), \
                            _attn_dispatch.force_warpgroups(groups), \
                            _attn_dispatch.force_persistent(blocks), \
                            _attn_dispatch.force_warp_specialized(ws):
                        out, lse = cunorm.attention(q, k, v, causal=causal, mask=m,
                                                    return_lse=True)
                    o = cupy.asnumpy(out).astype(np.float64)
                    if not np.isfinite(o).all() or np.abs(o).max() > 10:
                        print(f"WRONG attention {np.dtype(dt).name} {(b, hq, hkv, lq, lk, d, dv)}"
                              f" split={split} groups={groups} blocks={blocks} ws={ws}"
                              f" causal={causal}"
                              f" mask={m is not None}")
                        bad += 1
            _progress(f"attention {np.dtype(dt).name} {(b, hq, hkv, lq, lk, d, dv)}", started)
    return bad


if __name__ == "__main__":
    dtype_names = {np.dtype(dt).name: dt for dt in DTYPES}
    chosen = tuple(a for a in sys.argv[1:] if a not in dtype_names) or PARTS
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        sys.exit(f"tools/sanitize.py: unknown part(s) {unknown}; expected some of {PARTS} "
                 f"and dtype names {sorted(dtype_names)}")
    picked = [dtype_names[a] for a in sys.argv[1:] if a in dtype_names]
    DTYPES = tuple(picked) or DTYPES
    sys.exit(main(chosen))

