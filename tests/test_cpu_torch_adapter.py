"""cunorm.torch on CPU tensors (the NumPy reference path behind the same torch operators):
autograd against torch's own, ``gradcheck``, ``torch.library.opcheck``, tracing under
``torch.compile`` (the fake kernels and the autograd registration) and argument errors.
Skipped where torch is not installed (CI installs none: the GPU suite runs the CUDA side,
tests/test_gpu_softmax_grad.py)."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch", reason="cunorm.torch needs torch (not installed)")
ct = pytest.importorskip("cunorm.torch")


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_forward_and_gradient_match_torch(op, dtype):
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(6, 7, 33, generator=gen) * 3
    g0 = torch.randn(6, 7, 33, generator=gen)
    for dim in (-1, 1, 0):
        x = x0.to(dtype).clone().requires_grad_()
        g = g0.to(dtype)
        # torch in float64 from the same rounded x and g: the exact values, one rounding away
        ref_x = x.detach().double().requires_grad_()
        want = getattr(torch, op)(ref_x, dim)
        want.backward(g.double())
        y = getattr(ct, op)(x, dim=dim)
        assert y.dtype == dtype and y.is_contiguous()
        y.backward(g)
        assert x.grad.dtype == dtype
        tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-6)
        torch.testing.assert_close(y.double(), want.detach(), rtol=tol, atol=tol)
        scale = ref_x.grad.abs().max()
        torch.testing.assert_close(x.grad.double() / scale, ref_x.grad / scale,
                                   rtol=0, atol=8 * tol)


def test_gradcheck_opcheck_and_tracing():
    x = torch.randn(5, 37, dtype=torch.float64, requires_grad=True)
    for f in (ct.softmax, ct.log_softmax):
        assert torch.autograd.gradcheck(lambda t, f=f: f(t, dim=-1), (x,))
        assert torch.autograd.gradcheck(lambda t, f=f: f(t.transpose(0, 1), dim=0), (x,))
    xf = torch.randn(8, 30)
    yf = torch.softmax(xf, -1)
    torch.library.opcheck(torch.ops.cunorm.softmax.default, (xf, -1))
    torch.library.opcheck(torch.ops.cunorm.log_softmax.default, (xf, 1))
    torch.library.opcheck(torch.ops.cunorm.softmax_backward.default, (yf, xf, -1))
    torch.library.opcheck(torch.ops.cunorm.log_softmax_backward.default, (yf.log(), xf, -1))

    def loss(t):
        return (ct.softmax(t * 2, dim=-1) * torch.arange(30.0)).sum()

    a = torch.randn(8, 30, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    loss(a).backward()
    # aot_eager traces forward and backward through the fake kernels, without a C++ compiler
    torch.compile(loss, backend="aot_eager", fullgraph=True)(b).backward()
    torch.testing.assert_close(b.grad, a.grad)


def test_bad_arguments():
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"cunorm.torch.softmax\(\): dim must be an int"):
        ct.softmax(x, dim=(0, 1))
    with pytest.raises(TypeError, match=r"cunorm.torch.log_softmax\(\): dim must be an int"):
        ct.log_softmax(x, dim=True)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        ct.softmax(x, dim=2)
    with pytest.raises(TypeError, match="x has dtype int64"):
        ct.softmax(torch.ones(2, 3, dtype=torch.int64))


# --- layer_norm and rms_norm -----------------------------------------------------------
F = torch.nn.functional
NORMS = ["layer_norm", "rms_norm"]
AFFINE = ["none", "weight", "weight_bias"]
TOLS = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-6, torch.float64: 1e-12}


def default_eps(dtype: torch.dtype) -> float:
    """torch's rms_norm eps for eps=None: the epsilon of the dtype it computes in."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def norm_args(op: str, affine: str, shape, dtype, gen, requires_grad=True):
    """(weight, bias) of ``shape`` (None where ``affine`` leaves them out; rms_norm has no
    bias)."""
    w = b = None
    if affine != "none":
        w = (1 + 0.5 * torch.randn(shape, generator=gen)).to(dtype)
    if affine == "weight_bias" and op == "layer_norm":
        b = torch.randn(shape, generator=gen).to(dtype)
    return tuple(None if t is None else t.requires_grad_(requires_grad) for t in (w, b))


def call_norm(op: str, x, shape, w, b, eps=None, module=ct):
    """``module``'s layer_norm (eps=None: the default, 1e-5) or rms_norm (its own eps=None:
    the epsilon of the dtype torch computes in; pass :func:`default_eps` to a float64 copy)."""
    if op == "layer_norm":
        return module.layer_norm(x, shape, w, b, **({} if eps is None else {"eps": eps}))
    return module.rms_norm(x, shape, w, eps=eps)


@pytest.mark.parametrize("op", NORMS)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_norm_forward_and_gradients_match_torch(op, affine, dtype):
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(3, 4, 5, 33, generator=gen) * 2 + 0.5
    g0 = torch.randn(3, 4, 5, 33, generator=gen)
    tol = TOLS[dtype]
    for k in (1, 2, 3):
        shape = tuple(x0.shape[-k:])
        x = x0.to(dtype).clone().requires_grad_()
        g = g0.to(dtype)
        w, b = norm_args(op, affine, shape, dtype, gen)
        # torch in float64 from the same rounded operands: the exact values, one rounding away
        ref = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
        eps = default_eps(dtype) if op == "rms_norm" else None
        want = call_norm(op, ref[0], shape, ref[1], ref[2], eps, module=F)
        want.backward(g.double())
        y = call_norm(op, x, shape, w, b)
        assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
        y.backward(g)
        torch.testing.assert_close(y.double(), want.detach(), rtol=tol, atol=tol)
        for got, exact in zip((x, w, b), ref, strict=True):
            if got is None:
                continue
            assert got.grad.dtype == dtype and got.grad.shape == got.shape
            scale = exact.grad.abs().max()
            torch.testing.assert_close(got.grad.double() / scale, exact.grad / scale,
                                       rtol=0, atol=8 * tol)


@pytest.mark.parametrize("op", NORMS)
def test_norm_gradients_only_where_required(op):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 10, dtype=torch.float64, generator=gen)
    w, b = norm_args(op, "weight_bias", (10,), torch.float64, gen)
    # x alone: the parameters are given but frozen
    xr = x.clone().requires_grad_()
    wf, bf = (None if t is None else t.detach() for t in (w, b))
    call_norm(op, xr, (10,), wf, bf).sum().backward()
    assert xr.grad is not None and (wf is None or wf.grad is None)
    # the parameters alone: no dx
    call_norm(op, x, (10,), w, b).pow(2).sum().backward()
    assert w.grad is not None and (b is None or b.grad is not None)
    w2, b2 = (None if t is None else t.detach().clone().requires_grad_() for t in (w, b))
    eps = default_eps(torch.float64) if op == "rms_norm" else None
    call_norm(op, x, (10,), w2, b2, eps, module=F).pow(2).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
    if b is not None:
        torch.testing.assert_close(b.grad, b2.grad)
    # layer_norm without a bias: the weight's gradient, none for the bias that is not there
    if op == "layer_norm":
        w3 = w.detach().clone().requires_grad_()
        ct.layer_norm(x, (10,), w3).sum().backward()
        assert w3.grad is not None


@pytest.mark.parametrize("op", NORMS)
def test_norm_saves_inputs_and_statistics_not_output(op):
    x = torch.randn(7, 3, 12, requires_grad=True)
    w = torch.randn(3, 12, requires_grad=True)
    b = torch.randn(3, 12, requires_grad=True) if op == "layer_norm" else None
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = call_norm(op, x, (3, 12), w, b)
    stats = [((7,), torch.float32)] * (2 if op == "layer_norm" else 1)
    assert saved == [((7, 3, 12), torch.float32), ((3, 12), torch.float32), *stats]
    y.sum().backward()
    assert x.grad is not None and w.grad is not None
    # the operator's statistics are outputs without a gradient
    stats = getattr(torch.ops.cunorm, op)(x, 2, w, *([b] if b is not None else []), 1e-5)[1:]
    assert all(not s.requires_grad for s in stats)


def test_rms_norm_default_eps_follows_torch():
    gen = torch.Generator().manual_seed(3)
    # mean(x**2) ~ 1e-7: the size of float32's epsilon, so eps moves the result a lot
    x0 = torch.randn(8, 64, generator=gen) * 3e-4
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = x0.to(dtype)
        want = F.rms_norm(x.double(), (64,), eps=default_eps(dtype))
        torch.testing.assert_close(ct.rms_norm(x, (64,)).double(), want, rtol=TOLS[dtype],
                                   atol=TOLS[dtype])
        torch.testing.assert_close(ct.rms_norm(x, [64]), F.rms_norm(x, [64]))
    # float64 x: float64's epsilon (2.2e-16), here of the size of mean(x**2)
    x = x0.double() * 1e-4
    torch.testing.assert_close(ct.rms_norm(x, (64,)), F.rms_norm(x, (64,)), rtol=1e-12, atol=0)


def test_norm_layouts_int_shape_and_empty():
    x = torch.randn(6, 10, 8, dtype=torch.float64).transpose(0, 1)  # not contiguous
    w = torch.randn(6, 8, dtype=torch.float64)
    torch.testing.assert_close(ct.layer_norm(x, (6, 8), w), F.layer_norm(x, (6, 8), w))
    torch.testing.assert_close(ct.rms_norm(x, 8, w[0], eps=1e-6),
                               F.rms_norm(x, (8,), w[0], eps=1e-6))
    torch.testing.assert_close(ct.layer_norm(x, torch.Size([8])), F.layer_norm(x, (8,)))
    e = torch.randn(0, 5, requires_grad=True)
    y = ct.layer_norm(e, (5,))
    assert y.shape == (0, 5)
    y.sum().backward()
    assert e.grad.shape == (0, 5)


def test_norm_gradcheck_opcheck_and_tracing():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    for k in (1, 2, 3):
        shape = tuple(x.shape[-k:])
        w = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
        b = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t, w, b, s=shape: ct.layer_norm(t, s, w, b),
                                        (x, w, b))
        assert torch.autograd.gradcheck(lambda t, s=shape: ct.layer_norm(t, s), (x,))
        assert torch.autograd.gradcheck(lambda t, w, s=shape: ct.rms_norm(t, s, w), (x, w))
        assert torch.autograd.gradcheck(lambda t, s=shape: ct.rms_norm(t, s, eps=0.1), (x,))
    # a strided input
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, w: ct.layer_norm(t.transpose(0, 2), (3,), w),
                                    (x, w))

    xf = torch.randn(6, 4, 30, requires_grad=True)
    wf = torch.randn(4, 30, requires_grad=True)
    bf = torch.randn(4, 30, requires_grad=True)
    ops = torch.ops.cunorm
    for args in ((xf, 2, wf, bf, 1e-5), (xf, 1, None, None, 1e-5), (xf, 1, wf[0], None, 0.0),
                 (xf, 3, None, torch.randn(6, 4, 30), 1e-5)):
        torch.library.opcheck(ops.layer_norm.default, args)
    for args in ((xf, 2, wf, 1e-6), (xf, 1, None, 1e-6)):
        torch.library.opcheck(ops.rms_norm.default, args)
    dy = torch.randn(6, 4, 30)
    x0 = xf.detach()
    _, mean, rstd = ops.layer_norm(x0, 2, wf.detach(), None, 1e-5)
    torch.library.opcheck(ops.layer_norm_backward.default, (dy, x0, mean, rstd, wf.detach(), 2))
    _, mean1, rstd1 = ops.layer_norm(x0, 1, None, None, 1e-5)
    torch.library.opcheck(ops.layer_norm_backward.default, (dy, x0, mean1, rstd1, None, 1))
    _, rstd = ops.rms_norm(x0, 2, None, 1e-6)
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, x0, rstd, None, 2))
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, x0, rstd, wf.detach(), 2))

    def loss(t, w, b):
        h = ct.layer_norm(t * 2, (4, 30), w, b)
        return (ct.rms_norm(h, (30,), w[0]) * torch.arange(30.0)).sum()

    params = [torch.randn(6, 4, 30), torch.randn(4, 30), torch.randn(4, 30)]
    a = [p.clone().requires_grad_() for p in params]
    c = [p.clone().requires_grad_() for p in params]
    loss(*a).backward()
    # aot_eager traces forward and backward through the fake kernels, without a C++ compiler
    torch.compile(loss, backend="aot_eager", fullgraph=True)(*c).backward()
    for p, q in zip(a, c, strict=True):
        torch.testing.assert_close(q.grad, p.grad)


def test_norm_bad_arguments():
    x = torch.randn(2, 3, 4)
    w = torch.randn(3, 4)
    with pytest.raises(ValueError, match=re.escape(
            "cunorm.torch.layer_norm(): normalized_shape [3, 5] does not match the trailing "
            "dimensions of x: expected x of shape (*, 3, 5), got (2, 3, 4)")):
        ct.layer_norm(x, (3, 5))
    with pytest.raises(ValueError, match=re.escape("normalized_shape [1, 2, 3, 4] does not "
                                                   "match")):
        ct.rms_norm(x, [1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"cunorm.torch.rms_norm\(\): normalized_shape is empty"):
        ct.rms_norm(x, ())
    with pytest.raises(TypeError, match="normalized_shape must be an int or a sequence of ints"):
        ct.layer_norm(x, (3.0, 4))
    with pytest.raises(TypeError, match="normalized_shape must be an int or a sequence of ints"):
        ct.layer_norm(x, True)
    with pytest.raises(ValueError, match=re.escape("weight has shape (4,); expected "
                                                   "normalized_shape (3, 4)")):
        ct.layer_norm(x, (3, 4), w[0])
    with pytest.raises(ValueError, match=re.escape("bias has shape (3, 4); expected "
                                                   "normalized_shape (4,)")):
        ct.layer_norm(x, (4,), None, w)
    with pytest.raises(TypeError, match="weight has dtype torch.float64; expected x's dtype "
                                        "torch.float32"):
        ct.rms_norm(x, (3, 4), w.double())
    with pytest.raises(TypeError, match="weight must be a torch.Tensor or None"):
        ct.rms_norm(x, (4,), [1.0] * 4)
    with pytest.raises(ValueError, match=r"cunorm.torch.layer_norm\(\): eps must be finite"):
        ct.layer_norm(x, (4,), eps=-1.0)
    with pytest.raises(TypeError, match=r"cunorm.torch.rms_norm\(\): eps must be a real"):
        ct.rms_norm(x, (4,), eps="1e-6")
    with pytest.raises(TypeError, match="x has dtype int64"):
        ct.layer_norm(torch.ones(2, 3, dtype=torch.int64), (3,))
