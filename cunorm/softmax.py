"""softmax and log_softmax: validate, plan, launch; plus the NumPy reference path.

Data flows one way: array in -> normalize (:mod:`cunorm._array`) -> plan
(:mod:`cunorm._dispatch`) -> launch (``cuda_src/softmax.cu``) -> array out.
"""

from __future__ import annotations

import numpy as np

from . import _array, _dispatch
from ._cache import BoundedCache
from ._device import device_props
from ._driver_launch import POINTER, KernelLaunch
from ._kernels import get_kernel, occupancy

# (device, log, src, dst, outer, dim, inner, align, forced path)
#   -> (LaunchPlan, kernel, its KernelLaunch)
_PLANS: dict[tuple, tuple] = BoundedCache()


def softmax(x, axis=-1, *, dtype=None, out=None):
    """Softmax over ``axis``: ``exp(x - max) / sum(exp(x - max))``.

    Parameters
    ----------
    x : cupy.ndarray, numpy.ndarray, torch.Tensor or jax.Array
        Input of dtype float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64, any
        shape and strides. GPU inputs run the CUDA kernels; NumPy inputs run the NumPy
        reference path (float64 arithmetic).
    axis : int or tuple of int, default -1
        Axes to normalize over (negative allowed).
    dtype : dtype, optional
        Output dtype (e.g. float32 from a float16 input). Default: ``x.dtype``.
    out : array, optional
        Preallocated result of ``x``'s shape and kind and of dtype ``dtype``; may be ``x``
        itself (in place).

    Returns
    -------
    array
        Same shape as ``x``, same array type (CuPy, NumPy, torch, JAX). Each slice along
        ``axis`` sums to 1. A slice holding NaN or +inf is all NaN; an all ``-inf`` slice is
        NaN (as NumPy, SciPy and PyTorch).

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> cunorm.softmax(np.array([[1.0, 2.0, 3.0]])).round(4)
    array([[0.09  , 0.2447, 0.6652]])
    """
    return _softmax_family(x, axis, dtype, out, False, "softmax")


def log_softmax(x, axis=-1, *, dtype=None, out=None):
    """Log-softmax over ``axis``: ``x - max - log(sum(exp(x - max)))``.

    Parameters and return value as :func:`softmax`.

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> cunorm.log_softmax(np.array([0.0, 0.0], dtype=np.float32))
    array([-0.6931472, -0.6931472], dtype=float32)
    """
    return _softmax_family(x, axis, dtype, out, True, "log_softmax")


# --- dispatch on the kind of array ------------------------------------------------------
def _softmax_family(x, axis, dtype, out, log: bool, fname: str):
    kind = _array.array_kind(x, fname)
    if kind == "cupy":
        return _softmax_cupy(x, axis, dtype, out, log, fname)
    if kind == "numpy":
        return _softmax_numpy(x, axis, dtype, out, log, fname)
    # Only a plain int axis takes the memo (True or 1.0 would hash like 1).
    torch_key = None
    if kind == "torch" and out is None and dtype is None and type(axis) is int:
        torch_key = (x.shape, x.stride(), x.dtype, _array.cuda_index(x), axis, log)
        y = _softmax_torch_memo(x, torch_key)
        if y is not None:
            return y
    # torch / jax: compute on a zero-copy CuPy view, on the framework's stream
    with _array.framework_stream(x, kind, fname):
        xc = _array.to_cupy(x, kind, fname)
        outc = None
        if out is not None:
            dst = _array.dtype_name(xc.dtype if dtype is None else _frame_dtype(dtype, fname))
            _array.check_out(out, kind, tuple(xc.shape), dst, fname)
            outc = _array.to_cupy(out, kind, fname, "out")
        y = _softmax_cupy(xc, axis, dtype if dtype is None else _frame_dtype(dtype, fname),
                          outc, log, fname)
        if torch_key is not None:
            recipe = _RECIPES.get(_recipe_key(xc, axis, log))
            if recipe is not None:  # the view went straight to a kernel: memoize the tensor
                _TORCH_RECIPES[torch_key] = recipe
        return out if out is not None else _array.from_cupy(y, kind)


def _softmax_torch_memo(x, key: tuple):
    """The result for a CUDA tensor whose layout a call has met before, launched on its
    pointer into a tensor torch allocates, without CuPy views, with the tensor's device
    current; None on a miss (or a tensor that requires grad: the full path then raises)."""
    recipe = _TORCH_RECIPES.get(key)
    if recipe is None or x.requires_grad:
        return None
    dev = key[3]
    stream = _array.torch_launch_stream(dev)
    if stream is None:  # the tensor is on another device than the current one
        return _array.torch_on_device(dev, _softmax_torch_memo, x, key)
    import torch

    y = torch.empty(x.shape, dtype=x.dtype, device=dev)  # C-contiguous, as the recipe's y
    _launch(x.data_ptr(), y.data_ptr(), dev, recipe, stream)
    return y


def _frame_dtype(dtype, fname: str):
    """``dtype=`` given as a torch / JAX dtype or anything NumPy understands."""
    text = str(dtype).replace("torch.", "")
    return _array.resolve_dtype(text if text in _array.FLOAT_DTYPES else dtype, fname)


# --- CuPy -------------------------------------------------------------------------------
# Hot-path memo: (shape, strides, dtype, axis, log) of a call with no dtype= and no out= that
# went straight to a kernel -> _Recipe. A hit skips every check the first call already made
# (same array kind, dtype, axes and layout); only the pointers and the device are new.
_RECIPES: dict[tuple, _Recipe] = BoundedCache()
# The same for CUDA torch tensors: (shape, element strides, torch dtype, device index, axis,
# log) -> the _Recipe of their CuPy view. A hit builds no CuPy view and no DLPack capsule
# (52.5 -> 13.8 us of host time for an (8, 128) float32 softmax on an H200 host).
_TORCH_RECIPES: dict[tuple, _Recipe] = BoundedCache()


def _recipe_key(x, axis: int, log: bool) -> tuple:
    """_RECIPES's key of a CuPy array ``x``."""
    return (x.shape, x.strides, x.dtype, axis, log)


class _Recipe:
    """What a (layout, op) pair needs at launch: dtypes, views and the bytes of the kernel's
    integer arguments."""

    __slots__ = ("src", "dst", "dst_dt", "vx", "vy", "values", "stride_bits", "log",
                 "itemsizes")

    def __init__(self, src, dst, dst_dt, vx, vy, log):
        self.src, self.dst, self.dst_dt, self.vx, self.vy, self.log = src, dst, dst_dt, vx, vy, log
        self.itemsizes = (_dispatch.ITEMSIZE[src], _dispatch.ITEMSIZE[dst])
        if vx.inner > 1:
            ints = (vx.outer, vx.dim, vx.inner, vx.ld_outer, vx.ld_dim, vy.ld_outer, vy.ld_dim)
            strides = (vx.ld_outer, vy.ld_outer, vx.ld_dim, vy.ld_dim)
        else:
            ints = (vx.outer, vx.dim, vx.ld_outer, vy.ld_outer)
            strides = (vx.ld_outer, vy.ld_outer)
        self.values = tuple(np.int64(i).tobytes() for i in ints)
        self.stride_bits = _array.stride_bits(strides)


def _softmax_cupy(x, axis, dtype, out, log: bool, fname: str):
    dev = _array.other_device(x)
    if dev is not None:  # computed on x's device (the CuPy entry and the frameworks' views)
        return _array.on_device(dev, _softmax_cupy, x, axis, dtype, out, log, fname)
    # Only a plain int axis takes the memo: True or 1.0 would hash like 1 and skip the checks.
    if out is None and dtype is None and type(axis) is int:
        recipe = _RECIPES.get(_recipe_key(x, axis, log))
        if recipe is not None:
            import cupy

            y = cupy.ndarray(x.shape, recipe.dst_dt)  # cupy.empty without its Python frame
            _launch(x.data.ptr, y.data.ptr, x.data.device_id, recipe,
                    cupy.cuda.get_current_stream().ptr)
            return y
    return _softmax_cupy_checked(x, axis, dtype, out, log, fname)


def _softmax_cupy_checked(x, axis, dtype, out, log: bool, fname: str):
    import cupy

    src = _array.check_float(x.dtype, fname, "x")
    dst_dt = x.dtype if dtype is None else _array.resolve_dtype(dtype, fname)
    dst = _array.dtype_name(dst_dt)
    axes = _array.normalize_axes(axis, x.ndim, fname)
    if out is not None:
        _array.check_out(out, "cupy", x.shape, dst, fname)
        _array.same_device(x, out, fname, "out")
    if x.size == 0:
        return out if out is not None else cupy.empty(x.shape, dst_dt)

    if (src, dst) not in _dispatch.KERNEL_DTYPE_PAIRS:
        if np.dtype(dst_dt).itemsize > x.itemsize:  # e.g. float32 -> float64: compute wide
            return _softmax_cupy_checked(x.astype(dst_dt), axes, None, out, log, fname)
        y = _softmax_cupy_checked(x, axes, None, None, log, fname)  # narrowing: round once
        if out is None:
            return y.astype(dst_dt)
        out[...] = y
        return out

    block = _array.axes_block(axes)
    if block is None:
        # Axes that are not one consecutive block: move them last (one copy), reduce, move back.
        keep = [i for i in range(x.ndim) if i not in axes]
        perm = keep + list(axes)
        xt = cupy.ascontiguousarray(x.transpose(perm))
        yt = _softmax_cupy_checked(xt, tuple(range(len(keep), x.ndim)), dtype, None, log, fname)
        y = yt.transpose(np.argsort(perm))
        if out is None:
            return y
        out[...] = y
        return out

    xs = _array.element_strides(x)
    vx = _array.view3(x.shape, xs, *block) if xs is not None else None
    copied = vx is None
    if copied:
        x = cupy.ascontiguousarray(x)
        vx = _array.view3(x.shape, _array.element_strides(x), *block)

    y = out
    vy = None
    if out is not None:
        ys = _array.element_strides(out)
        vy = _array.view3(out.shape, ys, *block) if ys is not None else None
        if vy is not None and out.data.ptr != x.data.ptr and _array.spans_overlap(x, out):
            vy = None  # partial overlap with x: not the same elements, use a temporary
        if vy is not None and out.data.ptr == x.data.ptr and vy != vx:
            vy = None  # same memory, other layout
    if vy is None:
        y = cupy.empty(x.shape, dst_dt)
        vy = _array.view3(y.shape, _array.element_strides(y), *block)

    recipe = _Recipe(src, dst, dst_dt, vx, vy, log)
    if out is None and dtype is None and not copied and type(axis) is int:
        _RECIPES[_recipe_key(x, axis, log)] = recipe
    _launch(x.data.ptr, y.data.ptr, x.data.device_id, recipe,
            cupy.cuda.get_current_stream().ptr)
    if out is not None and y is not out:
        out[...] = y
        return out
    return y


def _launch(px: int, py: int, dev: int, r: _Recipe, stream: int) -> None:
    """Launch recipe ``r`` on x at address ``px`` and y at ``py`` (device ``dev``, the current
    one) on stream handle ``stream``."""
    src_size, dst_size = r.itemsizes
    align = _array.pack_alignment(((px, src_size), (py, dst_size)), r.stride_bits)
    forced = _dispatch.forced_path()
    vx = r.vx
    key = (dev, r.log, r.src, r.dst, vx.outer, vx.dim, vx.inner, align, forced)
    entry = _PLANS.get(key)
    if entry is None:
        entry = _PLANS[key] = _make_plan(dev, r.log, r.src, r.dst, vx, align, forced)
    entry[2].fire(stream, (px, py), r.values)


def _make_plan(dev: int, log: bool, src: str, dst: str, v: _array.View3, align: int,
               forced: str | None):
    props = device_props(dev)
    op = "log_softmax" if log else "softmax"

    def kernel_for(name: str):
        return get_kernel(dev, props.arch, "softmax.cu", name,
                          smem_optin=props.smem_per_block_optin)

    def occ(name: str, block: int, smem: int) -> int:
        return occupancy(kernel_for(name), block, smem)

    if v.inner > 1:
        force = forced if forced in _dispatch.STRIDED_PATHS else None
        plan = _dispatch.plan_strided(op, src, dst, v.outer, v.dim, v.inner, align, props, occ,
                                      force)
    else:
        force = forced if forced in _dispatch.ROW_PATHS else None
        plan = _dispatch.plan_rows(op, src, dst, v.outer, v.dim, align, props, occ, force)
    kernel = kernel_for(plan.kernel)
    # x, y, then the int64 shape and strides (_Recipe.values); a strided kernel's int tx_count
    # is the plan's
    params = ((POINTER, POINTER, *(8,) * 7, np.int32(plan.tx_count).tobytes()) if v.inner > 1
              else (POINTER, POINTER, *(8,) * 4))
    return plan, kernel, KernelLaunch(kernel, dev, plan.grid, plan.block, params, plan.smem)


# --- NumPy reference --------------------------------------------------------------------
def _softmax_numpy(x, axis, dtype, out, log: bool, fname: str):
    _array.check_float(x.dtype, fname, "x")
    dst_dt = x.dtype if dtype is None else _array.resolve_dtype(dtype, fname)
    axes = _array.normalize_axes(axis, x.ndim, fname)
    if out is not None:
        _array.check_out(out, "numpy", x.shape, _array.dtype_name(dst_dt), fname)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        xf = x.astype(np.float64)
        z = xf - (xf.max(axis=axes, keepdims=True) if x.size else 0.0)
        e = np.exp(z)
        s = e.sum(axis=axes, keepdims=True)
        y = z - np.log(s) if log else e / s
    if out is None:
        return y.astype(dst_dt)
    out[...] = y
    return out
