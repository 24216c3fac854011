"""PyTorch adapter: cunorm's softmax and log_softmax as differentiable torch operators.

:func:`softmax` and :func:`log_softmax` take CUDA tensors, run cunorm's kernels on torch's
current stream, and record a backward that runs :func:`cunorm.softmax_backward` /
:func:`cunorm.log_softmax_backward`; CPU tensors run cunorm's NumPy reference path. They are
``torch.library`` custom operators (``cunorm::softmax``, ``cunorm::log_softmax`` and their
``*_backward``), so ``torch.compile`` traces them (fake tensors give the output's shape)
without a graph break, and ``torch.library.opcheck`` can check their registration.
Importing this module imports torch; ``import cunorm`` does not.

Example (not a doctest: it needs torch and a GPU)::

    import torch
    import cunorm.torch as ct

    x = torch.randn(8, 1000, device="cuda", requires_grad=True)
    ct.softmax(x, dim=-1)[:, 0].sum().backward()  # x.grad by cunorm.softmax_backward
"""

from __future__ import annotations

import torch

from .softmax import log_softmax as _log_softmax
from .softmax import softmax as _softmax
from .softmax_grad import log_softmax_backward as _log_softmax_backward
from .softmax_grad import softmax_backward as _softmax_backward

__all__ = ["softmax", "log_softmax"]


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


def _dim(dim: object, fname: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"cunorm.torch.{fname}(): dim must be an int, got {dim!r}")
    return dim


def _run(fn, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
    """``fn(*tensors, axis=dim)`` as a contiguous tensor on the tensors' device.

    The operators' kernels see tensors that may still carry ``requires_grad`` (autograd runs
    above them), which DLPack refuses to export: they are passed detached. CPU tensors take
    cunorm's NumPy reference path (float64 arithmetic), through views of their memory.
    cunorm writes a fresh C-contiguous result except where it moved the axis (a view of
    one): the operators promise contiguous outputs, which their fake kernels describe.
    """
    tensors = tuple(t.detach() for t in tensors)
    if tensors[0].device.type == "cpu":
        out = fn(*(_numpy_view(t) for t in tensors), axis=dim)
        return _from_numpy(out, tensors[0].dtype)
    out = fn(*tensors, axis=dim)
    return out if out.is_contiguous() else out.contiguous()


def _numpy_view(t: torch.Tensor):
    if t.dtype == torch.bfloat16:  # NumPy's bfloat16 is ml_dtypes'; torch exports none
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a, dtype: torch.dtype) -> torch.Tensor:
    import numpy as np

    a = np.ascontiguousarray(a)
    if dtype == torch.bfloat16:
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
