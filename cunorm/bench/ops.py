"""The ops the benchmark knows: one :class:`OpSpec` entry per op in :data:`OPS`.

An entry names the cunorm function and its family. The family (``"softmax"``,
``"softmax_grad"``, ``"norm"`` or ``"norm_grad"``) is what the peers key on: it says how to call
cunorm, PyTorch and JAX, which Triton kernel applies and how to compute the float64 reference.
A new row-wise op of an existing family is one entry; an op that does not fit the row-wise sweep
(attention) sets ``rowwise=False`` and brings its own ``runner``.

A norm with ``residual=True`` is the pre-norm transformer block fused in one pass: a second
input ``r`` of ``x``'s shape and dtype, ``h = x + r`` rounded to that dtype, and the result is the
pair ``(norm(h), h)``. It moves four full-size arrays (``arrays_moved=4``: x and r read, y and h
written) where the plain ops move two, and its GB/s is counted accordingly.

The ``"softmax_grad"`` family is the backward of softmax and log_softmax: ``dx`` from the
forward's output ``y`` and the output gradient ``dy``. The case's input ``x`` holds ``y`` (a real
forward output, see :meth:`OpSpec.forward_reference`) and its second input ``r`` holds ``dy``,
passed the way the residual norms pass ``r``. It moves three full-size arrays (y and dy read, dx
written: ``arrays_moved=3``).

The ``"norm_grad"`` family is the backward of layer_norm and rms_norm: ``(dx, dweight, dbias)``
(rms_norm: ``(dx, dweight)``) from the forward's input ``x``, its weight (and, for layer_norm, a
bias: the forward's arguments), the output gradient ``dy`` (in ``r``) and the forward's
statistics. Each implementation gets the statistics of its own library's forward, computed once
before it is timed (:meth:`OpSpec.cunorm_stats`, :meth:`OpSpec.torch_stats`; JAX's ``jax.vjp``
recomputes them inside its jitted function). It moves three full-size arrays (x and dy read, dx
written: ``arrays_moved=3``); the weight, the statistics and dweight/dbias are O(cols) or
O(rows) and not counted. Only ``dx`` is checked against the float64 reference.

cunorm is imported lazily and every function is looked up by name, so the benchmark keeps
working while the library grows: an op whose function does not exist yet is reported as
unavailable instead of crashing the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# The gradient families: the result is computed from the forward's data and ``dy`` (in ``r``).
GRAD_FAMILIES = ("softmax_grad", "norm_grad")

# Error bound per dtype (DESIGN.md section 3), as max |out - ref| over a row divided by
# max |ref| over that row.
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-12}

DTYPE_ALIASES = {
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "fp64": "float64",
    "double": "float64",
    "f64": "float64",
}


def canonical_dtype(name: str) -> str:
    """Canonical dtype name (``"bf16"`` -> ``"bfloat16"``); ValueError for anything else."""
    name = DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if name not in TOLERANCE:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(TOLERANCE)}")
    return name


def numpy_dtype(name: str) -> np.dtype:
    """NumPy dtype for a canonical name; bfloat16 comes from ``ml_dtypes`` (as CuPy uses)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def torch_dtype(torch: Any, name: str) -> Any:
    """``torch.float16`` etc. for a canonical name."""
    return getattr(torch, name)


@dataclass(frozen=True)
class ExtraCase:
    """A non-standard layout timed in its own table (e.g. softmax over axis 1)."""

    dtype: str
    shape: tuple[int, ...]
    axis: int


@dataclass(frozen=True)
class OpSpec:
    """How to run and check one op.

    Attributes
    ----------
    name : str
        CLI name, also used in file names.
    cunorm_attr : str
        Attribute of the ``cunorm`` namespace implementing it.
    family : {"softmax", "softmax_grad", "norm", "norm_grad", "attention"}
        Selects call conventions, peers, Triton kernel and reference. ``"softmax_grad"`` is the
        backward of (log_)softmax: inputs ``y`` (the forward's output, in the case's ``x``) and
        ``dy`` (in ``r``), result ``dx``. ``"norm_grad"`` is the backward of layer_norm /
        rms_norm: inputs ``x``, the weight (and bias), ``dy`` (in ``r``) and the forward's
        statistics, result ``(dx, dweight, dbias)`` (rms_norm: ``(dx, dweight)``).
        ``"attention"`` is benchmarked by :mod:`cunorm.bench.attention` (its own shapes, peers
        and reports).
    log : bool
        Softmax and softmax_grad families: log_softmax (its backward) instead of softmax.
    rms : bool
        Norm and norm_grad families: RMS norm (no mean, no bias) instead of layer norm.
    residual : bool
        Norm family: fused residual add. Every implementation gets a second input ``r`` of
        ``x``'s shape and dtype and returns ``(y, h)`` with ``h = x + r`` rounded to that dtype
        and ``y = norm(h)``; cunorm is called with ``residual=r``.
    params : tuple of str
        Norm and norm_grad families: which of ``"weight"``, ``"bias"`` the op (its forward)
        takes (length ``cols``, dtype of x).
    eps : float
        Norm and norm_grad families: epsilon, passed explicitly to every implementation (for a
        gradient: to every forward computing the statistics) so they all agree.
    arrays_moved : int
        Full-size arrays (``rows * cols`` elements) that must cross memory once each, reads
        and writes together: 2 for ``y = f(x)``, 3 for the gradients (y or x, and dy read, dx
        written), 4 for the residual norms. GB/s counts these.
    rowwise : bool
        Part of the ``(rows, cols)`` sweep and of ``all``.
    extra_cases : tuple of ExtraCase
        Extra layouts, timed against PyTorch only.
    runner : callable, optional
        ``runner(args) -> exit code`` for ops outside the row-wise sweep.
    """

    name: str
    cunorm_attr: str
    family: str
    log: bool = False
    rms: bool = False
    residual: bool = False
    params: tuple[str, ...] = ()
    eps: float = 0.0
    arrays_moved: int = 2
    rowwise: bool = True
    extra_cases: tuple[ExtraCase, ...] = ()
    runner: Callable[[Any], int] | None = None

    @property
    def second_input(self) -> bool:
        """Whether every implementation reads a second full-size input ``r`` of ``x``'s shape
        and dtype: the residual of the residual norms, ``dy`` of the gradients."""
        return self.residual or self.grad

    @property
    def grad(self) -> bool:
        """A gradient (softmax_grad or norm_grad family): ``r`` holds ``dy``."""
        return self.family in GRAD_FAMILIES

    @property
    def forward_attr(self) -> str:
        """Norm_grad family: the cunorm forward whose statistics the gradient takes."""
        return "rms_norm" if self.rms else "layer_norm"

    @property
    def grad_outputs(self) -> tuple[str, ...]:
        """Norm_grad family: the names of the results, in order."""
        return ("dx", "dweight") if self.rms else ("dx", "dweight", "dbias")

    # -- cunorm ---------------------------------------------------------------------------------
    def resolve(self) -> tuple[Callable[..., Any] | None, str]:
        """The cunorm function, or None and a one-line reason it is unavailable."""
        try:
            import cunorm
        except Exception as exc:  # a half-written core must not take the benchmark down
            return None, f"cunorm does not import ({type(exc).__name__}: {exc})"
        fn = getattr(cunorm, self.cunorm_attr, None)
        if fn is None:
            return None, (
                f"cunorm.{self.cunorm_attr} is not available yet (the cunorm namespace "
                f"has no attribute {self.cunorm_attr!r}); {self.name} skipped"
            )
        if self.residual and not _takes_keyword(fn, "residual"):
            return None, (
                f"cunorm.{self.cunorm_attr} takes no residual= argument yet; {self.name} skipped"
            )
        if self.family == "attention" and not _takes_keyword(fn, "causal"):
            return None, (
                f"cunorm.{self.cunorm_attr} takes no causal= argument yet; {self.name} skipped"
            )
        if self.family == "norm_grad":
            fwd = getattr(cunorm, self.forward_attr, None)
            if fwd is None or not _takes_keyword(fwd, "return_stats"):
                return None, (
                    f"cunorm.{self.forward_attr} does not return its statistics "
                    f"(return_stats=True) yet; {self.name} skipped"
                )
        return fn, ""

    def cunorm_stats(self, x: Any, w: Any, b: Any, axis: int) -> tuple[Any, ...]:
        """Norm_grad family: ``(mean, rstd)`` (rms_norm: ``(rstd,)``) from cunorm's forward
        on ``x`` with the case's weight (and bias), ``return_stats=True``; any array kind."""
        import cunorm

        fwd = getattr(cunorm, self.forward_attr)
        args = [x, w] + ([b] if "bias" in self.params else [])
        return tuple(fwd(*args, axis=axis, eps=self.eps, return_stats=True)[1:])

    def call(
        self,
        fn: Callable[..., Any],
        x: Any,
        w: Any,
        b: Any,
        axis: int,
        r: Any = None,
        stats: tuple[Any, ...] = (),
    ) -> Any:
        """Call cunorm (or its NumPy path) the way a user would.

        Returns ``y``, or the pair ``(y, h)`` for a residual op (``r`` is then required). For
        the softmax_grad family ``x`` is the forward's output ``y`` and ``r`` is ``dy``; the
        result is ``dx``. For the norm_grad family ``r`` is ``dy`` and ``stats`` the forward's
        statistics (:meth:`cunorm_stats`); the result is :attr:`grad_outputs`.
        """
        if self.family == "softmax":
            return fn(x, axis=axis)
        if self.family == "softmax_grad":
            return fn(x, r, axis=axis)
        if self.family == "norm_grad":
            return fn(r, x, *stats, w, axis=axis)
        args = [x, w] + ([b] if "bias" in self.params else [])
        if self.residual:
            return fn(*args, axis=axis, eps=self.eps, residual=r)
        return fn(*args, axis=axis, eps=self.eps)

    @property
    def usage(self) -> str:
        """How the benchmark calls cunorm, as shown in reports (markdown code)."""
        if self.family == "attention":
            return f"`cunorm.{self.cunorm_attr}(q, k, v, causal=causal)`"
        if self.family == "softmax":
            return f"`cunorm.{self.cunorm_attr}(x, axis=axis)`"
        if self.family == "softmax_grad":
            return f"`cunorm.{self.cunorm_attr}(y, dy, axis=axis)`"
        if self.family == "norm_grad":
            stats = "rstd" if self.rms else "mean, rstd"
            fwd_args = "x, w" if self.rms else "x, w, b"
            return (
                f"`cunorm.{self.cunorm_attr}(dy, x, {stats}, w, axis=axis)` on the statistics of "
                f"`cunorm.{self.forward_attr}({fwd_args}, eps={self.eps:g}, return_stats=True)`, "
                "computed once before timing"
            )
        args = ", ".join(["x", "w"] + (["b"] if "bias" in self.params else []))
        extra = ", residual=r" if self.residual else ""
        return f"`cunorm.{self.cunorm_attr}({args}, eps={self.eps:g}{extra})`"

    # -- peers ----------------------------------------------------------------------------------
    @property
    def aten_grad(self) -> str:
        """Softmax_grad family: the ``torch.ops.aten`` op torch's autograd runs for it."""
        return "_log_softmax_backward_data" if self.log else "_softmax_backward_data"

    def torch_fn(self, torch: Any) -> Callable[..., Any]:
        """``f(t, weight, bias, residual, dim)`` in PyTorch eager (also what ``torch.compile``
        compiles). ``residual`` is None except for residual ops, where ``f`` returns
        ``(norm(t + residual), t + residual)``, and the softmax gradients, where ``t`` is ``y``,
        ``residual`` is ``dy`` and ``f`` returns ``dx`` from :attr:`aten_grad`.

        Norm_grad family: ``f(t, weight, bias, dy, dim, stats)`` with ``stats`` from
        :meth:`torch_stats`, returning :attr:`grad_outputs` (see :meth:`torch_grad_label`).
        """
        F = torch.nn.functional
        eps = self.eps
        if self.family == "norm_grad":
            return self._torch_norm_grad(torch)
        if self.family == "softmax":
            if self.log:
                return lambda t, w, b, r, dim: torch.log_softmax(t, dim)
            return lambda t, w, b, r, dim: torch.softmax(t, dim)
        if self.family == "softmax_grad":
            # What autograd runs for (log_)softmax. input_dtype = y's dtype: the forward's input
            # had y's dtype (no half-to-float upcast), so dx comes out in y's dtype, as cunorm's.
            aten = getattr(torch.ops.aten, self.aten_grad)
            return lambda t, w, b, r, dim: aten(r, t, dim, t.dtype)
        if self.rms:

            def norm(t: Any, w: Any, b: Any) -> Any:
                return F.rms_norm(t, (t.shape[-1],), w, eps)

        else:

            def norm(t: Any, w: Any, b: Any) -> Any:
                return F.layer_norm(t, (t.shape[-1],), w, b, eps)

        if self.residual:

            def fused(t: Any, w: Any, b: Any, r: Any, dim: int) -> tuple[Any, Any]:
                h = t + r  # rounded to t's dtype, as cunorm's h
                return norm(h, w, b), h

            return fused
        return lambda t, w, b, r, dim: norm(t, w, b)

    def _torch_norm_grad(self, torch: Any) -> Callable[..., Any]:
        """:meth:`torch_fn` for the norm_grad family."""
        aten = torch.ops.aten
        if not self.rms:
            # What autograd runs for F.layer_norm; every output requested, as with a weight and
            # a bias that require grad.
            def layer(t: Any, w: Any, b: Any, dy: Any, dim: int, stats: Any) -> Any:
                mean, rstd = stats
                return aten.native_layer_norm_backward(
                    dy, t, [t.shape[-1]], mean, rstd, w, b, [True, True, True]
                )

            return layer
        if torch_fused_rms(torch):

            def fused(t: Any, w: Any, b: Any, dy: Any, dim: int, stats: Any) -> Any:
                return aten._fused_rms_norm_backward(
                    dy, t, [t.shape[-1]], stats[0], w, [True, True]
                )

            return fused

        def formula(t: Any, w: Any, b: Any, dy: Any, dim: int, stats: Any) -> Any:
            # No fused rms_norm backward in this torch: the formula in eager ops, in rstd's
            # dtype (float32; float64 for float64 inputs).
            (rstd,) = stats
            ct = rstd.dtype
            xhat = t.to(ct) * rstd
            dyf = dy.to(ct)
            g = dyf * w.to(ct)
            dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
            dw = (dyf * xhat).reshape(-1, t.shape[-1]).sum(0)
            return dx.to(t.dtype), dw.to(t.dtype)

        return formula

    def torch_stats(self, torch: Any, t: Any, w: Any, b: Any) -> tuple[Any, ...]:
        """Norm_grad family: torch's own forward statistics of ``t`` (last axis), computed once
        before timing: ``(mean, rstd)`` of ``aten.native_layer_norm``, ``(rstd,)`` of
        ``aten._fused_rms_norm``, or (a torch without it) ``rsqrt(mean(x²) + eps)`` in float32
        (float64 for float64 ``t``); each shaped ``(rows, 1)``."""
        aten = torch.ops.aten
        shape = [t.shape[-1]]
        if not self.rms:
            _, mean, rstd = aten.native_layer_norm(t, shape, w, b, self.eps)
            return mean, rstd
        if torch_fused_rms(torch):
            return (aten._fused_rms_norm(t, shape, w, self.eps)[1],)
        tf = t.to(torch.promote_types(t.dtype, torch.float32))
        return (torch.rsqrt((tf * tf).mean(-1, keepdim=True) + self.eps),)

    def torch_grad_label(self, torch: Any) -> str:
        """Norm_grad family: what the torch peers run, for the notes."""
        if not self.rms:
            return (
                "torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, "
                "[True, True, True]) on the mean and rstd of aten.native_layer_norm"
            )
        if torch_fused_rms(torch):
            return (
                "torch.ops.aten._fused_rms_norm_backward(dy, x, [cols], rstd, w, [True, True]) "
                "on the rstd of aten._fused_rms_norm"
            )
        return (
            "this torch has no CUDA aten._fused_rms_norm_backward: rms_norm_backward runs the "
            "gradient formula in float32 torch ops instead (xhat = x·rstd, g = dy·w, "
            "dx = rstd·(g − xhat·mean(g·xhat)), dw = Σ dy·xhat) on rstd = rsqrt(mean(x²) + eps) "
            "computed in float32 before timing"
        )

    def jax_fn(self, jax: Any, axis: int) -> Callable[[Any, Any, Any, Any], Any]:
        """``f(x, weight, bias, residual)`` in JAX, to be wrapped in ``jax.jit``.

        The norms and the softmax gradients are written out in ``jnp`` (JAX has no fused op
        for them), computing in float32 for 16-bit inputs as the other implementations do.
        ``residual`` is None except for residual ops, where ``f`` returns
        ``(norm(x + residual), x + residual)``, and the gradients, where ``residual`` is
        ``dy``: for the softmax gradients ``x`` is ``y`` and ``f`` returns ``dx``; for the
        norm gradients ``f`` is ``jax.vjp`` of the ``jnp`` norm with respect to ``x``, the
        weight (and the bias), applied to ``dy``, returning :attr:`grad_outputs` (under
        ``jax.jit`` the forward's statistics are recomputed inside the function).
        """
        jnp = jax.numpy
        eps = self.eps
        if self.family == "softmax":
            f = jax.nn.log_softmax if self.log else jax.nn.softmax
            return lambda x, w, b, r: f(x, axis=axis)
        if self.family == "softmax_grad":
            log = self.log

            def grad(y: Any, w: Any, b: Any, dy: Any) -> Any:
                ct = jnp.promote_types(y.dtype, jnp.float32)
                return softmax_grad(jnp, y.astype(ct), dy.astype(ct), log, axis).astype(y.dtype)

            return grad

        def norm(x: Any, w: Any, b: Any) -> Any:
            ct = jnp.promote_types(x.dtype, jnp.float32)
            xf = x.astype(ct)
            if self.rms:
                y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=axis, keepdims=True) + eps)
            else:
                xc = xf - jnp.mean(xf, axis=axis, keepdims=True)
                y = xc * jax.lax.rsqrt(jnp.mean(xc * xc, axis=axis, keepdims=True) + eps)
            if w is not None:
                y = y * w.astype(ct)
            if b is not None:
                y = y + b.astype(ct)
            return y.astype(x.dtype)

        if self.family == "norm_grad":

            def vjp(x: Any, w: Any, b: Any, dy: Any) -> Any:
                if b is None:
                    _, pull = jax.vjp(lambda x, w: norm(x, w, None), x, w)
                else:
                    _, pull = jax.vjp(norm, x, w, b)
                return pull(dy)

            return vjp

        if self.residual:

            def fused(x: Any, w: Any, b: Any, r: Any) -> tuple[Any, Any]:
                h = x + r
                return norm(h, w, b), h

            return fused
        return lambda x, w, b, r: norm(x, w, b)

    # -- checking -------------------------------------------------------------------------------
    def reference(self, xp: Any, x2d: Any, w: Any = None, b: Any = None, r2d: Any = None) -> Any:
        """Float64 result over the last axis of a 2-D ``x2d`` (NumPy or CuPy, any float dtype).

        For a residual op, ``x2d`` is the normalized input ``h`` (see :func:`residual_sum`) and
        the result is ``y``; ``h`` itself is checked for exact equality, not here. For the
        softmax_grad family, ``x2d`` is ``y`` and ``r2d`` is ``dy`` (the rounded arrays the
        implementations read) and the result is ``dx``. For the norm_grad family ``r2d`` is
        ``dy`` and the result is ``dx`` (:func:`norm_grad_dx`, statistics in float64 from
        ``x2d``). The other ops ignore ``r2d``.
        """
        x = x2d.astype(xp.float64)
        if self.family == "softmax":
            return softmax_f64(xp, x, self.log)
        if self.family == "softmax_grad":
            return softmax_grad(xp, x, r2d.astype(xp.float64), self.log, -1)
        if self.family == "norm_grad":
            w64 = None if w is None else w.astype(xp.float64)
            return norm_grad_dx(xp, x, r2d.astype(xp.float64), w64, self.rms, self.eps)
        if self.rms:
            y = x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)
        else:
            xc = x - x.mean(axis=-1, keepdims=True)
            y = xc / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + self.eps)
        if w is not None:
            y = y * w.astype(xp.float64)
        if b is not None:
            y = y + b.astype(xp.float64)
        return y

    def forward_reference(self, xp: Any, x2d: Any) -> Any:
        """Softmax_grad family: float64 (log_)softmax over the last axis of ``x2d``, the
        forward output whose gradient is benchmarked (the caller rounds it to the case's dtype
        and hands it to every implementation as ``y``)."""
        return softmax_f64(xp, x2d.astype(xp.float64), self.log)

    def moved_bytes(self, size: int, itemsize: int) -> int:
        """Bytes that must move: each of the op's :attr:`arrays_moved` full-size arrays once
        (input read and output written; for a residual op also ``r`` read and ``h`` written;
        for a softmax gradient ``y`` and ``dy`` read and ``dx`` written; for a norm gradient
        ``x`` and ``dy`` read and ``dx`` written).

        Norm weights, biases, statistics and their gradients are O(cols) or O(rows), negligible
        next to ``rows * cols``, and are left out so every op is measured on the same scale.
        """
        return self.arrays_moved * size * itemsize


def softmax_f64(xp: Any, x: Any, log: bool) -> Any:
    """(log_)softmax over the last axis of a float64 array ``x`` (NumPy or CuPy), max-shifted."""
    s = x - x.max(axis=-1, keepdims=True)
    if log:
        return s - xp.log(xp.exp(s).sum(axis=-1, keepdims=True))
    e = xp.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_grad(xp: Any, y: Any, dy: Any, log: bool, axis: int) -> Any:
    """``dx`` of (log_)softmax over ``axis`` from its output ``y`` and ``dy``, in the dtype they
    share (``xp``: NumPy, CuPy or ``jax.numpy``): ``y * (dy - sum(y * dy))`` for softmax,
    ``dy - exp(y) * sum(dy)`` for log_softmax."""
    if log:
        return dy - xp.exp(y) * dy.sum(axis=axis, keepdims=True)
    return y * (dy - (y * dy).sum(axis=axis, keepdims=True))


def norm_grad_dx(xp: Any, x: Any, dy: Any, w: Any, rms: bool, eps: float) -> Any:
    """``dx`` of layer_norm (``rms``: rms_norm) over the last axis of ``x`` (NumPy or CuPy),
    in ``x``'s dtype, with the statistics computed from ``x`` itself: ``xhat = (x - mean)·rstd``
    (rms: ``x·rstd``), ``g = dy·w`` (``dy`` without a weight) and
    ``dx = rstd·(g - mean(g) - xhat·mean(g·xhat))`` (rms: without ``mean(g)``)."""
    xc = x if rms else x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    g = dy if w is None else dy * w
    c = (g * xhat).mean(axis=-1, keepdims=True)
    if rms:
        return rstd * (g - xhat * c)
    return rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * c)


def torch_fused_rms(torch: Any) -> bool:
    """Whether ``torch`` runs ``aten._fused_rms_norm`` and ``aten._fused_rms_norm_backward``
    (on CUDA where it has a GPU, else on the CPU): tried once on a tiny tensor, since an op can
    exist without a kernel for the device."""
    key = id(torch)
    if key not in _FUSED_RMS or _FUSED_RMS[key][0] is not torch:
        aten = torch.ops.aten
        ok = hasattr(aten, "_fused_rms_norm") and hasattr(aten, "_fused_rms_norm_backward")
        if ok:
            try:
                dev = "cuda" if torch.cuda.is_available() else "cpu"
                x = torch.ones((2, 4), device=dev)
                _, rstd = aten._fused_rms_norm(x, [4], x[0], 1e-6)
                aten._fused_rms_norm_backward(x, x, [4], rstd, x[0], [True, True])
            except Exception:
                ok = False
        _FUSED_RMS[key] = (torch, ok)
    return _FUSED_RMS[key][1]


# id(torch) -> (torch, whether it runs them). The entry holds the object, so its id is not
# reused by another (a test's stand-in for torch once got a dead stand-in's answer by its id).
_FUSED_RMS: dict[int, tuple[Any, bool]] = {}


def residual_sum(x: Any, r: Any) -> Any:
    """``x + r`` computed in float64 and rounded once to ``x``'s dtype (NumPy).

    The ``h`` every residual implementation must return, bit for bit: it is the correctly
    rounded sum. (The float64 sum of two float16/bfloat16/float32 values is exact unless one is
    smaller than the other by a factor of 2**29 or more, and then it lies far from any tie of
    ``x``'s dtype, so rounding it again gives the same result.)
    """
    return (x.astype(np.float64) + r.astype(np.float64)).astype(x.dtype)


def _takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (True when its signature cannot be read)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins, C extensions: let the call decide
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _run_attention(args: Any) -> int:
    """``python -m cunorm.bench attention``: imported on use, so ``ops`` stays light."""
    from .attention import run

    return run(args)


# Softmax over a non-last axis, shapes from common models: attention scores (32, 21, 256, 256)
# in float32, and (16, 4096, 1024) in float16.
_SOFTMAX_EXTRAS = (
    ExtraCase("float32", (32, 21, 256, 256), 1),
    ExtraCase("float16", (16, 4096, 1024), 1),
)

OPS: dict[str, OpSpec] = {
    "softmax": OpSpec("softmax", "softmax", "softmax", extra_cases=_SOFTMAX_EXTRAS),
    "log_softmax": OpSpec(
        "log_softmax", "log_softmax", "softmax", log=True, extra_cases=_SOFTMAX_EXTRAS
    ),
    "layer_norm": OpSpec("layer_norm", "layer_norm", "norm", params=("weight", "bias"), eps=1e-5),
    "rms_norm": OpSpec("rms_norm", "rms_norm", "norm", rms=True, params=("weight",), eps=1e-6),
    # Pre-norm residual blocks: y, h = norm(x + r), x + r in one pass (4 arrays move, not 2).
    "layer_norm_residual": OpSpec(
        "layer_norm_residual",
        "layer_norm",
        "norm",
        residual=True,
        params=("weight", "bias"),
        eps=1e-5,
        arrays_moved=4,
    ),
    "rms_norm_residual": OpSpec(
        "rms_norm_residual",
        "rms_norm",
        "norm",
        rms=True,
        residual=True,
        params=("weight",),
        eps=1e-6,
        arrays_moved=4,
    ),
    # Backward of softmax / log_softmax: dx from y (a real forward output) and dy; 3 arrays move.
    # No extra layouts: over a non-last axis cunorm's backward first copies y and dy to move the
    # axis last, so such a table would time those copies rather than the kernel.
    "softmax_backward": OpSpec(
        "softmax_backward", "softmax_backward", "softmax_grad", arrays_moved=3
    ),
    "log_softmax_backward": OpSpec(
        "log_softmax_backward", "log_softmax_backward", "softmax_grad", log=True, arrays_moved=3
    ),
    # Backward of layer_norm / rms_norm: (dx, dweight[, dbias]) from x, the weight (the
    # forward's bias for layer_norm), dy and the forward's statistics; x and dy read, dx written.
    # No extra layouts, as for the softmax gradients.
    "layer_norm_backward": OpSpec(
        "layer_norm_backward",
        "layer_norm_backward",
        "norm_grad",
        params=("weight", "bias"),
        eps=1e-5,
        arrays_moved=3,
    ),
    "rms_norm_backward": OpSpec(
        "rms_norm_backward",
        "rms_norm_backward",
        "norm_grad",
        rms=True,
        params=("weight",),
        eps=1e-6,
        arrays_moved=3,
    ),
    # Not row-wise: its own sweep (FlashAttention convention, decoding, peak memory), peers
    # (torch SDPA backends, JAX) and reports, in cunorm.bench.attention.
    "attention": OpSpec(
        "attention", "attention", "attention", rowwise=False, runner=_run_attention
    ),
}


def rowwise_ops() -> list[OpSpec]:
    """The ops ``all`` runs, in table order."""
    return [op for op in OPS.values() if op.rowwise]
