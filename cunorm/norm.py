"""layer_norm and rms_norm (optionally fused with a residual add): validate, plan, launch; plus
the NumPy reference path.

Data flows one way: array in -> normalize (:mod:`cunorm._array`) -> plan
(:mod:`cunorm._dispatch`) -> launch (``cuda_src/norm.cu`` on the row paths of ``rows.cuh``)
-> array out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from . import _array, _dispatch
from ._cache import BoundedCache
from ._device import device_props
from ._driver_launch import POINTER, KernelLaunch
from ._kernels import get_kernel, occupancy, set_carveout

# (device, op, dtype, rows, cols, align, residual, forced path)
#   -> (kernel, its KernelLaunch, LaunchPlan)
_PLANS: dict[tuple, tuple] = BoundedCache()


def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, out=None, return_stats=False,
               residual=None):
    """Layer normalization over ``axis``: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Parameters
    ----------
    x : cupy.ndarray, numpy.ndarray, torch.Tensor or jax.Array
        Input of dtype float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64, any
        shape and strides. GPU inputs run the CUDA kernels; NumPy inputs run the NumPy
        reference path (float64 arithmetic).
    weight, bias : array, optional
        Affine parameters shaped like ``x`` restricted to ``axis`` (``x.shape[-1:]`` for the
        default), of ``x``'s dtype and array kind.
    axis : int or tuple of int, default -1
        Axes to normalize over (negative allowed).
    eps : float, default 1e-5
        Added to the variance; finite and >= 0.
    out : array, optional
        Preallocated result of ``x``'s shape, dtype and kind; may be ``x`` itself.
    return_stats : bool, default False
        Also return the per-slice ``mean`` and ``rstd = 1 / sqrt(var + eps)``, shaped like
        ``x`` with ``axis`` removed, in the compute dtype (float32; float64 for float64 ``x``).
    residual : array, optional
        Pre-norm transformer block: normalize ``h = x + residual`` (rounded to ``x``'s dtype)
        and also return ``h``, in one pass over memory. Same shape, dtype and kind as ``x``.

    Returns
    -------
    y : array
        Same shape, dtype and array type as ``x``.
    h : array
        ``x + residual``, only if ``residual`` is given.
    mean, rstd : array
        Only if ``return_stats``.

    The result is ``y``, or the tuple ``(y, h, mean, rstd)`` restricted to what was asked.
    A slice holding NaN or inf gives NaN in that slice only (:func:`rms_norm`: an inf gives
    NaN at its own position and 0 elsewhere in the slice, as ``x / sqrt(mean(x**2))``).

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> cunorm.layer_norm(np.array([[1.0, 2.0, 3.0]]), eps=0.0).round(4)
    array([[-1.2247,  0.    ,  1.2247]])
    >>> y, h = cunorm.layer_norm(np.ones((2, 4), np.float32), residual=np.ones((2, 4), np.float32))
    >>> h[0]
    array([2., 2., 2., 2.], dtype=float32)
    """
    return _norm_family("layer_norm", x, weight, bias, axis, eps, out, return_stats, residual)


def rms_norm(x, weight=None, *, axis=-1, eps=1e-6, out=None, return_stats=False, residual=None):
    """RMS normalization over ``axis``: ``x / sqrt(mean(x**2) + eps) * weight``.

    Parameters and return value as :func:`layer_norm`, without ``bias``; ``return_stats``
    adds ``rstd`` only: ``(y, rstd)``, or ``(y, h, rstd)`` with a ``residual``.

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> cunorm.rms_norm(np.array([3.0, 4.0]), eps=0.0).round(4)
    array([0.8485, 1.1314])
    """
    return _norm_family("rms_norm", x, weight, None, axis, eps, out, return_stats, residual)


# --- validation shared by every array kind ----------------------------------------------
@dataclass(frozen=True)
class _Call:
    """A validated call: what every backend needs besides the arrays."""

    op: str
    dtype: str
    axes: tuple[int, ...]
    norm_shape: tuple[int, ...]  # x.shape restricted to axes (weight / bias shape)
    stats_shape: tuple[int, ...]  # x.shape with axes removed
    eps: float
    return_stats: bool

    @property
    def rms(self) -> bool:
        return self.op == "rms_norm"

    @property
    def stats_dtype(self) -> str:
        return "float64" if self.dtype == "float64" else "float32"


def _check_eps(eps: object, fname: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fname}(): eps must be a real number, got {eps!r}")
    try:
        value = float(eps)
    except OverflowError:  # an int beyond float range
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{fname}(): eps must be finite and >= 0, got {eps!r}")
    return value


def _validate(op: str, kind: str, x, weight, bias, axis, eps, out, return_stats,
              residual) -> _Call:
    """Check every argument against ``x`` (a NumPy or CuPy array of kind ``kind``); nothing
    is computed."""
    dtype = _array.check_float(x.dtype, op, "x")
    axes = _array.normalize_axes(axis, x.ndim, op)
    shape = tuple(x.shape)
    norm_shape = tuple(shape[a] for a in axes)
    for name, arr, want in (("weight", weight, norm_shape), ("bias", bias, norm_shape),
                            ("residual", residual, shape)):
        if arr is None:
            continue
        _array.check_operand(arr, kind, want, dtype, op, name)
    if not isinstance(return_stats, (bool, np.bool_)):
        raise TypeError(f"{op}(): return_stats must be a bool, got {return_stats!r}")
    value = _check_eps(eps, op)
    if out is not None:
        _array.check_out(out, kind, shape, dtype, op)
    stats_shape = tuple(n for i, n in enumerate(shape) if i not in axes)
    return _Call(op, dtype, axes, norm_shape, stats_shape, value, bool(return_stats))


def _results(call: _Call, y, h, mean, rstd):
    """The documented return value: y, then h (residual), then the statistics."""
    res = [y]
    if h is not None:
        res.append(h)
    if call.return_stats:
        if not call.rms:
            res.append(mean)
        res.append(rstd)
    return y if len(res) == 1 else tuple(res)


# --- dispatch on the kind of array ------------------------------------------------------
def _norm_family(op, x, weight, bias, axis, eps, out, return_stats, residual):
    kind = _array.array_kind(x, op)
    if kind == "cupy":
        dev = _array.other_device(x)
        if dev is not None:
            return _array.on_device(dev, _norm_family, op, x, weight, bias, axis, eps, out,
                                    return_stats, residual)
        if out is None:
            res = _norm_cupy_memo(op, x, weight, bias, axis, eps, return_stats, residual)
            if res is not None:
                return res
    torch_key = None
    if kind == "torch" and out is None and all(
            a is None or type(a).__module__.startswith("torch") for a in (weight, bias, residual)):
        torch_key = _recipe_key(op, x, weight, bias, axis, eps, return_stats, residual,
                                _torch_layout)
        res = _norm_torch_memo(torch_key, x, weight, bias, residual)
        if res is not None:
            return res
    named = (("weight", weight), ("bias", bias), ("residual", residual), ("out", out))
    if kind in ("numpy", "cupy"):
        call = _validate(op, kind, x, weight, bias, axis, eps, out, return_stats, residual)
        if kind == "numpy":
            return _norm_numpy(call, x, weight, bias, out, residual)
        for name, arr in named:
            if arr is not None:
                _array.same_device(x, arr, op, name)
        key = None if out is not None else _recipe_key(op, x, weight, bias, axis, eps,
                                                        return_stats, residual)
        return _norm_cupy(call, x, weight, bias, out, residual, key)
    # torch / jax: every array of x's kind, then validated and computed as zero-copy CuPy
    # views, on the framework's stream.
    for name, arr in named:
        if arr is not None:
            _array.check_kind(arr, kind, op, name)
    if out is not None and kind == "jax":
        _array.check_out(out, kind, tuple(x.shape), "", op)  # raises: JAX arrays are immutable
    with _array.framework_stream(x, kind, op):
        xc = _array.to_cupy(x, kind, op)
        conv = {name: None if arr is None else _array.to_cupy(arr, kind, op, name)
                for name, arr in named}
        res = _norm_family(op, xc, conv["weight"], conv["bias"], axis, eps, conv["out"],
                           return_stats, conv["residual"])
        if torch_key is not None:
            recipe = _RECIPES.get(_recipe_key(op, xc, conv["weight"], conv["bias"], axis, eps,
                                              return_stats, conv["residual"]))
            if recipe is not None:  # the views went straight to a kernel: memoize the tensors
                _TORCH_RECIPES[torch_key] = recipe
        parts = list(res) if isinstance(res, tuple) else [res]
        wrapped = [out if (i == 0 and out is not None) else _array.from_cupy(p, kind)
                   for i, p in enumerate(parts)]
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)


# --- CuPy -------------------------------------------------------------------------------
# Hot-path memo, as softmax's: the layouts of a call with no out= whose operands went
# straight to the kernel (trailing axes, row views without copies, contiguous weight and
# bias) -> (_Call, ldx, ldr, rows, cols). A hit skips validation and the layout work the first
# call did (~35 us of host time on short rows, more than the kernel); only the pointers and
# the device are new. Only plain int axes and Python float eps take it (True and 1.0 would
# hash like 1).
_RECIPES: dict[tuple, tuple] = BoundedCache()


# The same for CUDA torch tensors: the key holds each tensor's shape, element strides, dtype
# and device; the recipe is their CuPy views'. A hit builds no CuPy view and no DLPack capsule;
# torch allocates the results.
_TORCH_RECIPES: dict[tuple, tuple] = BoundedCache()


def _layout(a) -> tuple | None:
    return None if a is None else (a.shape, a.strides, a.dtype, type(a))


def _torch_layout(a) -> tuple | None:
    return None if a is None else (a.shape, a.stride(), a.dtype, _array.cuda_index(a))


def _recipe_key(op, x, weight, bias, axis, eps, return_stats, residual,
                layout=_layout) -> tuple | None:
    if type(axis) is not int or type(eps) is not float or type(return_stats) is not bool:
        return None
    return (op, *layout(x), axis, eps, return_stats, layout(weight), layout(bias),
            layout(residual))


def _norm_torch_memo(key, x, weight, bias, residual):
    """The results for CUDA tensors whose layouts a call has met before, launched on their
    pointers into tensors torch allocates, with their device current; None on a miss (or a
    tensor that requires grad: the full path then raises)."""
    recipe = None if key is None else _TORCH_RECIPES.get(key)
    if recipe is None:
        return None
    operands = (x, weight, bias, residual)
    if any(a is not None and a.requires_grad for a in operands):
        return None
    dev = key[4]  # (op, x's shape, strides, dtype, device, ...)
    stream = _array.torch_launch_stream(dev)
    if stream is None:  # the tensors are on another device than the current one
        return _array.torch_on_device(dev, _norm_torch_memo, key, x, weight, bias, residual)
    import torch

    call, ldx, ldr, rows, cols = recipe
    y = torch.empty(x.shape, dtype=x.dtype, device=dev)
    h = None if residual is None else torch.empty(x.shape, dtype=x.dtype, device=dev)
    stats_dt = torch.float64 if call.stats_dtype == "float64" else torch.float32
    stats = call.return_stats
    mean = torch.empty(rows, dtype=stats_dt, device=dev) if stats and not call.rms else None
    rstd = torch.empty(rows, dtype=stats_dt, device=dev) if stats else None
    pointers = tuple(0 if a is None else a.data_ptr()
                     for a in (x, y, weight, bias, residual, h, mean, rstd))
    _launch(call, dev, stream, pointers, ldx, cols, ldr, rows, cols)
    shape = call.stats_shape
    return _results(call, y, h, None if mean is None else mean.reshape(shape),
                    None if rstd is None else rstd.reshape(shape))


def _norm_cupy_memo(op, x, weight, bias, axis, eps, return_stats, residual):
    """The result through the memo, or None on a miss (or operands on other devices: the
    checked path then raises)."""
    key = _recipe_key(op, x, weight, bias, axis, eps, return_stats, residual)
    recipe = _RECIPES.get(key) if key is not None else None
    if recipe is None:
        return None
    dev = x.data.device_id
    if any(a is not None and a.data.device_id != dev for a in (weight, bias, residual)):
        return None
    import cupy

    call, ldx, ldr, rows, cols = recipe
    empty = cupy.ndarray  # cupy.empty without its Python frame
    y = empty(x.shape, x.dtype)
    h = None if residual is None else empty(x.shape, x.dtype)
    stats_dt = np.dtype(call.stats_dtype)
    mean = empty(rows, stats_dt) if return_stats and not call.rms else None
    rstd = empty(rows, stats_dt) if return_stats else None
    _launch(call, dev, cupy.cuda.get_current_stream().ptr,
            _pointers(x, y, weight, bias, residual, h, mean, rstd), ldx, cols, ldr, rows, cols)
    shape = call.stats_shape
    return _results(call, y, h, None if mean is None else mean.reshape(shape),
                    None if rstd is None else rstd.reshape(shape))


def _norm_cupy(call: _Call, x, weight, bias, out, residual, memo_key=None):
    import cupy

    stats_dt = np.dtype(call.stats_dtype)
    if x.size == 0:
        y = out if out is not None else cupy.empty(x.shape, x.dtype)
        h = None if residual is None else x + residual
        # A slice with no elements has no mean (NumPy: NaN); an empty batch has no slices.
        mean = cupy.full(call.stats_shape, np.nan, stats_dt)
        rstd = cupy.full(call.stats_shape, np.nan, stats_dt)
        return _results(call, y, h, mean, rstd)

    # Reduced axes last and contiguous: a (rows, cols) view, without a copy when x's strides
    # allow one (the usual trailing axes); otherwise one copy in, one copy out.
    ndim, k = x.ndim, len(call.axes)
    trailing = call.axes == tuple(range(ndim - k, ndim))
    perm = [i for i in range(ndim) if i not in call.axes] + list(call.axes)
    xs = x if trailing else x.transpose(perm)
    rs = None if residual is None else (residual if trailing else residual.transpose(perm))
    cols = math.prod(call.norm_shape)
    rows = x.size // cols
    xs, ldx = _rows_view(xs, k)
    rs, ldr = (None, 0) if rs is None else _rows_view(rs, k)

    y = (_direct_out(out, k, xs, ldx, rs, (weight, bias)) if out is not None and trailing
         else None)
    ldy = None if y is None else _row_stride(y, k)
    if y is None:
        y = cupy.empty(xs.shape, x.dtype)
        ldy = cols
    h = None if rs is None else cupy.empty(xs.shape, x.dtype)
    stats = call.return_stats
    mean = cupy.empty(rows, stats_dt) if stats and not call.rms else None
    rstd = cupy.empty(rows, stats_dt) if stats else None
    w = None if weight is None else cupy.ascontiguousarray(weight).reshape(cols)
    b = None if bias is None else cupy.ascontiguousarray(bias).reshape(cols)

    _launch(call, x.data.device_id, cupy.cuda.get_current_stream().ptr,
            _pointers(xs, y, w, b, rs, h, mean, rstd), ldx, ldy, ldr, rows, cols)
    if (memo_key is not None and trailing and xs is x and (rs is None or rs is residual)
            and (w is None or w.data.ptr == weight.data.ptr)
            and (b is None or b.data.ptr == bias.data.ptr)):
        _RECIPES[memo_key] = (call, ldx, ldr, rows, cols)

    if not trailing:
        inv = [int(i) for i in np.argsort(perm)]
        y = y.transpose(inv)
        h = None if h is None else h.transpose(inv)
    if out is not None and y is not out:
        out[...] = y
        y = out
    shape = call.stats_shape
    return _results(call, y, h, None if mean is None else mean.reshape(shape),
                    None if rstd is None else rstd.reshape(shape))


def _row_stride(a, k: int) -> int | None:
    """Row stride (elements) of ``a`` seen as (rows, cols) over its last ``k`` axes with
    unit-stride rows, or None if its strides allow no such view."""
    strides = _array.element_strides(a)
    if strides is None:
        return None
    v = _array.view3(tuple(a.shape), strides, a.ndim - k, a.ndim)
    return None if v is None or v.inner != 1 else v.ld_outer


def _rows_view(a, k: int):
    """(a, row stride) for the kernels: ``a`` itself, or a contiguous copy when its strides
    allow no (rows, cols) view over the last ``k`` axes."""
    import cupy

    ld = _row_stride(a, k)
    if ld is None:
        a = cupy.ascontiguousarray(a)
        ld = _row_stride(a, k)
    return a, ld


def _direct_out(out, k: int, x, ldx: int, residual, params=()):
    """``out`` itself if the kernel can write it directly: it has a (rows, cols) view and is
    either x exactly (same memory and layout: each element is read before it is written, by
    the thread that writes it) or overlaps neither x, the residual nor ``params`` (weight and
    bias, read again for every row). Otherwise None (the result goes through a temporary)."""
    ld = _row_stride(out, k)
    if ld is None:
        return None
    for src in (x, residual, *params):
        if src is None:
            continue
        if src is x and out.data.ptr == x.data.ptr and out.strides == x.strides and ld == ldx:
            continue
        if _array.spans_overlap(out, src):
            return None
    return out


#: The norm kernels' parameters (CUNORM_NORM_PARAMS of norm.cu): x, y, rows, cols, ldx, ldy,
#: weight, bias, residual, ldr, h, ldh, mean, rstd, eps (a double)
_PARAMS = (POINTER, POINTER, 8, 8, 8, 8, POINTER, POINTER, POINTER, 8, POINTER, 8, POINTER,
           POINTER, 8)


@functools.lru_cache(maxsize=1024)
def _scalars(rows: int, cols: int, ldx: int, ldy: int, ldr: int, eps: float) -> tuple:
    """The bytes of the by-value arguments in _PARAMS's order (one tuple per layout, so a
    launch that passes it again copies nothing)."""
    return (*(np.int64(i).tobytes() for i in (rows, cols, ldx, ldy)), np.int64(ldr).tobytes(),
            np.int64(cols).tobytes(), np.float64(eps).tobytes())


def _pointers(*arrays) -> tuple[int, ...]:
    """Device addresses of CuPy arrays, 0 for None."""
    return tuple(0 if a is None else a.data.ptr for a in arrays)


def _launch(call: _Call, dev: int, stream: int, pointers: tuple[int, ...], ldx: int, ldy: int,
            ldr: int, rows: int, cols: int) -> None:
    """Launch on device ``dev`` (current) and stream handle ``stream``; ``pointers`` are the
    addresses of x, y, weight, bias, residual, h, mean and rstd (0: absent)."""
    itemsize = _dispatch.ITEMSIZE[call.dtype]
    operands = tuple((p, itemsize) for p in pointers[:6] if p)
    align = _array.pack_alignment(operands, _array.stride_bits((ldx, ldy, ldr, cols)))
    forced = _dispatch.forced_path()
    residual = pointers[4] != 0
    # weight and bias both given: layer_norm's warp rows that stage them need shared memory
    # only then (_dispatch.warp_stage_bytes); rms_norm has no bias and stages nothing
    params = pointers[2] != 0 and pointers[3] != 0
    key = (dev, call.op, call.dtype, rows, cols, align, residual, params, forced)
    entry = _PLANS.get(key)
    if entry is None:
        entry = _PLANS[key] = _make_plan(dev, call.op, call.dtype, rows, cols, align, residual,
                                         params, forced)
    kernel, launch, plan = entry
    set_carveout(kernel, plan.carveout)
    launch.fire(stream, pointers, _scalars(rows, cols, ldx, ldy, ldr, call.eps))


def _make_plan(dev: int, op: str, dtype: str, rows: int, cols: int, align: int,
               residual: bool, params: bool, forced: str | None):
    props = device_props(dev)

    def kernel_for(name: str):
        return get_kernel(dev, props.arch, "norm.cu", name,
                          smem_optin=props.smem_per_block_optin)

    def occ(name: str, block: int, smem: int) -> int:
        return occupancy(kernel_for(name), block, smem)

    force = forced if forced in _dispatch.ROW_PATHS else None
    plan = _dispatch.plan_rows(op, dtype, dtype, rows, cols, align, props, occ, force,
                               residual=residual, params=params)
    kernel = kernel_for(plan.kernel)
    return kernel, KernelLaunch(kernel, dev, plan.grid, plan.block, _PARAMS, plan.smem), plan


# --- NumPy reference --------------------------------------------------------------------
def _norm_numpy(call: _Call, x, weight, bias, out, residual):
    """float64 arithmetic, rounded once to x's dtype; h rounded to x's dtype first, as the
    kernels (and a framework adding two tensors) do."""
    axes = call.axes
    bshape = tuple(n if i in axes else 1 for i, n in enumerate(x.shape))
    h = None
    if residual is not None:
        h = (x.astype(np.float64) + residual.astype(np.float64)).astype(x.dtype)
    xf = (x if h is None else h).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if xf.size and all(x.shape[a] for a in axes):
            mean = None if call.rms else xf.mean(axis=axes, keepdims=True)
            xc = xf if call.rms else xf - mean
            var = (xc * xc).mean(axis=axes, keepdims=True)
        else:  # no elements to average: NaN statistics, as NumPy's mean of nothing
            mean = np.full(tuple(1 if i in axes else n for i, n in enumerate(x.shape)), np.nan)
            xc, var = xf, mean.copy()
        rstd = 1.0 / np.sqrt(var + call.eps)
        y = xc * rstd
        if weight is not None:
            y = y * weight.astype(np.float64).reshape(bshape)
        if bias is not None:
            y = y + bias.astype(np.float64).reshape(bshape)
    sd = np.dtype(call.stats_dtype)
    if out is None:
        out = y.astype(x.dtype)
    else:
        out[...] = y
    mean_s = None if call.rms else np.asarray(mean).reshape(call.stats_shape).astype(sd)
    return _results(call, out, h, mean_s, rstd.reshape(call.stats_shape).astype(sd))
