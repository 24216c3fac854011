"""cunorm.torch on CPU tensors (the NumPy reference path behind the same torch operators):
autograd against torch's own, ``gradcheck``, ``torch.library.opcheck``, tracing under
``torch.compile`` (the fake kernels and the autograd registration) and argument errors.
Skipped where torch is not installed (CI installs none: the GPU suite runs the CUDA side,
tests/test_gpu_softmax_grad.py)."""

from __future__ import annotations

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
