"""layer_norm_backward and rms_norm_backward: validate, plan, launch; plus the NumPy reference.

The gradients of :func:`cunorm.layer_norm` and :func:`cunorm.rms_norm` with respect to ``x``
and the affine parameters, from the forward's input ``x``, its statistics
(``return_stats=True``) and the gradient ``dy`` of its output. Same flow as the forward ops:
array in -> normalize (:mod:`cunorm._array`) -> plan (:mod:`cunorm._grad_dispatch`) -> launch
(``cuda_src/grad.cu``: ``norm_grad_rows`` for dx and the column sums of each block, then
``norm_grad_cols`` to add those up) -> arrays out.
"""

from __future__ import annotations

import math

import numpy as np

from . import _array, _dispatch, _grad_dispatch
from ._cache import BoundedCache
from ._device import device_props
from ._driver_launch import POINTER, KernelLaunch, counts_clusters
from ._kernels import cluster_oracle, kernel_oracles
from .norm import _rows_view

# (device, op, dtype, rows, cols, row strides, align, forced path)
#   -> (NormGradPlan, the rows' KernelLaunch, the DIRECT columns' or None, the final columns')
_PLANS: dict[tuple, tuple] = BoundedCache()
# norm_grad_rows: dy, x, mean, rstd, weight, dx, partial, then rows, cols, ld_dy, ld_x, ld_dx,
# prefetch
_ROWS_PARAMS = (*(POINTER,) * 7, 8, 8, 8, 8, 8, 8)
# norm_grad_cols: dy, x, mean, rstd, part_in, part_out, dweight, dbias, then rows, cols,
# ld_dy, ld_x, chunk
_COLS_PARAMS = (*(POINTER,) * 8, 8, 8, 8, 8, 8)


def layer_norm_backward(dy, x, mean, rstd, weight=None, *, axis=-1):
    """Gradients of :func:`layer_norm` with respect to ``x``, ``weight`` and ``bias``.

    With ``xhat = (x - mean) * rstd``, ``g = dy * weight`` (``dy`` without a weight) and
    means over ``axis``::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dweight = sum(dy * xhat), dbias = sum(dy)     # sums over the other axes

    Parameters
    ----------
    dy : cupy.ndarray, numpy.ndarray, torch.Tensor or jax.Array
        Gradient of the loss with respect to the forward's output: ``x``'s shape and dtype.
    x : array
        The forward's input (with a ``residual``: the ``h = x + residual`` it returned),
        float16, bfloat16, float32 or float64, any shape and strides.
    mean, rstd : array
        The forward's statistics (``layer_norm(x, ..., return_stats=True)``): ``x``'s shape
        with ``axis`` removed, float32 (float64 for float64 ``x``).
    weight : array, optional
        The forward's weight, shaped like ``x`` restricted to ``axis``, of ``x``'s dtype.
    axis : int or tuple of int, default -1
        The axes the forward normalized over.

    Returns
    -------
    dx : array
        ``x``'s shape, dtype and array type.
    dweight, dbias : array
        Shaped like ``x`` restricted to ``axis``, of ``x``'s dtype: the gradients of a weight
        and a bias, which depend on neither (returned with or without them). Sums are
        computed in float32 for 16-bit inputs and in float64 otherwise.

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> x = np.array([[1.0, 2.0, 4.0]])
    >>> y, mean, rstd = cunorm.layer_norm(x, return_stats=True)
    >>> dx, dw, db = cunorm.layer_norm_backward(np.array([[1.0, 0.0, 0.0]]), x, mean, rstd)
    >>> dx.round(4), dw.round(4), db
    (array([[ 0.2291, -0.3436,  0.1145]]), array([-1.069,  0.   ,  0.   ]), array([1., 0., 0.]))
    """
    return _norm_grad("layer_norm_backward", dy, x, mean, rstd, weight, axis)


def rms_norm_backward(dy, x, rstd, weight=None, *, axis=-1):
    """Gradients of :func:`rms_norm` with respect to ``x`` and ``weight``.

    With ``xhat = x * rstd`` and ``g = dy * weight``: ``dx = rstd * (g - xhat * mean(g *
    xhat))`` and ``dweight = sum(dy * xhat)``. Parameters as :func:`layer_norm_backward`
    without ``mean``; returns ``(dx, dweight)``.

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> x = np.array([3.0, 4.0])
    >>> y, rstd = cunorm.rms_norm(x, eps=0.0, return_stats=True)
    >>> dx, dw = cunorm.rms_norm_backward(np.array([1.0, 0.0]), x, rstd)
    >>> dx.round(4), dw.round(4)
    (array([ 0.181 , -0.1358]), array([0.8485, 0.    ]))
    """
    return _norm_grad("rms_norm_backward", dy, x, None, rstd, weight, axis)


# --- dispatch on the kind of array ------------------------------------------------------
def _norm_grad(op: str, dy, x, mean, rstd, weight, axis):
    kind = _array.array_kind(dy, op, "dy")
    named = (("x", x), ("mean", mean), ("rstd", rstd), ("weight", weight))
    for name, arr in named:
        if arr is not None:
            _array.check_kind(arr, kind, op, name, "dy")
    if kind == "cupy":
        return _norm_grad_cupy(op, dy, x, mean, rstd, weight, axis)
    if kind == "numpy":
        return _norm_grad_numpy(op, dy, x, mean, rstd, weight, axis)
    with _array.framework_stream(dy, kind, op, "dy"):
        if kind == "torch":
            _array.check_torch_on_cuda(named, op, "dy")
        conv = [None if a is None else _array.to_cupy(a, kind, op, n)
                for n, a in (("dy", dy), *named)]
        res = _norm_grad_cupy(op, *conv, axis)
        return tuple(_array.from_cupy(r, kind) for r in res)


def _check(op: str, kind: str, dy, x, mean, rstd, weight, axis):
    """Validate the arguments of either array kind; returns (dtype name, sorted axes, the
    normalized shape, the statistics' shape)."""
    name = _array.check_float(x.dtype, op, "x")
    _array.check_operand(dy, kind, tuple(x.shape), name, op, "dy")
    axes = _array.normalize_axes(axis, x.ndim, op)
    norm_shape = tuple(x.shape[a] for a in axes)
    stats_shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    stats_dtype = "float64" if name == "float64" else "float32"
    stats = (("rstd", rstd),) if op == "rms_norm_backward" else (("mean", mean), ("rstd", rstd))
    for arg, arr in stats:
        if arr is None:
            raise TypeError(f"{op}(): {arg} is None; pass the forward's statistics "
                            "(return_stats=True)")
        if tuple(arr.shape) != stats_shape:
            raise ValueError(f"{op}(): {arg} has shape {tuple(arr.shape)}; expected "
                             f"{stats_shape} (x's shape without the normalized axes)")
        got = _array.kind_dtype_name(arr, kind)
        if got != stats_dtype:
            raise TypeError(f"{op}(): {arg} has dtype {got}; expected {stats_dtype} (the "
                            f"statistics' dtype for {name} x)")
    if weight is not None:
        _array.check_operand(weight, kind, norm_shape, name, op, "weight")
    return name, axes, norm_shape, stats_shape


def _results(op: str, dx, dweight, dbias):
    return (dx, dweight) if op == "rms_norm_backward" else (dx, dweight, dbias)


# --- CuPy -------------------------------------------------------------------------------
def _norm_grad_cupy(op: str, dy, x, mean, rstd, weight, axis):
    dev = _array.other_device(x)
    if dev is not None:  # computed on x's device, as the forward ops do
        return _array.on_device(dev, _norm_grad_cupy, op, dy, x, mean, rstd, weight, axis)
    import cupy

    name, axes, norm_shape, _ = _check(op, "cupy", dy, x, mean, rstd, weight, axis)
    for arg, arr in (("dy", dy), ("mean", mean), ("rstd", rstd), ("weight", weight)):
        if arr is not None:
            _array.same_device(x, arr, op, arg)
    cols = math.prod(norm_shape)
    rows = x.size // cols if cols else 0
    if rows == 0 or cols == 0:  # no slices, or slices of nothing: sums of no terms
        zeros = cupy.zeros(norm_shape, x.dtype)
        return _results(op, cupy.empty(x.shape, x.dtype), zeros, zeros.copy())

    k = len(axes)
    perm = [i for i in range(x.ndim) if i not in axes] + list(axes)
    trailing = perm == list(range(x.ndim))
    xs, ldx = _rows_view(x if trailing else x.transpose(perm), k)
    dys, lddy = _rows_view(dy if trailing else dy.transpose(perm), k)
    dx = cupy.empty(xs.shape, x.dtype)
    stats = [None if a is None else cupy.ascontiguousarray(a).reshape(rows) for a in (mean, rstd)]
    w = None if weight is None else cupy.ascontiguousarray(weight).reshape(cols)
    dweight = cupy.empty(norm_shape, x.dtype)
    dbias = cupy.empty(norm_shape, x.dtype) if op == "layer_norm_backward" else None
    _launch(op, name, x.data.device_id, cupy.cuda.get_current_stream().ptr, rows, cols,
            (dys, xs, *stats, w, dx), (lddy, ldx), dweight, dbias)
    if not trailing:
        dx = dx.transpose([int(i) for i in np.argsort(perm)])
    return _results(op, dx, dweight, dbias)


def _launch(op: str, dtype: str, dev: int, stream: int, rows: int, cols: int, arrays: tuple,
            lds: tuple[int, int], dweight, dbias) -> None:
    """Launch ``op``'s kernels on ``arrays`` = (dy, x, mean, rstd, weight, dx) as (rows, cols)
    views (mean and weight may be None) with row strides ``lds`` = (ld_dy, ld_x); dx is
    contiguous. The column sums go to ``dweight`` and ``dbias`` (None for rms_norm)."""
    import cupy

    itemsize = _dispatch.ITEMSIZE[dtype]
    dys, xs, mean, rstd, w, dx = arrays
    ptrs = [0 if a is None else a.data.ptr for a in arrays]
    align = _array.pack_alignment(tuple((p, itemsize) for p in (ptrs[0], ptrs[1], ptrs[4],
                                                                 ptrs[5]) if p),
                                  _array.stride_bits((*lds, cols)))
    forced = _dispatch.forced_path()
    key = (dev, op, dtype, rows, cols, lds, align, forced)
    entry = _PLANS.get(key)
    if entry is None:
        entry = _PLANS[key] = _make_plan(dev, op, dtype, rows, cols, lds, align, forced)
    plan, (rows_launch, rows_values), direct, (final_launch, final_values) = entry
    acc = np.float32 if itemsize == 2 else np.float64
    partial = cupy.empty((1 if dbias is None else 2, plan.partial_rows, cols), acc)
    rows_launch.fire(stream, (*ptrs, partial.data.ptr if plan.hold else 0), rows_values)
    if direct is not None:
        direct[0].fire(stream, (*ptrs[:4], 0, partial.data.ptr, 0, 0), direct[1])
    final_launch.fire(stream, (0, 0, 0, 0, partial.data.ptr, 0, dweight.data.ptr,
                               0 if dbias is None else dbias.data.ptr), final_values)


def _values(*ints: int) -> tuple[bytes, ...]:
    """The bytes of by-value int64 arguments (made once a layout and kept with its plan: a
    launch copies in only a tuple it does not hold already)."""
    return tuple(np.int64(i).tobytes() for i in ints)


def _make_plan(dev: int, op: str, dtype: str, rows: int, cols: int, lds: tuple[int, int],
               align: int, forced: str | None):
    """(plan, (rows launch, its values), (DIRECT launch, its values) or None, (final launch,
    its values))."""
    props = device_props(dev)
    kernel_for, occ = kernel_oracles(dev, props.arch, "grad.cu")
    # the driver's count of resident clusters, where the driver library gives it (CUDA 12+)
    clusters = cluster_oracle(dev, kernel_for) if counts_clusters() else None
    plan = _grad_dispatch.plan_norm_grad(op, dtype, rows, cols, align, props, occ, forced,
                                         clusters)
    r = plan.rows
    rows_launch = KernelLaunch(kernel_for(r.kernel), dev, r.grid, r.block, _ROWS_PARAMS, r.smem)
    block = _grad_dispatch.NORM_GRAD_COLS_BLOCK
    direct = None
    if plan.direct is not None:
        name, grid, chunk = plan.direct
        direct = (KernelLaunch(kernel_for(name), dev, grid, block, _COLS_PARAMS),
                  _values(rows, cols, *lds, chunk))
    final = KernelLaunch(kernel_for(plan.final[0]), dev, plan.final[1], block, _COLS_PARAMS)
    return (plan, (rows_launch, _values(rows, cols, *lds, cols, plan.prefetch)), direct,
            (final, _values(plan.partial_rows, cols, 0, 0, 0)))


# --- NumPy reference --------------------------------------------------------------------
def _norm_grad_numpy(op: str, dy, x, mean, rstd, weight, axis):
    name, axes, norm_shape, _ = _check(op, "numpy", dy, x, mean, rstd, weight, axis)
    keep = tuple(i for i in range(x.ndim) if i not in axes)
    kdims = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    wdims = tuple(n if i in axes else 1 for i, n in enumerate(x.shape))
    xf, dyf = x.astype(np.float64), dy.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        rs = rstd.astype(np.float64).reshape(kdims)
        xc = xf if mean is None else xf - mean.astype(np.float64).reshape(kdims)
        xh = xc * rs
        g = dyf if weight is None else dyf * weight.astype(np.float64).reshape(wdims)
        if x.size:
            c2 = (g * xh).mean(axis=axes, keepdims=True)
            c1 = 0.0 if mean is None else g.mean(axis=axes, keepdims=True)
            dx = rs * (g - c1 - xh * c2)
        else:
            dx = np.empty(x.shape)
        dweight = (dyf * xh).sum(axis=keep).reshape(norm_shape)
        dbias = dyf.sum(axis=keep).reshape(norm_shape)
    dtype = x.dtype
    return _results(op, dx.astype(dtype), dweight.astype(dtype), dbias.astype(dtype))
