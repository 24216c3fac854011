"""Benchmark inputs, shared zero-copy between CuPy, PyTorch and JAX, and the correctness guard.

Every implementation in a cell reads the *same* device buffers: the input (and, for the
residual norms, the second input ``r``) is created once with CuPy (random normal, never zeros: a
zero input would let kernels skip work and make exp() trivially cheap) and handed to PyTorch and
JAX through DLPack. The softmax gradients read ``y``, the (log_)softmax of such an input, in
place of ``x``, and a random normal ``dy`` in place of ``r``. The norm gradients read ``x``, its
weight (and bias) and a random normal ``dy`` in place of ``r``, plus the forward's statistics,
which each library computes with its own forward once per case (:meth:`Case.cunorm_stats`,
:meth:`Case.torch_args`), before anything is timed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from .ops import TOLERANCE, OpSpec, numpy_dtype, torch_dtype

Arrays = tuple[Any, Any, Any, Any]

# Rows per chunk of the guard's float32 comparison: about 2**26 elements (256 MB) at a time,
# so checking a 6 GB output never needs another 6 GB of temporaries.
_CHECK_CHUNK_ELEMS = 2**26
# Rows the float64 reference is evaluated on (worst rows against torch, or a sample).
_REF_ROWS = 16


def synchronize() -> None:
    """Wait for all work on the device (every stream, every library)."""
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def free_memory() -> None:
    """Return cached blocks of CuPy's and PyTorch's pools, so a large cell does not starve the
    next library. (JAX's allocator keeps its pool; it is told not to preallocate.)"""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def to_torch(a: Any) -> Any:
    """Zero-copy ``torch.Tensor`` view of a CuPy/JAX array (returned as is if already one)."""
    import torch

    if isinstance(a, torch.Tensor):
        return a
    try:
        return torch.from_dlpack(a)
    except Exception:
        # Older exporters may not know bfloat16 (DLPack kDLBfloat); reinterpret the bits.
        import cupy

        if isinstance(a, cupy.ndarray) and a.dtype.name == "bfloat16":
            return torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16)
        raise


def to_cupy(a: Any) -> Any:
    """Zero-copy ``cupy.ndarray`` view of a torch/JAX array (returned as is if already one)."""
    import cupy

    if isinstance(a, cupy.ndarray):
        return a
    return cupy.from_dlpack(a)


def to_jax(a: Any) -> Any:
    """``jax.Array`` holding the data of a CuPy array: zero-copy through DLPack when JAX accepts
    it, else a copy through the host (same values, so timings stay comparable)."""
    import jax
    import jax.numpy as jnp

    for importer in (
        getattr(jnp, "from_dlpack", None),
        getattr(getattr(jax, "dlpack", None), "from_dlpack", None),
    ):
        if importer is None:
            continue
        try:
            return importer(a)
        except Exception:
            continue
    import cupy

    return jax.device_put(cupy.asnumpy(a))


@dataclass
class Case:
    """One input of one op: ``x`` plus its weight/bias (and residual ``r`` for the residual
    norms), and lazily made torch/JAX views of all four (``None`` where the op has none).

    For the softmax_grad family ``x`` is the forward's output ``y`` and ``r`` is ``dy``; for
    the norm_grad family ``x`` is the forward's input and ``r`` is ``dy``.
    """

    op: OpSpec
    dtype: str
    x: Any
    w: Any = None
    b: Any = None
    r: Any = None
    axis: int = -1
    _torch: Arrays | None = field(default=None, repr=False)
    _jax: Arrays | None = field(default=None, repr=False)
    _cunorm_stats: tuple[Any, ...] | None = field(default=None, repr=False)
    _torch_stats: tuple[Any, ...] | None = field(default=None, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape)

    @property
    def cols(self) -> int:
        """Length of the reduced axis."""
        return int(self.x.shape[self.axis])

    @property
    def rows(self) -> int:
        """Number of independent rows (every other axis flattened)."""
        return int(self.x.size) // max(1, self.cols)

    @property
    def nbytes(self) -> int:
        return self.op.moved_bytes(int(self.x.size), self.x.dtype.itemsize)

    @property
    def last_axis(self) -> bool:
        return self.axis in (-1, self.x.ndim - 1)

    def torch(self) -> Arrays:
        """``(x, w, b, r)`` as torch tensors sharing the CuPy buffers."""
        if self._torch is None:
            self._torch = self._views(to_torch)
        return self._torch

    def jax(self) -> Arrays:
        """``(x, w, b, r)`` as JAX arrays (zero-copy where JAX accepts it)."""
        if self._jax is None:
            self._jax = self._views(to_jax)
        return self._jax

    def torch_args(self) -> tuple[Any, ...]:
        """The arguments of :meth:`OpSpec.torch_fn`'s function: ``(x, w, b, r, axis)`` as
        torch tensors, and for the norm_grad family also torch's forward statistics
        (:meth:`OpSpec.torch_stats`, computed on the first call and kept)."""
        t, w, b, r = self.torch()
        if self.op.family != "norm_grad":
            return t, w, b, r, self.axis
        if self._torch_stats is None:
            import torch

            self._torch_stats = self.op.torch_stats(torch, t, w, b)
        return t, w, b, r, self.axis, self._torch_stats

    def _views(self, convert: Any) -> Arrays:
        x, w, b, r = (None if a is None else convert(a) for a in (self.x, self.w, self.b, self.r))
        return x, w, b, r

    def cunorm_stats(self) -> tuple[Any, ...]:
        """Norm_grad family: cunorm's forward statistics of ``x`` (:meth:`OpSpec.cunorm_stats`),
        computed on the first call (the guard's untimed one) and kept; ``()`` otherwise."""
        if self.op.family != "norm_grad":
            return ()
        if self._cunorm_stats is None:
            self._cunorm_stats = self.op.cunorm_stats(self.x, self.w, self.b, self.axis)
        return self._cunorm_stats

    def cunorm(self, fn: Any) -> Any:
        stats = self.cunorm_stats()
        return self.op.call(fn, self.x, self.w, self.b, self.axis, self.r, stats)


def _astype(a: Any, dtype: str) -> Any:
    """CuPy array ``a`` cast to ``dtype`` (through torch where CuPy cannot cast to bfloat16)."""
    import cupy

    if a.dtype == numpy_dtype(dtype):
        return a
    try:
        return a.astype(numpy_dtype(dtype))
    except Exception:
        # A CuPy without bfloat16 casts: let torch convert, then view the result in CuPy.
        import torch

        return cupy.from_dlpack(to_torch(a).to(torch_dtype(torch, dtype)))


def random_normal(shape: tuple[int, ...], dtype: str, rs: Any) -> Any:
    """Standard normal CuPy array of ``dtype`` (drawn in float32, or float64 for float64)."""
    import cupy

    draw = cupy.float64 if dtype == "float64" else cupy.float32
    return _astype(rs.standard_normal(shape, dtype=draw), dtype)


def make_case(
    op: OpSpec, shape: tuple[int, ...], dtype: str, axis: int = -1, seed: int = 0
) -> Case:
    """Fresh random input for ``op`` (plus weight/bias of length ``shape[axis]``, and for an
    op with a :attr:`~OpSpec.second_input` a second input ``r`` of ``x``'s shape and dtype,
    drawn the same way).

    ``x``, ``w`` and ``b`` are drawn first, so they are the same as the plain op's at the
    same seed. For the softmax_grad family ``x`` is then replaced by ``y``, the forward of the
    drawn ``x`` (see :func:`forward_output`), and ``r`` is ``dy``; for the norm_grad family
    ``r`` is ``dy`` (the statistics come later, from each library's forward).
    """
    import cupy

    rs = cupy.random.RandomState(seed)
    x = random_normal(shape, dtype, rs)
    if op.family == "softmax_grad":
        x = forward_output(op, x, dtype, axis)
    cols = shape[axis]
    w = random_normal((cols,), dtype, rs) if "weight" in op.params else None
    b = random_normal((cols,), dtype, rs) if "bias" in op.params else None
    r = random_normal(shape, dtype, rs) if op.second_input else None
    synchronize()  # JAX reads through DLPack on its own stream: the data must exist first
    return Case(op, dtype, x, w, b, r, axis)


def forward_output(op: OpSpec, x: Any, dtype: str, axis: int) -> Any:
    """``y`` for a softmax gradient: (log_)softmax of the CuPy array ``x`` over ``axis``.

    The float64 reference (:meth:`OpSpec.forward_reference`), evaluated in row chunks so a
    6 GB input needs no full-size float64 temporaries, then rounded to ``dtype`` through float32
    as :func:`random_normal` rounds its draws. Independent of cunorm's forward, so a fault there
    cannot change the inputs the backward is timed on. Contiguous, in ``x``'s layout.
    """
    import cupy

    x2d = _rows2d_cupy(x, axis)
    rows, cols = x2d.shape
    y2d = cupy.empty((rows, cols), cupy.float64 if dtype == "float64" else cupy.float32)
    step = max(1, _CHECK_CHUNK_ELEMS // max(1, cols))
    for i in range(0, rows, step):
        y2d[i : i + step] = op.forward_reference(cupy, _f64(x2d[i : i + step]))
    y = cupy.moveaxis(y2d.reshape(cupy.moveaxis(x, axis, -1).shape), -1, axis)
    return _astype(cupy.ascontiguousarray(y), dtype)


# -- correctness guard ------------------------------------------------------------------------
@dataclass
class Check:
    """Outcome of comparing one output with the reference."""

    ok: bool
    err: float  # max over rows of max|out - ref| / max|ref|
    note: str = ""


def _rows2d(a: Any, axis: int) -> Any:
    """2-D (rows, cols) view of a torch tensor with ``axis`` last (copies only if it must)."""
    a = a.movedim(axis, -1) if axis not in (-1, a.ndim - 1) else a
    return a.reshape(-1, a.shape[-1])


def _rows2d_cupy(a: Any, axis: int) -> Any:
    import cupy

    a = cupy.moveaxis(a, axis, -1) if axis not in (-1, a.ndim - 1) else a
    return a.reshape(-1, a.shape[-1])


def _err_rows_torch(out2d: Any, ref2d: Any) -> Any:
    """Per-row relative error (float32 tensor of length rows), computed in chunks."""
    import torch

    rows, cols = ref2d.shape
    step = max(1, _CHECK_CHUNK_ELEMS // max(1, cols))
    errs = []
    for i in range(0, rows, step):
        o = out2d[i : i + step].float()
        r = ref2d[i : i + step].float()
        num = (o - r).abs().amax(dim=-1)
        den = r.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
        errs.append(num / den)
    err = torch.cat(errs)
    # A NaN where the reference has none is an error, not a pass: NaN compares false.
    return torch.nan_to_num(err, nan=float("inf"))


def _f64(a: Any) -> Any:
    """Float64 copy of a CuPy array (through torch where CuPy cannot cast, e.g. old bfloat16)."""
    import cupy

    if a is None:
        return None
    try:
        return a.astype(cupy.float64)
    except Exception:
        return to_cupy(to_torch(cupy.ascontiguousarray(a)).double())


def _input_rows_f64(case: Case, idx: Any) -> Any:
    """Float64 copy of the rows ``idx`` (index array or slice) of what the op normalizes:
    ``x``, or for a residual op ``h = x + r`` rounded to ``x``'s dtype."""
    x2d = _rows2d_cupy(case.x, case.axis)
    if not case.op.residual:
        return _f64(x2d[idx])
    r2d = _rows2d_cupy(case.r, case.axis)
    return _f64(_astype(_f64(x2d[idx]) + _f64(r2d[idx]), case.dtype))


def _err_rows_f64(case: Case, out2d_cupy: Any, idx: Any) -> float:
    """Max relative error of the given rows against the float64 reference (CuPy)."""
    import cupy

    # dy of a gradient (a residual op's r is already summed into the rows of h)
    dy = _f64(_rows2d_cupy(case.r, case.axis)[idx]) if case.op.grad else None
    ref = case.op.reference(cupy, _input_rows_f64(case, idx), _f64(case.w), _f64(case.b), dy)
    num = cupy.abs(_f64(out2d_cupy[idx]) - ref).max(axis=-1)
    den = cupy.maximum(cupy.abs(ref).max(axis=-1), 1e-300)
    err = cupy.nan_to_num(num / den, nan=float("inf"))
    return float(err.max())


def check_output(case: Case, out: Any, ref: Any | None) -> Check:
    """Compare ``out`` (any array) with the reference for ``case``.

    With a PyTorch eager result ``ref``: every row is compared; if the error exceeds the dtype
    tolerance, the worst rows are re-checked against a float64 reference, so a deviation of
    PyTorch's own result (it has its own rounding) is not blamed on ``out``. Without ``ref``,
    a sample of rows is compared with the float64 reference.

    For a residual op, ``out`` (and ``ref``) is the pair ``(y, h)``: ``y`` is checked as
    above against the norm of ``h_ref = x + r`` rounded to ``x``'s dtype, and ``h`` must equal
    ``h_ref`` exactly, in every element.

    For a norm gradient, ``out`` (and ``ref``) is ``(dx, dweight, dbias)`` (rms_norm:
    ``(dx, dweight)``): ``dx`` is checked as above; of dweight and dbias only the shape
    ``(cols,)``.
    """
    if case.op.residual:
        return _check_residual(case, out, ref)
    if case.op.family == "norm_grad":
        return _check_norm_grad(case, out, ref)
    return _check_y(case, out, ref)


def _check_norm_grad(case: Case, out: Any, ref: Any | None) -> Check:
    """:func:`check_output` for ``(dx, dweight[, dbias])`` outputs."""
    names = case.op.grad_outputs
    if not isinstance(out, tuple | list) or len(out) != len(names):
        got = f"a {len(out)}-tuple" if isinstance(out, tuple | list) else type(out).__name__
        return Check(False, float("inf"), f"expected ({', '.join(names)}), got {got}")
    for name, a in zip(names[1:], out[1:], strict=True):
        if a is None or tuple(a.shape) != (case.cols,):
            got = "None" if a is None else f"shape {tuple(a.shape)}"
            return Check(False, float("inf"), f"{name} is {got}, expected ({case.cols},)")
    return _check_y(case, out[0], None if ref is None else ref[0])


def _check_residual(case: Case, out: Any, ref: Any | None) -> Check:
    """:func:`check_output` for ``(y, h)`` outputs."""
    if not isinstance(out, tuple | list) or len(out) != 2:
        got = f"a {len(out)}-tuple" if isinstance(out, tuple | list) else type(out).__name__
        return Check(False, float("inf"), f"expected the pair (y, h), got {got}")
    y, h = out
    check = _check_y(case, y, None if ref is None else ref[0])
    bad, worst = _h_mismatches(case, h)
    if bad:
        y_note = check.note or f"y error {check.err:.2e}"
        return Check(
            False,
            check.err,
            f"h != x + r rounded to {case.dtype} in {bad} of {case.x.size} elements "
            f"(max |diff| {worst:.2e}); {y_note}",
        )
    if check.ok:
        return Check(True, check.err, check.note or "h exact")
    return check


def _h_mismatches(case: Case, h: Any) -> tuple[int, float]:
    """(elements of ``h`` that differ from ``x + r`` rounded to ``x``'s dtype, max |diff|),
    computed in row chunks so no full-size float64 temporary is needed."""
    import cupy

    h2d = _rows2d_cupy(to_cupy(h), case.axis)
    rows, cols = case.rows, case.cols
    if tuple(h2d.shape) != (rows, cols) or h2d.dtype != case.x.dtype:
        raise ValueError(
            f"h has shape {tuple(to_cupy(h).shape)} and dtype {h2d.dtype}, expected "
            f"{case.shape} {case.x.dtype}"
        )
    step = max(1, _CHECK_CHUNK_ELEMS // max(1, cols))
    bad, worst = 0, 0.0
    for i in range(0, rows, step):
        rows_i = slice(i, i + step)
        want = _input_rows_f64(case, rows_i)
        got = _f64(h2d[rows_i])
        differ = got != want  # NaN (never in random normal inputs) counts as a difference
        n = int(differ.sum())
        if n:
            bad += n
            diff = cupy.nan_to_num(cupy.abs(got - want), nan=float("inf"))
            worst = max(worst, float(diff.max()))
    return bad, worst


def _check_y(case: Case, out: Any, ref: Any | None) -> Check:
    """:func:`check_output` for one output array (``y``)."""
    import cupy

    tol = TOLERANCE[case.dtype]
    rows = case.rows
    if ref is not None:
        err_rows = _err_rows_torch(_rows2d(to_torch(out), case.axis), _rows2d(ref, case.axis))
        err = float(err_rows.max())
        if err <= tol:
            return Check(True, err)
        worst = err_rows.topk(min(_REF_ROWS, rows)).indices.cpu().numpy()
        idx = cupy.asarray(worst)
        err64 = _err_rows_f64(case, _rows2d_cupy(to_cupy(out), case.axis), idx)
        if err64 <= tol:
            return Check(
                True,
                err64,
                f"differs from torch by {err:.2e}, but is within "
                f"{tol:g} of float64 ({err64:.2e}) on the worst rows",
            )
        return Check(
            False,
            err64,
            f"error {err64:.2e} vs float64 (tolerance {tol:g}); {err:.2e} vs torch eager",
        )
    idx = cupy.unique(cupy.linspace(0, rows - 1, min(rows, 4 * _REF_ROWS)).astype(cupy.int64))
    err64 = _err_rows_f64(case, _rows2d_cupy(to_cupy(out), case.axis), idx)
    if err64 <= tol:
        return Check(True, err64, "checked on sampled rows against float64")
    return Check(False, err64, f"error {err64:.2e} vs float64 on sampled rows (tolerance {tol:g})")
