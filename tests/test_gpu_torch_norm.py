"""GPU tests of the torch adapter's layer_norm and rms_norm (cunorm.torch): forward and
gradients of CUDA tensors against a float64 reference from the same rounded operands (torch's
own functional forms in float64), torch's default eps of rms_norm, layouts, ``gradcheck``,
``torch.library.opcheck`` and ``torch.compile``. Skipped (with the reason) where no CUDA GPU
is present; the CPU side is tests/test_cpu_torch_adapter.py."""

from __future__ import annotations

import math

import pytest
from _gpu import GPU_MARKS, TOL, row_errors

pytestmark = GPU_MARKS
torch = pytest.importorskip("torch", reason="cunorm.torch needs torch (not installed)")
ct = pytest.importorskip("cunorm.torch")
F = torch.nn.functional
DEV = "cuda"
NORMS = ["layer_norm", "rms_norm"]
AFFINE = ["none", "weight", "weight_bias"]


def default_eps(dtype: torch.dtype) -> float:
    """torch's rms_norm eps for eps=None: the epsilon of the dtype it computes in."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def error(got: torch.Tensor, ref: torch.Tensor, cols: int) -> float:
    """``row_errors`` of ``got`` against the float64 ``ref``, rows of ``cols`` elements (the
    normalized slices; a parameter's gradient is one row)."""
    ref = ref.detach().double().cpu().numpy().reshape(-1, cols)
    got = got.detach().double().cpu().numpy().reshape(-1, cols)
    return float(row_errors(got, ref).max())


def operands(op: str, affine: str, shape, k: int, dtype: torch.dtype, seed: int):
    """x, dy, weight and bias (None where ``affine`` leaves them out) on the GPU."""
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def randn(*s):
        return torch.randn(s, device=DEV, generator=gen)

    nshape = tuple(shape[-k:])
    x = (randn(*shape) * 2 + 0.5).to(dtype)
    dy = randn(*shape).to(dtype)
    w = (1 + 0.5 * randn(*nshape)).to(dtype) if affine != "none" else None
    b = randn(*nshape).to(dtype) if affine == "weight_bias" and op == "layer_norm" else None
    return x, dy, w, b


def run(op: str, module, x, nshape, w, b, eps=None):
    if op == "layer_norm":
        return module.layer_norm(x, nshape, w, b)
    return module.rms_norm(x, nshape, w, eps=eps)


@pytest.mark.parametrize("op", NORMS)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("shape,k", [((64, 1000), 1), ((16, 8, 5000), 1), ((4, 16, 8, 125), 2),
                                     ((3, 4, 8, 40), 3)])
def test_forward_and_gradients_against_float64(op, affine, dtype, shape, k):
    tdt = getattr(torch, dtype)
    x, dy, w, b = operands(op, affine, shape, k, tdt, seed=sum(shape) + k)
    nshape = tuple(shape[-k:])
    cols = math.prod(nshape)
    ours = [None if t is None else t.clone().requires_grad_() for t in (x, w, b)]
    exact = [None if t is None else t.detach().double().clone().requires_grad_()
             for t in (x, w, b)]
    y = run(op, ct, ours[0], nshape, ours[1], ours[2])
    want = run(op, F, exact[0], nshape, exact[1], exact[2], eps=default_eps(tdt))
    assert y.dtype == tdt and y.device == x.device and y.shape == x.shape and y.is_contiguous()
    y.backward(dy)
    want.backward(dy.double())
    tol = TOL[dtype]
    err = error(y, want, cols)
    assert err <= tol, f"y: error {err:.3g} > {tol}"
    # end to end: the backward runs from the forward's rounded statistics
    for name, got, ref in zip(("dx", "dweight", "dbias"), ours, exact, strict=True):
        if got is None:
            continue
        assert got.grad.dtype == tdt and got.grad.shape == got.shape
        err = error(got.grad, ref.grad, cols if name == "dx" else ref.numel())
        assert err <= 2 * tol, f"{name}: error {err:.3g} > {2 * tol}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_rms_norm_default_eps_follows_torch(dtype):
    tdt = getattr(torch, dtype)
    gen = torch.Generator(device=DEV).manual_seed(7)
    # mean(x**2) of the size of the default eps: a different eps moves the result a lot
    scale = 1e-8 if tdt == torch.float64 else 3e-4
    x = (torch.randn(32, 512, device=DEV, generator=gen) * scale).to(tdt)
    y = ct.rms_norm(x, (512,))
    want = F.rms_norm(x.double(), (512,), eps=default_eps(tdt))
    assert error(y, want, 512) <= TOL[dtype]
    assert error(y, F.rms_norm(x, (512,)).double(), 512) <= 2 * TOL[dtype]


@pytest.mark.parametrize("op", NORMS)
def test_layouts_and_gradients_only_where_required(op):
    gen = torch.Generator(device=DEV).manual_seed(8)
    base = torch.randn(300, 24, 8, device=DEV, generator=gen)
    x = base.transpose(0, 1)  # (24, 300, 8), not contiguous: normalized over (300, 8)
    w = (1 + 0.5 * torch.randn(300, 8, device=DEV, generator=gen)).requires_grad_()
    b = torch.randn(300, 8, device=DEV, generator=gen).requires_grad_() if op == "layer_norm" \
        else None
    xr = x.detach().clone().requires_grad_()
    exact = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
    # .sum(): dy is a broadcast view (all strides 0)
    run(op, ct, xr, (300, 8), w, b).sum().backward()
    run(op, F, exact[0], (300, 8), exact[1], exact[2], eps=default_eps(x.dtype)).sum().backward()
    for got, ref in zip((xr, w, b), exact, strict=True):
        if got is not None:
            cols = 2400 if got is xr else ref.numel()
            assert error(got.grad, ref.grad, cols) <= 2 * TOL["float32"]
    # frozen parameters get no gradient; a frozen x gets none either
    wf = w.detach()
    xg = x.detach().clone().requires_grad_()
    run(op, ct, xg, (300, 8), wf, None).sum().backward()
    assert xg.grad is not None and wf.grad is None
    w2 = w.detach().clone().requires_grad_()
    run(op, ct, x.detach(), (300, 8), w2, None).pow(2).sum().backward()
    assert w2.grad is not None and w2.grad.shape == (300, 8)


def test_gradcheck_opcheck_and_compile():
    gen = torch.Generator(device=DEV).manual_seed(9)

    def randn(*s, dtype=torch.float64):
        return torch.randn(s, device=DEV, generator=gen, dtype=dtype).requires_grad_()

    x = randn(3, 4, 37)
    for k in (1, 2):
        shape = tuple(x.shape[-k:])
        w, b = randn(*shape), randn(*shape)
        assert torch.autograd.gradcheck(lambda t, w, b, s=shape: ct.layer_norm(t, s, w, b),
                                        (x, w, b))
        assert torch.autograd.gradcheck(lambda t, s=shape: ct.layer_norm(t, s), (x,))
        assert torch.autograd.gradcheck(lambda t, w, s=shape: ct.rms_norm(t, s, w), (x, w))
    w3 = randn(3)
    assert torch.autograd.gradcheck(lambda t, w: ct.rms_norm(t.transpose(0, 2), 3, w), (x, w3))

    xf, wf, bf = (randn(*s, dtype=torch.float32) for s in ((8, 4, 300), (4, 300), (4, 300)))
    ops = torch.ops.cunorm
    for args in ((xf, 2, wf, bf, 1e-5), (xf, 1, None, None, 1e-5), (xf, 1, wf[0], None, 0.0)):
        torch.library.opcheck(ops.layer_norm.default, args)
    for args in ((xf, 2, wf, 1e-6), (xf, 1, None, 1e-6)):
        torch.library.opcheck(ops.rms_norm.default, args)
    dy = torch.randn(8, 4, 300, device=DEV, generator=gen)
    x0, w0 = xf.detach(), wf.detach()
    _, mean, rstd = ops.layer_norm(x0, 2, w0, None, 1e-5)
    torch.library.opcheck(ops.layer_norm_backward.default, (dy, x0, mean, rstd, w0, 2))
    torch.library.opcheck(ops.layer_norm_backward.default, (dy, x0, mean, rstd, None, 2))
    _, rstd = ops.rms_norm(x0, 1, None, 1e-6)
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, x0, rstd, w0[0], 1))
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, x0, rstd, None, 1))

    def loss(t, w, b):
        h = ct.layer_norm(t * 2, (4, 300), w, b)
        return (ct.rms_norm(h, (300,), w[0]) * torch.arange(300, device=DEV)).sum()

    params = [t.detach() for t in (xf, wf, bf)]
    a = [p.clone().requires_grad_() for p in params]
    c = [p.clone().requires_grad_() for p in params]
    loss(*a).backward()
    torch.compile(loss, fullgraph=True)(*c).backward()
    for p, q in zip(a, c, strict=True):
        torch.testing.assert_close(q.grad, p.grad)


def test_bad_gpu_arguments():
    x = torch.randn(2, 3, 4, device=DEV)
    with pytest.raises(ValueError, match=r"normalized_shape \[3, 5\] does not match the trailing "
                                         r"dimensions of x: expected x of shape \(\*, 3, 5\)"):
        ct.layer_norm(x, (3, 5))
    with pytest.raises(ValueError, match="weight is on cpu but x is on cuda"):
        ct.rms_norm(x, (4,), torch.ones(4))
    with pytest.raises(TypeError, match="bias has dtype torch.float16; expected x's dtype"):
        ct.layer_norm(x, (4,), None, torch.ones(4, device=DEV, dtype=torch.float16))
