"""PyTorch adapter: cunorm's softmax, log_softmax, layer_norm and rms_norm as differentiable
torch operators.

:func:`softmax`, :func:`log_softmax`, :func:`layer_norm` and :func:`rms_norm` take CUDA
tensors, run cunorm's kernels on torch's current stream, and record a backward that runs
:func:`cunorm.softmax_backward`, :func:`cunorm.log_softmax_backward`,
:func:`cunorm.layer_norm_backward` or :func:`cunorm.rms_norm_backward`; CPU tensors run
cunorm's NumPy reference path. They are ``torch.library`` custom operators
(``cunorm::softmax``, ``cunorm::log_softmax``, ``cunorm::layer_norm``, ``cunorm::rms_norm``
and their ``*_backward``), so ``torch.compile`` traces them (fake tensors give the outputs'
shapes) without a graph break, and ``torch.library.opcheck`` can check their registration.
Importing this module imports torch; ``import cunorm`` does not.

Example (not a doctest: it needs torch and a GPU)::

    import torch
    import cunorm.torch as ct

    x = torch.randn(8, 1000, device="cuda", requires_grad=True)
    ct.softmax(x, dim=-1)[:, 0].sum().backward()  # x.grad by cunorm.softmax_backward

    w = torch.ones(1000, device="cuda", requires_grad=True)
    ct.rms_norm(x, (1000,), w).sum().backward()   # x.grad, w.grad by cunorm.rms_norm_backward
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .norm import _check_eps
from .norm import layer_norm as _layer_norm
from .norm import rms_norm as _rms_norm
from .norm_grad import layer_norm_backward as _layer_norm_backward
from .norm_grad import rms_norm_backward as _rms_norm_backward
from .softmax import log_softmax as _log_softmax
from .softmax import softmax as _softmax
from .softmax_grad import log_softmax_backward as _log_softmax_backward
from .softmax_grad import softmax_backward as _softmax_backward

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm"]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of a tensor over ``dim``, differentiable (on CUDA, cunorm's kernels both ways).

    Parameters
    ----------
    x : torch.Tensor
        CUDA tensor (cunorm's kernels) or CPU tensor (the NumPy reference path) of dtype
        float16, bfloat16, float32 or float64, any shape and strides.
    dim : int, default -1
        The dimension to normalize over.

    Returns
    -------
    torch.Tensor
        Contiguous, of ``x``'s shape, dtype and device; its ``grad_fn`` runs
        :func:`cunorm.softmax_backward`.
    """
    return torch.ops.cunorm.softmax(x, _dim(dim, "softmax"))


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Log-softmax of a tensor over ``dim``, differentiable; as :func:`softmax`, with
    :func:`cunorm.log_softmax_backward` as the backward."""
    return torch.ops.cunorm.log_softmax(x, _dim(dim, "log_softmax"))


def layer_norm(x: torch.Tensor, normalized_shape: int | Sequence[int],
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Layer normalization over the trailing dimensions, differentiable: as
    :func:`torch.nn.functional.layer_norm`, with cunorm's kernels both ways on CUDA.

    Parameters
    ----------
    x : torch.Tensor
        CUDA tensor (cunorm's kernels) or CPU tensor (the NumPy reference path) of dtype
        float16, bfloat16, float32 or float64, any shape and strides.
    normalized_shape : int or sequence of int
        The sizes of the last ``len(normalized_shape)`` dimensions of ``x``, which are
        normalized over together (an int ``n`` stands for ``(n,)``); at least one.
    weight, bias : torch.Tensor, optional
        Affine parameters of shape ``normalized_shape``, of ``x``'s dtype and device.
    eps : float, default 1e-5
        Added to the variance; finite and >= 0.

    Returns
    -------
    torch.Tensor
        ``(x - mean) / sqrt(var + eps) * weight + bias``: contiguous, of ``x``'s shape, dtype
        and device. Its ``grad_fn`` runs :func:`cunorm.layer_norm_backward` from ``x``, the
        weight and the forward's per-row mean and ``rstd`` (kept in float32; float64 for
        float64 ``x``).
    """
    k = _normalized_ndim("layer_norm", x, normalized_shape, weight=weight, bias=bias)
    eps = _check_eps(eps, "cunorm.torch.layer_norm")
    return torch.ops.cunorm.layer_norm(x, k, weight, bias, eps)[0]


def rms_norm(x: torch.Tensor, normalized_shape: int | Sequence[int],
             weight: torch.Tensor | None = None, eps: float | None = None) -> torch.Tensor:
    """RMS normalization over the trailing dimensions, differentiable: as
    :func:`torch.nn.functional.rms_norm`, with :func:`cunorm.rms_norm_backward` as the
    backward. Parameters as :func:`layer_norm`, without ``bias``.

    ``eps=None`` (the default) follows torch: the machine epsilon of the dtype torch computes
    in, ``torch.finfo(torch.float32).eps`` (1.19e-07) for float16, bfloat16 and float32
    ``x`` and ``torch.finfo(torch.float64).eps`` for float64 ``x`` (not cunorm's own default,
    1e-6).
    """
    k = _normalized_ndim("rms_norm", x, normalized_shape, weight=weight)
    if eps is None:
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    eps = _check_eps(eps, "cunorm.torch.rms_norm")
    return torch.ops.cunorm.rms_norm(x, k, weight, eps)[0]


def _dim(dim: object, fname: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"cunorm.torch.{fname}(): dim must be an int, got {dim!r}")
    return dim


def _normalized_ndim(fname: str, x: torch.Tensor, normalized_shape: object,
                     **params: torch.Tensor | None) -> int:
    """The number of trailing dimensions ``normalized_shape`` names, checked against ``x``
    and the affine parameters ``params`` (each None or a tensor of that shape)."""
    where = f"cunorm.torch.{fname}()"

    def is_int(n: object) -> bool:
        return isinstance(n, (int, torch.SymInt)) and not isinstance(n, bool)

    if is_int(normalized_shape):
        shape = (normalized_shape,)
    elif isinstance(normalized_shape, Sequence) and all(map(is_int, normalized_shape)):
        shape = tuple(normalized_shape)
    else:
        raise TypeError(f"{where}: normalized_shape must be an int or a sequence of ints, got "
                        f"{normalized_shape!r}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: x must be a torch.Tensor, got {type(x).__name__}")
    k = len(shape)
    if k == 0:
        raise ValueError(f"{where}: normalized_shape is empty; it gives the sizes of the "
                         "trailing dimensions of x to normalize over (at least one)")
    if k > x.dim() or tuple(x.shape[x.dim() - k:]) != shape:
        want = ", ".join(["*", *map(str, shape)])
        raise ValueError(f"{where}: normalized_shape {list(shape)} does not match the trailing "
                         f"dimensions of x: expected x of shape ({want}), got "
                         f"{tuple(x.shape)}")
    for name, t in params.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor or None, got "
                            f"{type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}; expected "
                             f"normalized_shape {tuple(shape)}")
        if t.device != x.device:
            raise ValueError(f"{where}: {name} is on {t.device} but x is on {x.device}")
        if t.dtype != x.dtype:
            raise TypeError(f"{where}: {name} has dtype {t.dtype}; expected x's dtype "
                            f"{x.dtype}")
    return k


def _axes(normalized_ndim: int) -> int | tuple[int, ...]:
    # a plain int for one axis: cunorm's per-layout memo takes only those
    return -1 if normalized_ndim == 1 else tuple(range(-normalized_ndim, 0))


def _run(fn, axis, *tensors: torch.Tensor | None, **kwargs):
    """``fn(*tensors, axis=axis, **kwargs)`` as contiguous tensors on the tensors' device: one,
    or a tuple where ``fn`` returns one. ``tensors[0]`` is x; later ones may be None.

    The operators' kernels see tensors that may still carry ``requires_grad`` (autograd runs
    above them), which DLPack refuses to export: they are passed detached. CPU tensors take
    cunorm's NumPy reference path (float64 arithmetic), through views of their memory.
    cunorm writes a fresh C-contiguous result except where it moved the axis (a view of
    one): the operators promise contiguous outputs, which their fake kernels describe.
    """
    tensors = tuple(None if t is None else t.detach() for t in tensors)
    if tensors[0].device.type == "cpu":
        out = fn(*(None if t is None else _numpy_view(t) for t in tensors), axis=axis, **kwargs)
        convert = _from_numpy
    else:
        out = fn(*tensors, axis=axis, **kwargs)
        convert = _contiguous
    return tuple(map(convert, out)) if isinstance(out, tuple) else convert(out)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _numpy_view(t: torch.Tensor):
    if t.dtype == torch.bfloat16:  # NumPy's bfloat16 is ml_dtypes'; torch exports none
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a) -> torch.Tensor:
    import numpy as np

    a = np.asarray(a)
    if not a.flags.c_contiguous:  # (not np.ascontiguousarray: it makes 0-d arrays 1-d)
        a = a.copy(order="C")
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


@torch.library.custom_op("cunorm::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _run(_softmax, dim, x)


@torch.library.custom_op("cunorm::log_softmax", mutates_args=())
def _log_softmax_op(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _run(_log_softmax, dim, x)


@torch.library.custom_op("cunorm::softmax_backward", mutates_args=())
def _softmax_backward_op(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    return _run(_softmax_backward, dim, y, dy)


@torch.library.custom_op("cunorm::log_softmax_backward", mutates_args=())
def _log_softmax_backward_op(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    return _run(_log_softmax_backward, dim, y, dy)


def _fake_forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.new_empty(x.shape)


def _fake_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    return y.new_empty(y.shape)


for _op in (_softmax_op, _log_softmax_op):
    _op.register_fake(_fake_forward)
for _op in (_softmax_backward_op, _log_softmax_backward_op):
    _op.register_fake(_fake_backward)


def _keep_output(ctx, inputs, output) -> None:
    # Both gradients need only the forward's output (and the dim), not its input.
    ctx.save_for_backward(output)
    ctx.dim = inputs[1]


def _softmax_grad(ctx, dy: torch.Tensor):
    (y,) = ctx.saved_tensors
    return torch.ops.cunorm.softmax_backward(y, dy, ctx.dim), None


def _log_softmax_grad(ctx, dy: torch.Tensor):
    (y,) = ctx.saved_tensors
    return torch.ops.cunorm.log_softmax_backward(y, dy, ctx.dim), None


_softmax_op.register_autograd(_softmax_grad, setup_context=_keep_output)
_log_softmax_op.register_autograd(_log_softmax_grad, setup_context=_keep_output)


# --- layer_norm and rms_norm --------------------------------------------------------------
# The forward operators return the statistics the backward needs (float32; float64 for
# float64 x, shaped x.shape[:-normalized_ndim]) beside y; the public functions return y.
@torch.library.custom_op("cunorm::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, normalized_ndim: int, weight: torch.Tensor | None,
                   bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run(_layer_norm, _axes(normalized_ndim), x, weight, bias, eps=eps,
                return_stats=True)


@torch.library.custom_op("cunorm::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, normalized_ndim: int, weight: torch.Tensor | None,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(_rms_norm, _axes(normalized_ndim), x, weight, eps=eps, return_stats=True)


@torch.library.custom_op("cunorm::layer_norm_backward", mutates_args=())
def _layer_norm_backward_op(
        dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
        weight: torch.Tensor | None,
        normalized_ndim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run(_layer_norm_backward, _axes(normalized_ndim), dy, x, mean, rstd, weight)


@torch.library.custom_op("cunorm::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                          weight: torch.Tensor | None,
                          normalized_ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(_rms_norm_backward, _axes(normalized_ndim), dy, x, rstd, weight)


def _fake_stats(x: torch.Tensor, normalized_ndim: int) -> torch.Tensor:
    torch._check(1 <= normalized_ndim <= x.dim(),
                 lambda: f"normalized_ndim {normalized_ndim} is not in [1, {x.dim()}]")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape[:x.dim() - normalized_ndim], dtype=dtype)


def _fake_params(x: torch.Tensor, normalized_ndim: int) -> torch.Tensor:
    return x.new_empty(x.shape[x.dim() - normalized_ndim:])


@_layer_norm_op.register_fake
def _(x, normalized_ndim, weight, bias, eps):
    return x.new_empty(x.shape), _fake_stats(x, normalized_ndim), _fake_stats(x, normalized_ndim)


@_rms_norm_op.register_fake
def _(x, normalized_ndim, weight, eps):
    return x.new_empty(x.shape), _fake_stats(x, normalized_ndim)


@_layer_norm_backward_op.register_fake
def _(dy, x, mean, rstd, weight, normalized_ndim):
    return (x.new_empty(x.shape), _fake_params(x, normalized_ndim),
            _fake_params(x, normalized_ndim))


@_rms_norm_backward_op.register_fake
def _(dy, x, rstd, weight, normalized_ndim):
    return x.new_empty(x.shape), _fake_params(x, normalized_ndim)


def _keep_layer_norm_inputs(ctx, inputs, output) -> None:
    # The gradients need x, the weight and the statistics, not y (nor the bias).
    x, normalized_ndim, weight, _bias, _eps = inputs
    _y, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.normalized_ndim = normalized_ndim
    ctx.mark_non_differentiable(mean, rstd)


def _keep_rms_norm_inputs(ctx, inputs, output) -> None:
    x, normalized_ndim, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.normalized_ndim = normalized_ndim
    ctx.mark_non_differentiable(rstd)


def _layer_norm_grad(ctx, dy: torch.Tensor, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    need_x, _, need_weight, need_bias, _ = ctx.needs_input_grad
    dx, dweight, dbias = torch.ops.cunorm.layer_norm_backward(dy, x, mean, rstd, weight,
                                                              ctx.normalized_ndim)
    return (dx if need_x else None, None, dweight if need_weight else None,
            dbias if need_bias else None, None)


def _rms_norm_grad(ctx, dy: torch.Tensor, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_x, _, need_weight, _ = ctx.needs_input_grad
    dx, dweight = torch.ops.cunorm.rms_norm_backward(dy, x, rstd, weight, ctx.normalized_ndim)
    return dx if need_x else None, None, dweight if need_weight else None, None


_layer_norm_op.register_autograd(_layer_norm_grad, setup_context=_keep_layer_norm_inputs)
_rms_norm_op.register_autograd(_rms_norm_grad, setup_context=_keep_rms_norm_inputs)
