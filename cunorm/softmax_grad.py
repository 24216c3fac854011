"""softmax_backward and log_softmax_backward: validate, plan, launch; plus the NumPy reference.

The gradients of :func:`cunorm.softmax` and :func:`cunorm.log_softmax` with respect to their
input, from their output ``y`` and the gradient ``dy`` of the output. Same flow as the forward
ops: array in -> normalize (:mod:`cunorm._array`) -> plan (:mod:`cunorm._grad_dispatch`) ->
launch (``cuda_src/grad.cu``) -> array out.
"""

from __future__ import annotations

import numpy as np

from . import _array, _dispatch, _grad_dispatch
from ._cache import BoundedCache
from ._device import device_props
from ._driver_launch import POINTER, KernelLaunch, counts_clusters
from ._kernels import cluster_oracle, kernel_oracles

# (device, op, dtype, rows, cols, row strides, align, forced path)
#   -> (LaunchPlan, its KernelLaunch, the bytes of its by-value arguments)
_PLANS: dict[tuple, tuple] = BoundedCache()
# y, dy, dx, then rows, cols and the three row strides by value
_PARAMS = (POINTER, POINTER, POINTER, 8, 8, 8, 8, 8)


def softmax_backward(y, dy, axis=-1, *, out=None):
    """Gradient of :func:`softmax` with respect to its input: ``y * (dy - sum(y * dy))``.

    Parameters
    ----------
    y : cupy.ndarray, numpy.ndarray, torch.Tensor or jax.Array
        The forward's output ``softmax(x, axis)``, float16, bfloat16, float32 or float64, any
        shape and strides.
    dy : array
        Gradient of the loss with respect to ``y``: same kind, shape and dtype as ``y``.
    axis : int or tuple of int, default -1
        The axes the forward normalized over.
    out : array, optional
        Preallocated result of ``y``'s kind, shape and dtype; may be ``dy`` or ``y`` itself
        (in place).

    Returns
    -------
    array
        ``dx`` of ``y``'s shape, dtype and array type. Sums over ``axis`` are computed in
        float32 for 16-bit inputs and in float64 for float32 and float64 inputs.

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> y = cunorm.softmax(np.array([[1.0, 2.0, 3.0]]))
    >>> cunorm.softmax_backward(y, np.array([[1.0, 0.0, 0.0]])).round(4)
    array([[ 0.0819, -0.022 , -0.0599]])
    """
    return _grad(y, dy, axis, out, False, "softmax_backward")


def log_softmax_backward(y, dy, axis=-1, *, out=None):
    """Gradient of :func:`log_softmax` with respect to its input: ``dy - exp(y) * sum(dy)``.

    Parameters and return value as :func:`softmax_backward`, with ``y`` the output of
    ``log_softmax(x, axis)``.

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> y = cunorm.log_softmax(np.array([0.0, 0.0]))
    >>> cunorm.log_softmax_backward(y, np.array([1.0, 0.0]))
    array([ 0.5, -0.5])
    """
    return _grad(y, dy, axis, out, True, "log_softmax_backward")


# --- dispatch on the kind of array ------------------------------------------------------
def _grad(y, dy, axis, out, log: bool, fname: str):
    kind = _array.array_kind(y, fname, "y")
    _array.check_kind(dy, kind, fname, "dy", "y")
    if kind == "cupy":
        return _grad_cupy(y, dy, axis, out, log, fname)
    if kind == "numpy":
        return _grad_numpy(y, dy, axis, out, log, fname)
    with _array.framework_stream(y, kind, fname, "y"):
        if out is not None:
            _array.check_kind(out, kind, fname, "out", "y")
        if kind == "torch":
            _array.check_torch_on_cuda((("dy", dy), ("out", out)), fname, "y")
        yc = _array.to_cupy(y, kind, fname, "y")
        dyc = _array.to_cupy(dy, kind, fname, "dy")
        outc = None
        if out is not None:
            _array.check_out(out, kind, tuple(yc.shape), _array.dtype_name(yc.dtype), fname, "y")
            outc = _array.to_cupy(out, kind, fname, "out")
        dx = _grad_cupy(yc, dyc, axis, outc, log, fname)
        return out if out is not None else _array.from_cupy(dx, kind)


def _check(y, dy, axis, out, kind: str, fname: str) -> tuple[str, tuple[int, ...]]:
    """Validate the arguments of either array kind; returns (dtype name, sorted axes)."""
    name = _array.check_float(y.dtype, fname, "y")
    _array.check_same_dtype(dy, kind, name, fname, "dy", "y")
    if tuple(dy.shape) != tuple(y.shape):
        raise ValueError(f"{fname}(): dy has shape {tuple(dy.shape)}; expected "
                         f"{tuple(y.shape)} (the shape of y)")
    axes = _array.normalize_axes(axis, y.ndim, fname, "y")
    if out is not None:
        _array.check_out(out, kind, tuple(y.shape), name, fname, "y")
        for n, stride in zip(out.shape, out.strides, strict=True):  # (NumPy / CuPy arrays)
            if n > 1 and stride == 0:
                raise ValueError(f"{fname}(): out is a broadcast view (a stride of 0 on an "
                                 "axis longer than 1): its elements would be written more "
                                 "than once")
    return name, axes


# --- CuPy -------------------------------------------------------------------------------
def _grad_cupy(y, dy, axis, out, log: bool, fname: str):
    dev = _array.other_device(y)
    if dev is not None:  # computed on y's device, as the forward ops do
        return _array.on_device(dev, _grad_cupy, y, dy, axis, out, log, fname)
    import cupy

    name, axes = _check(y, dy, axis, out, "cupy", fname)
    _array.same_device(y, dy, fname, "dy", "y")
    if out is not None:
        _array.same_device(y, out, fname, "out", "y")
    if y.size == 0:
        return out if out is not None else cupy.empty(y.shape, y.dtype)

    if axes[0] != y.ndim - len(axes) or _array.axes_block(axes) is None:
        # The reduced axes not last: moved last (a copy of y and dy), back by a view.
        keep = [i for i in range(y.ndim) if i not in axes]
        perm = keep + list(axes)
        yt, dyt = (cupy.ascontiguousarray(a.transpose(perm)) for a in (y, dy))
        dx = _grad_cupy(yt, dyt, tuple(range(len(keep), y.ndim)), None, log,
                        fname).transpose(np.argsort(perm))
        if out is None:
            return dx
        out[...] = dx
        return out

    first = axes[0]
    rows_view = {}  # operand -> its (rows, cols) View3, copied where the rows are not one run
    for arg, arr in (("y", y), ("dy", dy)):
        strides = _array.element_strides(arr)
        view = _array.view3(arr.shape, strides, first, arr.ndim) if strides else None
        if view is None:
            arr = cupy.ascontiguousarray(arr)
            view = _array.view3(arr.shape, _array.element_strides(arr), first, arr.ndim)
        rows_view[arg] = (arr, view)
    (y, vy), (dy, vdy) = rows_view["y"], rows_view["dy"]

    dx, vdx = out, None
    if out is not None:
        strides = _array.element_strides(out)
        vdx = _array.view3(out.shape, strides, first, out.ndim) if strides else None
        for arr, view in ((y, vy), (dy, vdy)):
            if vdx is not None and _array.spans_overlap(out, arr) and (
                    out.data.ptr != arr.data.ptr or vdx != view):
                vdx = None  # shares memory with an input other than element by element
    if vdx is None:
        dx = cupy.empty(y.shape, y.dtype)
        vdx = _array.view3(dx.shape, _array.element_strides(dx), first, dx.ndim)

    op = "log_softmax_backward" if log else "softmax_backward"
    _launch(op, name, y.data.ptr, dy.data.ptr, dx.data.ptr, y.data.device_id, vy, vdy, vdx,
            cupy.cuda.get_current_stream().ptr)
    if out is not None and dx is not out:
        out[...] = dx
        return out
    return dx


def _launch(op: str, dtype: str, py: int, pdy: int, pdx: int, dev: int, vy: _array.View3,
            vdy: _array.View3, vdx: _array.View3, stream: int) -> None:
    """Launch ``op`` over the (rows, cols) views of y, dy and dx at these addresses."""
    itemsize = _dispatch.ITEMSIZE[dtype]
    lds = (vy.ld_outer, vdy.ld_outer, vdx.ld_outer)
    align = _array.pack_alignment(((py, itemsize), (pdy, itemsize), (pdx, itemsize)),
                                  _array.stride_bits(lds))
    forced = _dispatch.forced_path()
    key = (dev, op, dtype, vy.outer, vy.dim, lds, align, forced)
    entry = _PLANS.get(key)
    if entry is None:
        # the argument bytes are made once a layout: the launch copies in only a tuple it
        # does not hold already (KernelLaunch.fire)
        values = tuple(np.int64(i).tobytes() for i in (vy.outer, vy.dim, *lds))
        entry = _PLANS[key] = (*_make_plan(dev, op, dtype, vy.outer, vy.dim, align, forced),
                               values)
    entry[1].fire(stream, (py, pdy, pdx), entry[2])


def _make_plan(dev: int, op: str, dtype: str, rows: int, cols: int, align: int,
               forced: str | None):
    props = device_props(dev)
    kernel_for, occ = kernel_oracles(dev, props.arch, "grad.cu")
    # the driver's count of resident clusters, where the driver library gives it (CUDA 12+)
    clusters = cluster_oracle(dev, kernel_for) if counts_clusters() else None
    plan = _grad_dispatch.plan_grad(op, dtype, rows, cols, align, props, occ, forced,
                                    clusters)
    kernel = kernel_for(plan.kernel)
    return plan, KernelLaunch(kernel, dev, plan.grid, plan.block, _PARAMS, plan.smem)


# --- NumPy reference --------------------------------------------------------------------
def _grad_numpy(y, dy, axis, out, log: bool, fname: str):
    _, axes = _check(y, dy, axis, out, "numpy", fname)
    with np.errstate(invalid="ignore", over="ignore"):
        yf, dyf = y.astype(np.float64), dy.astype(np.float64)
        if log:
            # exp(y) near 1 cancels against a one-hot dy: there (dy - s) - expm1(y) s, as the
            # kernels compute (cuda_src/grad.cu SoftmaxGrad)
            s = dyf.sum(axis=axes, keepdims=True)
            near_one = np.abs(yf) < 0.7
            dx = np.where(near_one, (dyf - s) - np.expm1(yf) * s, dyf - np.exp(yf) * s)
        else:
            dx = yf * (dyf - (yf * dyf).sum(axis=axes, keepdims=True))
    if out is None:
        return dx.astype(y.dtype)
    out[...] = dx
    return out
