"""GPU tests of softmax / log_softmax: every kernel path forced on the same inputs at every
boundary column count, dtypes, axes, layouts, special values, in-place, frameworks, 64-bit
indexing. Skipped (with the reason) where no CUDA GPU is present."""

from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest
from _gpu import (  # shared GPU preamble
    BF16,
    DTYPES,
    GPU_MARKS,
    TOL,
    cupy,
    poisoned_allocations,
    spy_launches,
)

import cunorm
from cunorm import _array, _dispatch

softmax_module = importlib.import_module("cunorm.softmax")  # the function shadows the module

pytestmark = GPU_MARKS
OPS = {"softmax": cunorm.softmax, "log_softmax": cunorm.log_softmax}

# Column counts on every regime boundary: tiny groups, pack multiples +-1, warp limit +-1,
# block sizes, smem capacity edges, 2^16 + 1.
BOUNDARY_COLS = [1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511,
                 512, 513, 1000, 1023, 1024, 1025, 1535, 1536, 1537, 2047, 2048, 2049, 4095,
                 4097, 12288, 16384, 16385, 32767, 57344, 65537]
ROW_PATHS = list(_dispatch.ROW_PATHS)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def reference(x: np.ndarray, axis, log: bool) -> np.ndarray:
    """float64 softmax / log_softmax with NumPy semantics for special values."""
    xf = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = xf - xf.max(axis=axis, keepdims=True)
        s = np.exp(z).sum(axis=axis, keepdims=True)
        return z - np.log(s) if log else np.exp(z) / s


def rel_err(y: np.ndarray, ref: np.ndarray, axis=-1) -> float:
    """Largest relative max-norm error over the slices along ``axis``."""
    y = y.astype(np.float64)
    num = np.abs(y - ref).max(axis=axis)
    den = np.abs(ref).max(axis=axis)
    return float((num / np.maximum(den, 1e-300)).max()) if num.size else 0.0


def random_input(shape, dtype, seed=0, scale=3.0):
    """Fresh N(0, scale) data on the GPU (never zeros) and its host copy."""
    host = (_rng(seed).standard_normal(shape) * scale).astype(dtype)
    return cupy.asarray(host), host


def can_force(path: str, cols: int, dtype) -> bool:
    """Whether the dispatcher can put a row of ``cols`` elements of ``dtype`` on ``path``: asks
    the planner itself (forcing an impossible path raises ValueError at plan time), with an
    occupancy oracle that lets every block fit."""
    name = np.dtype(dtype).name
    props = cunorm._device.device_props(0)
    try:
        _dispatch.plan_rows("softmax", name, name, 1, cols, 16, props,
                            lambda kernel, block, smem: 1, force=path)
    except ValueError:
        return False
    return True


def strided_cached_fits(shape: tuple[int, int, int], dtype, op: str = "softmax") -> bool:
    """Whether the cached strided path can hold axis 1 of a fresh contiguous (outer, dim,
    inner) array of ``dtype`` on device 0: asks the planner itself with the pack alignment the
    call finds (16 elements, narrowed by the strides inner and dim * inner: softmax._Recipe;
    fresh allocations are aligned) and, as :func:`can_force`, an occupancy oracle that lets
    every block fit. A forced "strided-cached" call is then refused exactly when this is
    False."""
    outer, dim, inner = shape
    name = np.dtype(dtype).name
    align = _array.pack_alignment((), _array.stride_bits((inner, dim * inner)))
    try:
        _dispatch.plan_strided(op, name, name, outer, dim, inner, align,
                               cunorm._device.device_props(0), lambda kernel, block, smem: 1,
                               force="strided-cached")
    except ValueError:
        return False
    return True


# --- every path on the same inputs at every boundary ------------------------------------
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("cols", BOUNDARY_COLS)
def test_paths_agree_at_boundaries(op, dtype, cols):
    rows = 37  # odd: exercises the masked second row of tiny-row groups
    x, xh = random_input((rows, cols), dtype, seed=cols)
    ref = reference(xh, -1, op == "log_softmax")
    results = {}
    for path in [None] + ROW_PATHS:
        if path is not None and not can_force(path, cols, dtype):
            continue
        out = cupy.full((rows, cols), np.nan, dtype=dtype)  # poison: every element is written
        with _dispatch.force_path(path):
            OPS[op](x, out=out)
        y = cupy.asnumpy(out)
        assert not np.isnan(y.astype(np.float64)).any(), f"path {path}: unwritten/NaN output"
        err = rel_err(y, ref)
        assert err <= TOL[dtype.name], f"path {path}: error {err:.3g} > {TOL[dtype.name]}"
        results[path] = y
    # all forced paths compute the same function (within the dtype's rounding)
    base = results[None].astype(np.float64)
    for path, y in results.items():
        np.testing.assert_allclose(y.astype(np.float64), base, rtol=0,
                                   atol=2 * TOL[dtype.name] * np.abs(base).max(), err_msg=path)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("cols", [32, 64, 256, 768])
def test_exact_warp_kernels_match_the_general_ones(op, dtype, cols):
    """Rows that fill a warp kernel's packs run its exact variant (rows.cuh rows_warp EXACT:
    compile-time columns, no row loop); on row counts that leave a block's last row groups
    empty it writes the same bits as the general kernel (softmax uses no 1/cols)."""
    props = cunorm._device.device_props(0)
    align = 16 // np.dtype(dtype).itemsize
    for rows in (1, 37, 1001):
        x, _ = random_input((rows, cols), dtype, seed=rows + cols)
        outs = []
        for families in (_dispatch.WARP_EXACT_FAMILIES, ()):
            with _dispatch.override_constants({"WARP_EXACT_FAMILIES": families}):
                plan = _dispatch.plan_rows(op, dtype.name, dtype.name, rows, cols, align, props,
                                           lambda kernel, block, smem: 1)
                assert plan.path == "warp" and plan.kernel.endswith(
                    ", true>" if families else ", false>"), plan
                out = cupy.full((rows, cols), np.nan, dtype)
                getattr(cunorm, op)(x, out=out)
            outs.append(cupy.asnumpy(out))
        assert not np.isnan(outs[0].astype(np.float64)).any(), rows
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=f"rows {rows}")


@pytest.mark.parametrize("path", ROW_PATHS)
def test_forced_path_is_taken(path, monkeypatch):
    """A forced path is planned, and its kernel family is the one launched (512 float32
    columns for the warp path, which cannot take 3000)."""
    cols = 512 if path == "warp" else 3000
    if not can_force(path, cols, np.float32):
        pytest.skip(f"{path} not available on this device")
    x, xh = random_input((5, cols), np.float32)
    launched = spy_launches(monkeypatch)
    with _dispatch.force_path(path):
        y = cunorm.softmax(x)
    plans = [p for k, (p, *_) in softmax_module._PLANS.items()
             if k[4:6] == (5, cols) and k[-1] == path]
    assert plans and plans[0].path == path
    assert len(launched) == 1, launched
    name = launched[0][0]
    family = {"warp": "softmax_warp", "block": "softmax_block", "smem": "softmax_smem",
              "cluster": "smem_cluster", "uncached": "softmax_uncached"}[path]
    assert family in name and (path != "smem" or "cluster" not in name), (path, name)
    assert rel_err(cupy.asnumpy(y), reference(xh, -1, False)) <= TOL["float32"]


def test_forcing_an_impossible_path_raises():
    x, _ = random_input((2, 100_000), np.float32)
    with _dispatch.force_path("warp"), pytest.raises(ValueError, match="warp"):
        cunorm.softmax(x)


# --- every cluster size ------------------------------------------------------------------
def _planned_cluster(cols: int, path: str | None) -> int:
    """Blocks per row of the plan the last call with ``cols`` columns and forced ``path`` made."""
    plans = [p for k, (p, *_) in softmax_module._PLANS.items()
             if k[5] == cols and k[-1] == path]
    name = plans[-1].kernel
    return int(name.rsplit(",", 1)[1].rstrip("> ")) if "_cluster<" in name else 1


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_every_cluster_size(op, dtype):
    """Each cluster size the device allows (16 where non-portable clusters are), on the
    shared-memory and uncached paths: rows whose slices just fill the preferred slice at that
    size, their partial results exchanged through the cluster's mail."""
    sizes = _dispatch.row_cluster_sizes(cunorm._device.device_props(0))
    if not sizes:
        pytest.skip("no thread-block clusters on this device")
    isz = np.dtype(dtype).itemsize
    cases = [(c, c * _dispatch.SMEM_SLICE_PREFERRED_BYTES // isz, "cluster") for c in sizes]
    # uncached rows split over the largest cluster: slices past UNCACHED_SLICE_MAX_BYTES
    cols = sizes[-1] * _dispatch.UNCACHED_SLICE_MAX_BYTES // isz + 16
    cases.append((sizes[-1], cols, "uncached"))
    for cluster, cols, path in cases:
        x, xh = random_input((3, cols), dtype, seed=cluster)
        out = cupy.full((3, cols), np.nan, dtype=dtype)
        with _dispatch.force_path(path):
            OPS[op](x, out=out)
        assert _planned_cluster(cols, path) == cluster, (cluster, cols, path)
        err = rel_err(cupy.asnumpy(out), reference(xh, -1, op == "log_softmax"))
        assert err <= TOL[np.dtype(dtype).name], (cluster, cols, path, err)


# (family, template head, src, dst, pack item size) of every row-kernel head (softmax and norms)
_ROW_HEADS = [h[:5] for h in _dispatch._row_heads()]


@pytest.mark.parametrize(("family", "head", "src", "dst", "isz"), _ROW_HEADS,
                         ids=lambda v: str(v).replace("cunorm::", "").replace(" ", ""))
def test_block_wide_matches_the_kernels_launch_bounds(family, head, src, dst, isz):
    """The dispatcher's mirror of rows.cuh block_max_threads (block_wide) agrees with the
    compiled block kernels: 1024 threads exactly where it plans 1024-thread blocks."""
    from cunorm._device import device_props
    from cunorm._kernels import get_kernel

    props = device_props(0)
    full = 16 // isz
    for pack, values in ((full, 16), (full, 24), (max(1, full // 2), 16)):
        name = f"cunorm::{family}_block<{head}, {pack}, {values}>"
        kern = get_kernel(0, props.arch, _dispatch.kernel_file(name), name)
        wide = values <= _dispatch.BLOCK_TARGET_VALUES and _dispatch.block_wide(
            family, src, dst, pack)
        assert kern.max_threads_per_block == (1024 if wide else 512), name


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32], ids=lambda d: np.dtype(d).name)
def test_block_mid_rows(dtype, log):
    """Rows the dispatcher keeps in registers at 24 or 32 values a thread (BLOCK_MID) match the
    float64 reference, and their kernels have the registers of 2 resident 512-thread blocks."""
    from cunorm._device import device_props
    from cunorm._kernels import get_kernel, occupancy

    props = device_props(0)
    name = np.dtype(dtype).name
    op = "log_softmax" if log else "softmax"
    ran = 0
    for cols in (10240, 12288, 16384):
        cfg = _dispatch.block_mid_config(op, name, name, cols, 16 // np.dtype(dtype).itemsize,
                                         props.arch)
        if cfg is None:
            continue
        plan = _dispatch.plan_rows(op, name, name, 5, cols, 16, props, lambda k, b, s: 2)
        assert (plan.path, plan.block) == ("block", cfg[0]) and plan.kernel.endswith(
            f", {cfg[1]}>"), plan
        kern = get_kernel(0, props.arch, _dispatch.kernel_file(plan.kernel), plan.kernel)
        assert occupancy(kern, 512, 0) >= 2, (plan.kernel, kern.num_regs)
        x, xh = random_input((5, cols), dtype, seed=cols)
        y = cunorm.log_softmax(x) if log else cunorm.softmax(x)
        assert rel_err(cupy.asnumpy(y), reference(xh, -1, log)) <= TOL[name], cols
        ran += 1
    if props.arch >= _dispatch.BLOCK_MID_MIN_ARCH:
        assert ran, "no BLOCK_MID row for this dtype"


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("cols", [1000, 1024])
def test_short_block_rows_at_full_occupancy(cols, log):
    """float32 rows the block path holds at 8 values a thread match the float64 reference, and
    their kernels have the registers of 4 resident 512-thread blocks (softmax.cu
    softmax_block: 32, against 40 for longer rows)."""
    from cunorm._device import device_props
    from cunorm._kernels import get_kernel, occupancy

    props = device_props(0)
    op = "log_softmax" if log else "softmax"
    plan = _dispatch.plan_rows(op, "float32", "float32", 7, cols, 4, props, lambda k, b, s: 4)
    assert plan.path == "block" and plan.kernel.endswith(", 8>"), plan
    kern = get_kernel(0, props.arch, _dispatch.kernel_file(plan.kernel), plan.kernel)
    assert occupancy(kern, 512, 0) >= 4, (plan.kernel, kern.num_regs)
    x, xh = random_input((7, cols), np.float32, seed=cols)
    y = cunorm.log_softmax(x) if log else cunorm.softmax(x)
    assert rel_err(cupy.asnumpy(y), reference(xh, -1, log)) <= TOL["float32"]


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("rows", [1, 77, 4096])
def test_float32_512_column_warp_rows_at_full_occupancy(rows, log):
    """float32 rows of 512 columns (16 values a lane, the exact warp kernel) match the float64
    reference, and their kernel has the registers of 16 resident 128-thread blocks (softmax.cu
    softmax_warp_blocks: 32), so the planner's 64-thread blocks fill an SM's 32 block slots."""
    from cunorm._device import device_props
    from cunorm._kernels import get_kernel, occupancy

    props = device_props(0)
    op = "log_softmax" if log else "softmax"
    cols = 512
    plan = _dispatch.plan_rows(op, "float32", "float32", rows, cols, 4, props,
                               lambda k, b, s: 4)
    assert plan.path == "warp" and plan.kernel.endswith(", 4, 16, 32, 1, true>"), plan
    kern = get_kernel(0, props.arch, _dispatch.kernel_file(plan.kernel), plan.kernel)
    assert kern.num_regs <= 32 and occupancy(kern, 64, 0) >= 32, (plan.kernel, kern.num_regs)
    x, xh = random_input((rows, cols), np.float32, seed=rows)
    out = cupy.full((rows, cols), np.nan, dtype=np.float32)
    (cunorm.log_softmax if log else cunorm.softmax)(x, out=out)
    assert rel_err(cupy.asnumpy(out), reference(xh, -1, log)) <= TOL["float32"]


# --- dtypes, output dtypes --------------------------------------------------------------
@pytest.mark.parametrize("src,dst", [(np.float16, np.float32), (BF16, np.float32),
                                     (np.float32, np.float64), (np.float32, np.float16),
                                     (np.float64, np.float32), (np.float16, np.float64)])
@pytest.mark.parametrize("cols", [7, 512, 3000, 40000])
def test_output_dtype(src, dst, cols):
    x, xh = random_input((9, cols), src, seed=3)
    y = cunorm.softmax(x, dtype=dst)
    assert y.dtype == np.dtype(dst)
    tol = max(TOL[np.dtype(dst).name], 1e-12 if np.dtype(src) == np.float64 else 0)
    assert rel_err(cupy.asnumpy(y), reference(xh, -1, False)) <= tol


# --- axes and layouts -------------------------------------------------------------------
AXES_CASES = [((6, 7, 8), 0), ((6, 7, 8), 1), ((6, 7, 8), -1), ((6, 7, 8), (1, 2)),
              ((6, 7, 8), (0, 1)), ((6, 7, 8), (0, 2)), ((6, 7, 8), (0, 1, 2)),
              ((4, 21, 16, 16), 1), ((3, 300, 64), 1), ((2, 5000, 24), 1), ((1000, 3), 0),
              ((4, 3, 5, 2), (1, 3))]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape,axis", AXES_CASES)
def test_axes(op, dtype, shape, axis):
    x, xh = random_input(shape, dtype, seed=len(shape))
    ax = axis if isinstance(axis, tuple) else (axis,)
    ref = reference(xh, ax, op == "log_softmax")
    y = cupy.asnumpy(OPS[op](x, axis=axis)).astype(np.float64)
    # relative max-norm per slice: move the reduced axes last and flatten them
    keep = [i for i in range(len(shape)) if i not in [a % len(shape) for a in ax]]
    perm = keep + [a % len(shape) for a in ax]
    n = int(np.prod([shape[i] for i in keep]))
    err = rel_err(y.transpose(perm).reshape(n, -1), ref.transpose(perm).reshape(n, -1))
    assert err <= TOL[dtype.name]


@pytest.mark.parametrize("path", ["strided-cached", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(3, 17, 33), (2, 64, 256), (5, 1000, 8), (1, 3, 4096),
                                   (2, 4096, 256), (2, 8192, 64), (2, 17408, 64),
                                   (2, 20000, 64)])
@pytest.mark.parametrize("grid", ["one-tile", "few-blocks"])
def test_strided_paths(path, dtype, shape, grid):
    """Every strided kernel on the same inputs; "few-blocks" caps the grid at 8 blocks so
    each block (or cluster) loops over many tiles, reusing its shared memory and mail. On
    sm_90 (2, 8192, 64) is cached on a cluster in one-sector tiles; (2, 17408, 64), the
    longest dim the cached path holds there, fills each block of a cluster of 8 to
    STRIDED_SLICE_MAX_BYTES (2176 rows of a 32-byte tile, 128 of them held in registers:
    64 KB of shared memory); (2, 20000, 64) is read twice on a cluster, and forcing the
    cached path on it is refused. Without clusters (one block, one slice) the cached path
    refuses this test's dims from 4096 on. Which dims fit is the planner's answer
    (:func:`strided_cached_fits`): a fitting one must compute the softmax, a refused one
    must raise the planner's error before anything is written."""
    x, xh = random_input(shape, dtype, seed=11)
    ref = reference(xh, 1, False)
    out = cupy.full(shape, np.nan, dtype=dtype)
    consts = {"MAX_GRID": 8} if grid == "few-blocks" else {}
    if path == "strided-cached" and not strided_cached_fits(shape, dtype):
        with pytest.raises(ValueError, match=f"cannot cache dim={shape[1]} "), \
                _dispatch.force_path(path), _dispatch.override_constants(consts):
            cunorm.softmax(x, axis=1, out=out)
        assert bool(cupy.isnan(out).all())  # refused at plan time: nothing written
        return
    with _dispatch.force_path(path), _dispatch.override_constants(consts):
        cunorm.softmax(x, axis=1, out=out)
    y = cupy.asnumpy(out).astype(np.float64)
    assert not np.isnan(y).any()
    assert rel_err(y.transpose(0, 2, 1).reshape(-1, shape[1]),
                   ref.transpose(0, 2, 1).reshape(-1, shape[1])) <= TOL[dtype.name]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(2, 100, 64), (3, 300, 64), (2, 1000, 24)])
def test_strided_cluster_held_rows(dtype, shape):
    """Cached cluster slices so short that a thread's rows lie all, or all but a few, among
    the STRIDED_HELD_ROWS it keeps in registers (some threads hold fewer rows than that, or
    none): the slice limits are lowered so that short dims take a cluster."""
    if not cunorm._device.device_props(0).has_clusters:
        pytest.skip("thread-block clusters need sm_90")
    x, xh = random_input(shape, dtype, seed=12)
    out = cupy.full(shape, np.nan, dtype=dtype)
    small = {"STRIDED_SLICE_PREFERRED_BYTES": 1024, "STRIDED_SLICE_MAX_BYTES": 1024}
    with _dispatch.override_constants(small):
        cunorm.softmax(x, axis=1, out=out)
        plan = next(p for p, *_ in softmax_module._PLANS.values())
    assert plan.path == "strided-cached" and "_cluster<" in plan.kernel, plan
    y = cupy.asnumpy(out).astype(np.float64)
    assert not np.isnan(y).any()
    ref = reference(xh, 1, False)
    assert rel_err(y.transpose(0, 2, 1).reshape(-1, shape[1]),
                   ref.transpose(0, 2, 1).reshape(-1, shape[1])) <= TOL[dtype.name]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("view", ["row_stride", "col_stride", "transposed", "offset",
                                  "negative", "broadcast"])
def test_non_contiguous(dtype, view):
    base, _ = random_input((64, 1030), dtype, seed=5)
    x = {"row_stride": base[::3, :1024], "col_stride": base[:, ::2], "transposed": base.T,
         "offset": base[:, 1:1025], "negative": base[:, ::-1],
         "broadcast": cupy.broadcast_to(base[0], (8, 1030))}[view]
    xh = cupy.asnumpy(x)
    for path in [None] + ROW_PATHS:
        if path is not None and not can_force(path, x.shape[-1], dtype):
            continue
        with _dispatch.force_path(path):
            y = cupy.asnumpy(cunorm.softmax(x))
        assert rel_err(y, reference(xh, -1, False)) <= TOL[dtype.name], path
    # x unchanged
    assert np.array_equal(cupy.asnumpy(x).view(np.uint8), xh.view(np.uint8))


# --- special values ---------------------------------------------------------------------
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("cols", [5, 64, 700, 3000, 70000])
def test_special_values(op, dtype, cols):
    xh = (_rng(cols).standard_normal((6, cols)) * 2).astype(dtype)
    xh[0, cols // 2] = np.nan          # NaN row -> NaN row
    xh[1, :] = -np.inf                 # all -inf -> NaN
    xh[2, ::2] = -np.inf               # some -inf -> 0 there (softmax), finite elsewhere
    xh[3, cols // 3] = np.inf          # +inf -> NaN row (NumPy semantics)
    xh[4, :] = 1e4 if dtype != np.float16 else 6e4  # constant large row: uniform result
    ref = reference(xh, -1, op == "log_softmax")
    for path in [None] + ROW_PATHS:
        if path is not None and not can_force(path, cols, dtype):
            continue
        with _dispatch.force_path(path):
            y = cupy.asnumpy(OPS[op](cupy.asarray(xh))).astype(np.float64)
        for r in range(6):
            np.testing.assert_array_equal(np.isnan(y[r]), np.isnan(ref[r]),
                                          err_msg=f"path {path} row {r} NaN pattern")
            # Finite references are compared within the tolerance, relative to the largest
            # finite one (an infinite one, log_softmax's -inf, would make any error pass),
            # and infinite ones exactly, sign included.
            finite, infinite = np.isfinite(ref[r]), np.isinf(ref[r])
            if finite.any():
                err = np.abs(y[r][finite] - ref[r][finite]).max()
                assert err / np.abs(ref[r][finite]).max() <= TOL[dtype.name], (
                    f"path {path} row {r}")
            np.testing.assert_array_equal(np.isinf(y[r]), infinite,
                                          err_msg=f"path {path} row {r} inf pattern")
            np.testing.assert_array_equal(y[r][infinite], ref[r][infinite])


@pytest.mark.parametrize("path", ["strided-cached", "strided"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [5, 1000, 8192, 17405, 20000])
@pytest.mark.parametrize("inner", [16, 24])
def test_strided_special_values(path, op, dtype, dim, inner):
    """Special values along a non-last axis, placed in either half of dim: the cached kernels
    fold a slice in chunks as their copies land (a chunk of -inf before finite values, a
    later chunk raising the max or holding +inf), and the twice-read ones in runs of rows.
    inner = 24 is no multiple of the tile's width (2-16 lanes of 16-byte packs), so lanes of
    the last tile are inactive, and the cached path's shuffles of the maxima must leave them
    out. On sm_90 the cached path holds dim 17405 in a cluster of 8 nearly full 64 KB slices,
    the last one 3 rows short, and refuses 20000 (:func:`strided_cached_fits` says which)."""
    xh = (_rng(dim).standard_normal((2, dim, inner)) * 2).astype(dtype)
    half = dim // 2
    xh[0, half, 0] = np.nan            # NaN -> NaN column
    xh[0, :, 1] = -np.inf              # all -inf -> NaN
    xh[0, :half, 2] = -np.inf          # -inf first, finite after
    xh[0, half:, 3] = -np.inf          # finite first, -inf after
    xh[0, 0, 4] = np.inf               # +inf early -> NaN column
    xh[0, dim - 1, 5] = np.inf         # +inf last -> NaN column
    xh[0, :, 6] = np.linspace(-8, 8, dim)  # the max in the last row, raised chunk by chunk
    xh[0, :, 7] = 1e4 if dtype != np.float16 else 6e4  # constant large: uniform
    xh[0, ::2, 8] = -np.inf            # every other -inf
    xh[0, :, 9] = -np.inf              # -inf and one NaN: no finite max -> NaN column
    xh[0, half, 9] = np.nan
    ref = reference(xh, 1, op == "log_softmax")
    if path == "strided-cached" and not strided_cached_fits(xh.shape, dtype, op):
        with pytest.raises(ValueError, match=f"cannot cache dim={dim} "), \
                _dispatch.force_path(path):
            OPS[op](cupy.asarray(xh), axis=1)
        return
    with _dispatch.force_path(path):
        out = OPS[op](cupy.asarray(xh), axis=1)
    y = cupy.asnumpy(out).astype(np.float64)
    for o in range(2):
        for i in range(inner):
            yc, rc = y[o, :, i], ref[o, :, i]
            where = f"path {path} column ({o}, {i})"
            np.testing.assert_array_equal(np.isnan(yc), np.isnan(rc), err_msg=where)
            np.testing.assert_array_equal(np.isinf(yc), np.isinf(rc), err_msg=where)
            np.testing.assert_array_equal(yc[np.isinf(rc)], rc[np.isinf(rc)], err_msg=where)
            finite = np.isfinite(rc)
            if finite.any():
                err = np.abs(yc[finite] - rc[finite]).max() / np.abs(rc[finite]).max()
                assert err <= TOL[dtype.name], where


def test_properties_sum_and_shift():
    x, xh = random_input((100, 3000), np.float32, seed=9)
    y = cunorm.softmax(x)
    np.testing.assert_allclose(cupy.asnumpy(y.sum(-1, dtype=np.float64)), 1.0, atol=1e-5)
    y2 = cunorm.softmax(x + 100.0)
    np.testing.assert_allclose(cupy.asnumpy(y2), cupy.asnumpy(y), rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape,axis", [((0, 5), -1), ((5, 0), -1), ((3, 0, 4), 1),
                                        ((0,), 0)])
def test_empty(shape, axis):
    x = cupy.empty(shape, dtype=np.float32)
    y = cunorm.softmax(x, axis=axis)
    assert y.shape == shape and y.dtype == np.float32


# --- out= and in place ------------------------------------------------------------------
@pytest.mark.parametrize("path", [None] + ROW_PATHS)
@pytest.mark.parametrize("cols", [24, 1000, 20000])
def test_in_place(path, cols):
    if path is not None and not can_force(path, cols, np.float32):
        pytest.skip("path unavailable")
    x, xh = random_input((33, cols), np.float32, seed=2)
    ptr = x.data.ptr
    with _dispatch.force_path(path):
        y = cunorm.log_softmax(x, out=x)
    assert y is x and x.data.ptr == ptr
    assert rel_err(cupy.asnumpy(x), reference(xh, -1, True)) <= TOL["float32"]


def test_in_place_strided_axis():
    x, xh = random_input((4, 50, 40), np.float32, seed=4)
    cunorm.softmax(x, axis=1, out=x)
    ref = reference(xh, 1, False)
    np.testing.assert_allclose(cupy.asnumpy(x), ref, rtol=1e-5, atol=1e-7)


def test_out_non_contiguous_and_overlapping():
    x, xh = random_input((16, 256), np.float32, seed=6)
    big = cupy.zeros((16, 512), np.float32)
    out = big[:, ::2]
    cunorm.softmax(x, out=out)
    np.testing.assert_allclose(cupy.asnumpy(out), reference(xh, -1, False), rtol=1e-5)
    assert float(big[:, 1::2].sum()) == 0.0  # untouched between the strided elements
    # out overlapping x with another layout: a temporary keeps the result right
    buf, bufh = random_input((17, 256), np.float32, seed=8)
    x2, out2 = buf[1:], buf[:-1]
    expect = reference(bufh[1:], -1, False)
    cunorm.softmax(x2, out=out2)
    np.testing.assert_allclose(cupy.asnumpy(out2), expect, rtol=1e-5)


def test_bad_out_is_untouched():
    x, _ = random_input((8, 64), np.float32)
    out = cupy.full((8, 64), 7.0, np.float32)
    out16 = out.astype(np.float16)
    with pytest.raises(TypeError, match="out has dtype float16; expected float32"):
        cunorm.softmax(x, out=out16)
    assert float(out16.min()) == 7.0 == float(out16.max())
    with pytest.raises(ValueError, match="out has shape"):
        cunorm.softmax(x, out=out[:4])
    with pytest.raises(TypeError, match="same kind"):
        cunorm.softmax(x, out=np.empty((8, 64), np.float32))
    with pytest.raises(TypeError, match="int32"):
        cunorm.softmax(x.astype(np.int32), out=out)
    assert float(out.min()) == 7.0 == float(out.max())
    cunorm.softmax(x)  # the context is still usable
    cupy.cuda.Device().synchronize()


# --- accuracy against torch on the same inputs ------------------------------------------
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("cols", [32, 1000, 4096, 40000])
def test_not_less_accurate_than_torch(op, dtype, cols):
    torch = pytest.importorskip("torch")
    x, xh = random_input((64, cols), dtype, seed=cols + 1, scale=5.0)
    ref = reference(xh, -1, op == "log_softmax")
    t = torch.from_dlpack(x)
    tf = torch.log_softmax if op == "log_softmax" else torch.softmax
    yt = cupy.asnumpy(cupy.from_dlpack(tf(t, -1).contiguous()))
    ours = rel_err(cupy.asnumpy(OPS[op](x)), ref)
    theirs = rel_err(yt, ref)
    # equal up to rounding ties of the output type
    assert ours <= theirs * 1.1 + 1e-15, f"cunorm {ours:.3g} vs torch {theirs:.3g}"


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(16, 1000, 64), (4, 256, 1024), (2, 40000, 16)])
def test_not_less_accurate_than_torch_over_axis_1(op, dtype, shape):
    """Non-last axes (strided paths: cached and, at 40000, the twice-read one), whose float32
    states fold in float32: no less accurate than torch over the same dimension, measured as
    the mean over the slices of the relative max-norm error (the largest of 1024 slices
    follows two close tails) against a ``long double`` reference (a float64 one rounds as
    much as float64 results do: torch's float64 softmax, computed in NumPy's order, lay 26x
    closer to it while 1.2-3x further from the ``long double`` values than cunorm's)."""
    torch = pytest.importorskip("torch")
    if dtype == np.float64 and np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        pytest.skip("long double is no wider than float64 here: no reference for float64")
    x, xh = random_input(shape, dtype, seed=shape[1], scale=5.0)
    xl = xh.astype(np.float64).astype(np.longdouble)
    with np.errstate(over="ignore"):
        z = xl - xl.max(axis=1, keepdims=True)
        ref = np.exp(z).sum(axis=1, keepdims=True)
        ref = z - np.log(ref) if op == "log_softmax" else np.exp(z) / ref
    tf = torch.log_softmax if op == "log_softmax" else torch.softmax
    yt = cupy.asnumpy(cupy.from_dlpack(tf(torch.from_dlpack(x), 1).contiguous()))
    y = cupy.asnumpy(OPS[op](x, axis=1))

    def mean_err(a):
        num = np.abs(a.astype(np.float64).astype(np.longdouble) - ref).max(axis=1)
        return float((num / np.abs(ref).max(axis=1)).astype(np.float64).mean())

    ours, theirs = mean_err(y), mean_err(yt)
    assert ours <= theirs * 1.05, f"cunorm {ours:.3g} vs torch {theirs:.3g}"


# --- frameworks -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_torch_round_trip(dtype):
    torch = pytest.importorskip("torch")
    t = torch.randn(33, 777, device="cuda", dtype=getattr(torch, dtype)) * 3
    y = cunorm.softmax(t, axis=-1)
    assert isinstance(y, torch.Tensor) and y.device == t.device and y.dtype == t.dtype
    # DESIGN section 3's measure: each row's error relative to its largest value
    assert rel_err(y.double().cpu().numpy(), torch.softmax(t.double(), -1).cpu().numpy()) \
        <= TOL[dtype]
    # zero-copy both ways: the CuPy view shares t's memory, the result shares the CuPy buffer
    assert cunorm._array.to_cupy(t, "torch", "softmax").data.ptr == t.data_ptr()
    out = torch.empty_like(t)
    r = cunorm.log_softmax(t, out=out)
    assert r is out
    torch.testing.assert_close(out.float(), torch.log_softmax(t.double(), -1).float(),
                               atol=TOL[dtype] * 20, rtol=TOL[dtype] * 2)
    ptr, want = t.data_ptr(), torch.softmax(t.double(), -1).cpu().numpy()
    cunorm.softmax(t, out=t)  # in place on a torch tensor
    assert t.data_ptr() == ptr
    assert rel_err(t.double().cpu().numpy(), want) <= TOL[dtype]


def test_torch_stream_and_dtype():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
        y = cunorm.softmax(t, dtype=torch.float32)
        ref = torch.softmax(t.float(), -1)
    s.synchronize()
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=1e-5)
    tt = torch.randn(4, 8, 16, device="cuda").transpose(1, 2)  # non-contiguous view
    torch.testing.assert_close(cunorm.softmax(tt, axis=1), torch.softmax(tt, 1),
                               atol=1e-6, rtol=1e-5)


def test_torch_stream_wrapped_without_deprecation(monkeypatch):
    """A torch stream seen for the first time is wrapped for CuPy without a deprecation
    warning (CuPy 14 deprecates ExternalStream), and the kernel runs on that stream."""
    import warnings

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cunorm._array, "_EXTERNAL_STREAMS", {})
    monkeypatch.setattr(softmax_module, "_TORCH_RECIPES", {})  # the first call of its layout
    s = torch.cuda.Stream()
    seen = []
    real = cunorm._array.framework_stream

    def spy(*args, **kwargs):
        with real(*args, **kwargs):
            seen.append(cupy.cuda.get_current_stream().ptr)
            yield

    monkeypatch.setattr(cunorm._array, "framework_stream", contextlib.contextmanager(spy))
    with torch.cuda.stream(s), warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        t = torch.randn(8, 300, device="cuda")
        y = cunorm.softmax(t)
    s.synchronize()
    assert seen == [s.cuda_stream]
    torch.testing.assert_close(y, torch.softmax(t, -1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_torch_memo(op, monkeypatch):
    """A repeated call on a CUDA tensor's layout takes the tensor memo: no CuPy view, a result
    torch allocates, the launch on torch's current stream, the full path's bits. Row and
    strided layouts; a tensor that requires grad and a CPU tensor of a memoized layout still
    take the full path and raise."""
    torch = pytest.importorskip("torch")
    fn, ref_fn = getattr(cunorm, op), getattr(torch, op)
    cases = {"rows": (lambda t: t, (96, 300), -1), "strided rows": (lambda t: t[::2], (96, 300), 1),
             "axis 0": (lambda t: t, (300, 24), 0), "NCHW axis 1": (lambda t: t, (2, 5, 4, 6), 1)}
    launched = spy_launches(monkeypatch)
    s = torch.cuda.Stream()
    for name, (layout, shape, axis) in cases.items():
        monkeypatch.setattr(softmax_module, "_TORCH_RECIPES", {})
        t = layout(torch.randn(*shape, device="cuda") * 4)
        first = fn(t, axis=axis)  # full path: registers the layout
        assert len(softmax_module._TORCH_RECIPES) == 1, name
        s.wait_stream(torch.cuda.current_stream())  # the inputs, made on the current stream
        with monkeypatch.context() as m, torch.cuda.stream(s):
            m.setattr(cunorm._array, "to_cupy", None)  # a CuPy view would fail the call
            launched.clear()
            again = fn(t, axis=axis)
            fresh = layout(torch.randn(*shape, device="cuda") * 4)
            y = fn(fresh, axis=axis)
            ref = ref_fn(fresh.double(), axis)
        s.synchronize()
        assert [stream for *_, stream in launched] == [s.cuda_stream] * 2, name
        assert again.is_contiguous() and again.dtype == t.dtype, name
        torch.testing.assert_close(again, first, atol=0, rtol=0)
        torch.testing.assert_close(y.double(), ref, atol=1e-6, rtol=1e-5)
    leaf = t.detach().clone().requires_grad_()
    with pytest.raises((RuntimeError, BufferError), match="grad"):
        fn(leaf, axis=axis)
    with pytest.raises(TypeError, match="CPU torch.Tensor"):
        fn(t.cpu(), axis=axis)


def test_memoized_layout_plans_again_under_override_constants(monkeypatch):
    """A memoized layout plans under the constants of the moment: a call inside
    override_constants launches the plan the new constants make, one after the restored
    one's (the call memo holds no plans)."""
    launched = spy_launches(monkeypatch)
    x = cupy.asarray(_rng(3).standard_normal((4096, 1024), dtype=np.float32), np.float16)
    ref = cunorm.softmax(x)
    cunorm.softmax(x)  # through the memo
    with _dispatch.override_constants({"MAX_GRID": 16}), poisoned_allocations():
        inside = cunorm.softmax(x)  # a grid of 16 blocks, into a NaN-filled result
    cunorm.softmax(x)
    assert launched[0] == launched[1] == launched[3] != launched[2], launched
    want = reference(cupy.asnumpy(x), -1, False)
    assert rel_err(cupy.asnumpy(ref), want) <= TOL["float16"]
    assert rel_err(cupy.asnumpy(inside), want) <= TOL["float16"]


def test_torch_views_match_dlpack():
    """The pointer-built CuPy view of a torch tensor (cunorm._array._torch_view) is the view
    DLPack gives, for every dtype it covers and for strided, broadcast and offset tensors;
    other dtypes and empty tensors go through DLPack."""
    torch = pytest.importorskip("torch")
    base = torch.randn(6, 10, 12, device="cuda")
    layouts = {"contiguous": lambda t: t, "transposed": lambda t: t.transpose(0, 2),
               "sliced": lambda t: t[1:5, ::3, 2:], "expanded": lambda t: t[:, :1].expand(6, 7, 12)}
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
              torch.uint8]
    for dt in dtypes:
        for name, layout in layouts.items():
            t = layout((base > 0) if dt is torch.bool else (base * 50).to(dt))
            view = cunorm._array._torch_view(t, cupy)
            ref = cupy.from_dlpack(t)
            assert view is not None, (dt, name)
            assert (view.shape, view.strides, view.dtype, view.data.ptr) == \
                (ref.shape, ref.strides, ref.dtype, ref.data.ptr), (dt, name)
            assert bool((view == ref).all()), (dt, name)
    assert cunorm._array._torch_view(base.to(torch.int32), cupy) is None
    assert cunorm._array._torch_view(base[:0], cupy) is None
    # a tensor that requires grad is refused as before (not differentiable yet), not computed
    # without a graph
    leaf = base.clone().requires_grad_()
    assert cunorm._array._torch_view(leaf, cupy) is None
    with pytest.raises((RuntimeError, BufferError), match="grad"):  # BufferError: torch 2.11
        cunorm.softmax(leaf)
    # the view keeps the tensor alive
    view = cunorm._array._torch_view(torch.full((1000,), 7.0, device="cuda"), cupy)
    torch.cuda.empty_cache()
    assert float(view.sum()) == 7000.0


def test_jax_round_trip():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    xj = jax.device_put(jnp.asarray(_rng(1).standard_normal((16, 3000)), jnp.float32), gpu)
    y = cunorm.softmax(xj)
    assert isinstance(y, jax.Array)
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.nn.softmax(xj, -1)), atol=1e-6)
    assert cunorm._array.to_cupy(xj, "jax", "softmax").data.ptr == xj.unsafe_buffer_pointer()
    with pytest.raises(TypeError, match="immutable"):
        cunorm.softmax(xj, out=xj)


# --- 64-bit indexing --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("rows,cols,path", [(2**22 + 3, 512, "warp"),
                                            (2**16 + 1, 2**15, "smem"),
                                            (2**16 + 1, 2**15, "cluster"),
                                            (2**16 + 1, 2**15, "uncached"),
                                            (2**14 + 1, 2**17, "uncached"),
                                            (2**15 + 1, 2**16, None)])
def test_more_than_2_31_elements(rows, cols, path):
    if path is not None and not can_force(path, cols, np.float16):
        pytest.skip("path unavailable")
    assert rows * cols > 2**31
    x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(np.float16)
    x *= 3
    picks = [0, 1, rows - 2, rows - 1]
    before = cupy.asnumpy(x[picks])
    with _dispatch.force_path(path):
        y = cunorm.softmax(x, out=x)  # in place: 2^31+ fp16 elements, one buffer
    after = cupy.asnumpy(y[picks])
    assert rel_err(after, reference(before, -1, False)) <= TOL["float16"]
    # (conftest frees the arrays after the test, as for every test marked slow)
