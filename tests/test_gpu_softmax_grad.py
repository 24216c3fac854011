"""GPU tests of softmax_backward / log_softmax_backward and the torch adapter: every path
forced on the same inputs at every boundary column count against a float64 reference (outputs
poisoned first), layouts, axes, in place, special values, frameworks, accuracy against torch's
own gradients, autograd, ``torch.library.opcheck`` and ``torch.compile``, 64-bit indexing.
Skipped (with the reason) where no CUDA GPU is present."""

from __future__ import annotations

import numpy as np
import pytest
from _gpu import DTYPES, GPU_MARKS, TOL, cupy, poisoned_allocations, row_errors, spy_launches
from test_cpu_softmax_grad import long_double_log_softmax_grad

import cunorm
from cunorm import _dispatch, _grad_dispatch, softmax_grad
from cunorm._device import device_props

pytestmark = GPU_MARKS
OPS = {"softmax_backward": (cunorm.softmax, cunorm.softmax_backward),
       "log_softmax_backward": (cunorm.log_softmax, cunorm.log_softmax_backward)}
# Every regime edge of the planner: lane groups, pack multiples +-1, the warp path's last row
# (1024 16-bit / 512 float32 / 256 float64 columns), block sizes, the block path's last row
# (32768 / 16384 / 8192) and the cluster path's first (32776 / 16388 / 8194: a slice a block
# partly filled), its full slices of a cluster of 8 (131072 16-bit), 2^16 + 1.
BOUNDARY_COLS = [1, 2, 3, 7, 8, 9, 31, 32, 33, 255, 256, 257, 258, 260, 511, 512, 513, 516, 520,
                 1000, 1023, 1024, 1025, 1032, 2047, 2048, 2049, 4095, 4096, 8192, 8193, 8194,
                 8196, 16384, 16385, 16388, 32768, 32769, 32776, 65537, 131072]


def reference(y: np.ndarray, dy: np.ndarray, axis, log: bool) -> np.ndarray:
    """float64 gradient from the same (rounded) y and dy the kernels read."""
    yf, dyf = y.astype(np.float64), dy.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if log:
            return dyf - np.exp(yf) * dyf.sum(axis=axis, keepdims=True)
        return yf * (dyf - (yf * dyf).sum(axis=axis, keepdims=True))


def inputs(shape, dtype, log: bool, seed: int, axis=-1):
    """y = the forward of fresh N(0, 3) data and dy = N(0, 1), on the GPU, with host copies."""
    rng = np.random.default_rng(seed)
    fwd = cunorm.log_softmax if log else cunorm.softmax
    y = fwd(cupy.asarray((rng.standard_normal(shape) * 3).astype(dtype)), axis=axis)
    dy = cupy.asarray(rng.standard_normal(shape).astype(dtype))
    return y, dy, cupy.asnumpy(y), cupy.asnumpy(dy)


def fits(path: str, cols: int, dtype) -> bool:
    """Whether the planner puts fresh contiguous rows of ``cols`` on ``path`` when forced."""
    if path == "cluster" and not device_props(cupy.cuda.Device().id).has_clusters:
        return False
    itemsize = np.dtype(dtype).itemsize
    pack = _dispatch.max_pack(cols, itemsize, 16)
    return _grad_dispatch.grad_config(path, cols, pack, itemsize) is not None


# --- every path on the same inputs at every boundary ------------------------------------
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("cols", BOUNDARY_COLS)
def test_paths_agree_at_boundaries(op, dtype, cols, monkeypatch):
    rows = 37 if cols <= 4096 else 5  # odd: the last block's groups are partly empty
    log = op.startswith("log")
    y, dy, yh, dyh = inputs((rows, cols), dtype, log, seed=cols)
    ref = reference(yh, dyh, -1, log)
    launched = spy_launches(monkeypatch)
    results = {}
    for path in (None, *_grad_dispatch.GRAD_PATHS):
        if path is not None and not fits(path, cols, dtype):
            with _dispatch.force_path(path), pytest.raises(ValueError,
                                                           match="do not fit|needs sm_90"):
                OPS[op][1](y, dy)
            continue
        with poisoned_allocations(), _dispatch.force_path(path):
            dx = OPS[op][1](y, dy)
        plans = [p for k, (p, *_) in softmax_grad._PLANS.items()
                 if k[1:5] == (op, dtype.name, rows, cols) and k[-1] == path]
        assert len(plans) == 1 and (path is None or plans[0].path == path), plans
        assert "softmax_grad" in launched[-1][0], launched[-1]
        host = cupy.asnumpy(dx).astype(np.float64)
        assert not np.isnan(host).any(), f"path {path}: unwritten or NaN output"
        err = row_errors(host, ref).max()
        assert err <= TOL[dtype.name], f"path {path}: error {err:.3g} > {TOL[dtype.name]}"
        results[path] = host
    for path, host in results.items():  # one function whatever the path
        np.testing.assert_allclose(host, results[None], rtol=0, err_msg=str(path),
                                   atol=2 * TOL[dtype.name] * np.abs(ref).max())


# --- layouts, axes, in place ------------------------------------------------------------
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_layouts_and_axes(op, dtype):
    log = op.startswith("log")
    bwd = OPS[op][1]
    tol = TOL[dtype.name]
    # padded rows (a row stride of its own for y, dy and out), read and written in place
    y, dy, yh, dyh = inputs((24, 1100), dtype, log, seed=3)
    ys, dys = y[:, :1000], dy[:, :1000]
    out = cupy.full((24, 1200), np.nan, dtype)[:, 100:1100]
    assert bwd(ys, dys, out=out) is out
    assert row_errors(out, reference(yh[:, :1000], dyh[:, :1000], -1, log)).max() <= tol
    # a non-last axis, a tuple of axes, axes that are not one block, a 1-D array
    x = cupy.asarray(np.random.default_rng(4).standard_normal((6, 7, 40)).astype(dtype))
    g = cupy.asarray(np.random.default_rng(5).standard_normal((6, 7, 40)).astype(dtype))
    fwd = OPS[op][0]
    for axis in (0, 1, (1, 2), (0, 2), (0, 1, 2)):
        yy = fwd(x, axis=axis)
        ref = reference(cupy.asnumpy(yy), cupy.asnumpy(g), axis, log)
        got = cupy.asnumpy(bwd(yy, g, axis=axis)).astype(np.float64)
        scale = np.abs(ref).max()
        np.testing.assert_allclose(got, ref, rtol=0, atol=2 * tol * scale, err_msg=str(axis))
    v = fwd(x[0, 0])
    assert bwd(v, g[0, 0]).shape == (40,)
    # rows that are not one run of memory (every other column): copied, still right
    assert row_errors(bwd(y[:, ::2], dy[:, ::2]),
                      reference(yh[:, ::2], dyh[:, ::2], -1, log)).max() <= tol


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_in_place_and_overlap(op, dtype):
    log = op.startswith("log")
    bwd = OPS[op][1]
    # warp, block, cluster (softmax_backward but float64), uncached
    for cols in (100, 5000, 70000, 300000):
        y, dy, yh, dyh = inputs((9, cols), dtype, log, seed=cols)
        ref = reference(yh, dyh, -1, log)
        d2 = dy.copy()
        assert bwd(y, d2, out=d2) is d2  # dx over dy
        assert row_errors(d2, ref).max() <= TOL[dtype.name]
        y2 = y.copy()
        assert bwd(y2, dy, out=y2) is y2  # dx over y
        assert row_errors(y2, ref).max() <= TOL[dtype.name]
    # grids that loop over their rows: GRAD_WAVES = 0 leaves one block, on every path but the
    # cluster path (test_cluster_grids_loop_over_rows)
    y, dy, yh, dyh = inputs((203, 64), dtype, log, seed=9)
    ref = reference(yh, dyh, -1, log)
    waves = _grad_dispatch.GRAD_WAVES
    try:
        _grad_dispatch.GRAD_WAVES = 0
        for path in (p for p in _grad_dispatch.GRAD_PATHS if p != "cluster"):
            softmax_grad._PLANS.clear()
            with _dispatch.force_path(path):
                dx = bwd(y, dy)
            (plan, *_), = softmax_grad._PLANS.values()
            assert plan.grid == 1 and plan.path == path
            assert row_errors(dx, ref).max() <= TOL[dtype.name], path
    finally:
        _grad_dispatch.GRAD_WAVES = waves
        softmax_grad._PLANS.clear()
    # out overlapping dy shifted by one element: computed in a temporary, then copied
    buf = cupy.asarray(np.random.default_rng(6).standard_normal(8 * 64 + 1).astype(np.float32))
    dyv, outv = buf[:-1].reshape(8, 64), buf[1:].reshape(8, 64)
    y, _, yh, _ = inputs((8, 64), np.float32, log, seed=7)
    ref = reference(yh, cupy.asnumpy(dyv), -1, log)
    bwd(y, dyv, out=outv)
    assert row_errors(outv, ref).max() <= TOL["float32"]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_cluster_grids_loop_over_rows(op, dtype):
    """The cluster path forced on every dtype with at least four times the resident
    clusters' rows, so that every cluster takes each of its two mails at least twice, in
    place over dy too; then rows of their own strides (y, dy and out padded apart)."""
    if not device_props(cupy.cuda.Device().id).has_clusters:
        pytest.skip("thread-block clusters need sm_90")
    rows, cols = 1001, 16384
    log = op.startswith("log")
    y, dy, yh, dyh = inputs((rows, cols), dtype, log, seed=11)
    ref = reference(yh, dyh, -1, log)
    with poisoned_allocations(), _dispatch.force_path("cluster"):
        dx = OPS[op][1](y, dy)
        OPS[op][1](y, dy, out=dy)
    plan = next(p for k, (p, *_) in softmax_grad._PLANS.items()
                if k[1:5] == (op, dtype.name, rows, cols) and k[-1] == "cluster")
    clusters = plan.grid // int(plan.kernel.rstrip(">").rsplit(",", 1)[1])
    assert plan.path == "cluster" and rows >= 4 * clusters, plan
    for got in (dx, dy):
        err = row_errors(got, ref).max()
        assert err <= TOL[dtype.name], f"{clusters} clusters: error {err:.3g}"
    # padded rows: y, dy and out one, two and three 16-byte packs apart (a slice a block of
    # a cluster of 4 partly filled, for 16-bit rows)
    rows, cols, pad = 7, 16392, 16 // dtype.itemsize
    y, dy, yh, dyh = inputs((rows, cols), dtype, log, seed=12)
    ys = cupy.full((rows, cols + pad), np.nan, dtype)[:, :cols]
    dys = cupy.full((rows, cols + 2 * pad), np.nan, dtype)[:, :cols]
    ys[...], dys[...] = y, dy
    out = cupy.full((rows, cols + 3 * pad), np.nan, dtype)[:, :cols]
    with _dispatch.force_path("cluster"):
        assert OPS[op][1](ys, dys, out=out) is out
    plan = next(p for k, (p, *_) in softmax_grad._PLANS.items()
                if k[1:5] == (op, dtype.name, rows, cols) and k[-1] == "cluster")
    assert plan.path == "cluster", plan
    assert row_errors(out, reference(yh, dyh, -1, log)).max() <= TOL[dtype.name]


@pytest.mark.parametrize("op", list(OPS))
def test_special_values_and_empty(op):
    log = op.startswith("log")
    bwd = OPS[op][1]
    y, dy, _, _ = inputs((4, 300), np.float32, log, seed=8)
    dy[1, 7] = np.nan
    dx = cupy.asnumpy(bwd(y, dy))
    assert np.isnan(dx[1]).all()  # the row's sum is NaN
    assert not np.isnan(dx[[0, 2, 3]]).any()
    if log:  # a zero probability (y = -inf) passes dy through
        yl = cupy.asarray(np.log(np.array([[0.0, 0.25, 0.75]], np.float32)))
        dyl = cupy.asarray(np.array([[2.0, 1.0, 1.0]], np.float32))
        with np.errstate(divide="ignore"):
            np.testing.assert_allclose(cupy.asnumpy(bwd(yl, dyl)), [[2.0, 0.0, -2.0]],
                                       atol=1e-6)
    for shape in ((0, 5), (5, 0), (0,)):
        e = cupy.empty(shape, np.float32)
        assert bwd(e, e).shape == shape


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("margin", [4.0, 8.0, 12.0])
@pytest.mark.parametrize("cols", [256, 1000, 40000])
def test_log_softmax_backward_of_a_confident_prediction(dtype, margin, cols):
    """Cross-entropy's gradient where the prediction is confident: one logit a row ahead by
    ``2 * margin``, dy minus one-hot there, so dx_t = p_t - 1 cancels (exp(y_t) near 1; torch's
    float kernels lose it: 1e-1 of the result at 1 - p = 1.5e-6). Every path that holds the
    row (256 columns reach the warp path in every dtype), against a ``long double`` reference
    from the same rounded y and dy. float16 compares the rows where 1 - p stays a normal number
    (>= 2^-14): below, dx_t itself is subnormal and holds no 2e-3."""
    rng = np.random.default_rng(int(margin) + cols)
    x = rng.standard_normal((16, cols))
    x[:, 5] += 2 * margin
    y = cunorm.log_softmax(cupy.asarray(x.astype(dtype)))
    yh = cupy.asnumpy(y)
    one_minus_p = -np.expm1(yh[:, 5].astype(np.float64))  # each row's
    # (float16 rows where 1 - p is subnormal are left out of the comparison; a test taking
    # `-expm1(y).min()`, the largest 1 - p, once kept a row of 1.4e-5: 2.2e-3 off by its
    # output's rounding alone)
    kept = one_minus_p >= 2.0**-14 if dtype == np.float16 else np.ones(16, bool)
    if not kept.any():
        pytest.skip(f"float16: 1 - p <= {one_minus_p.max():.2g} is subnormal in every row")
    dyh = np.zeros((16, cols), dtype)
    dyh[:, 5] = -1
    ref = long_double_log_softmax_grad(yh, dyh)
    for path in (None, *_grad_dispatch.GRAD_PATHS):
        if path is not None and not fits(path, cols, dtype):
            continue
        with _dispatch.force_path(path):
            dx = cunorm.log_softmax_backward(y, cupy.asarray(dyh))
        err = row_errors(dx, ref)[kept].max()
        assert err <= TOL[dtype.name], f"path {path}: error {err:.3g} > {TOL[dtype.name]}"


def test_bad_gpu_inputs():
    y = cupy.zeros((2, 3), np.float32)
    torch = pytest.importorskip("torch")
    t = torch.zeros(2, 3, device="cuda")
    with pytest.raises(TypeError, match="out is a numpy array but y is a torch array"):
        cunorm.softmax_backward(t, t, out=np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="dy is a CPU torch.Tensor but y is a CUDA tensor"):
        cunorm.softmax_backward(t, t.cpu())
    with pytest.raises(TypeError, match=r"dy is a numpy array but y is a cupy array"):
        cunorm.softmax_backward(y, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="dy has dtype float16; expected float32"):
        cunorm.softmax_backward(y, y.astype(np.float16))
    with pytest.raises(ValueError, match="dy has shape"):
        cunorm.log_softmax_backward(y, y[:1])
    with pytest.raises(TypeError, match="out has dtype float64"):
        cunorm.softmax_backward(y, y, out=cupy.zeros((2, 3), np.float64))
    # a valid out beside a bad argument is left as it was
    out = cupy.full((2, 3), 7.0, np.float32)
    for bad in (y.astype(np.float16), y[:1], cupy.zeros((3, 2), np.float32)):
        with pytest.raises((TypeError, ValueError)):
            cunorm.softmax_backward(y, bad, out=out)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        cunorm.log_softmax_backward(y, y, axis=2, out=out)
    with pytest.raises(ValueError, match="out is a broadcast view"):
        cunorm.softmax_backward(y, y, out=cupy.broadcast_to(cupy.zeros(3, np.float32), (2, 3)))
    assert float(out.min()) == float(out.max()) == 7.0


# --- frameworks -------------------------------------------------------------------------
def test_torch_and_jax_round_trips():
    torch = pytest.importorskip("torch")
    t = torch.randn(33, 777, device="cuda", dtype=torch.float32)
    y = torch.softmax(t, -1)
    g = torch.randn_like(t)
    dx = cunorm.softmax_backward(y, g)
    assert isinstance(dx, torch.Tensor) and dx.device == t.device
    want = torch.ops.aten._softmax_backward_data(g.double(), y.double(), -1, torch.float64)
    torch.testing.assert_close(dx.double(), want, atol=1e-6, rtol=1e-5)
    out = torch.empty_like(t)
    assert cunorm.log_softmax_backward(torch.log_softmax(t, -1), g, out=out) is out
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here (the torch half ran)")
    yj = jax.device_put(np.asarray(y.cpu()), gpu)
    gj = jax.device_put(np.asarray(g.cpu()), gpu)
    dxj = cunorm.softmax_backward(yj, gj)
    assert isinstance(dxj, jax.Array)
    np.testing.assert_allclose(np.asarray(dxj), dx.cpu().numpy(), atol=1e-7)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("cols", [100, 1024, 5000, 40000])
def test_torch_adapter_gradients_no_less_accurate_than_torch(op, dtype, cols):
    """cunorm.torch's forward and backward against torch's own autograd on the same input,
    both measured against a ``long double`` reference from the same rounded input: cunorm no
    worse than torch (by 10%; float64 by 2x: both are a few roundings off there, in orders
    that differ)."""
    torch = pytest.importorskip("torch")
    import cunorm.torch as ct

    gen = torch.Generator(device="cuda").manual_seed(cols)
    tdt = getattr(torch, dtype)
    x0 = (torch.randn(16, cols, device="cuda", generator=gen) * 3).to(tdt)
    g0 = torch.randn(16, cols, device="cuda", generator=gen).to(tdt)
    xl, gl = (t.double().cpu().numpy().astype(np.longdouble) for t in (x0, g0))
    z = xl - xl.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    if op == "log_softmax":
        ref_y = z - np.log(np.exp(z).sum(-1, keepdims=True))
        ref_dx = gl - p * gl.sum(-1, keepdims=True)
    else:
        ref_y, ref_dx = p, p * (gl - (p * gl).sum(-1, keepdims=True))
    ref_y, ref_dx = ref_y.astype(np.float64), ref_dx.astype(np.float64)
    errors = {}
    for name, f in (("cunorm", getattr(ct, op)), ("torch", getattr(torch, op))):
        x = x0.clone().requires_grad_()
        y = f(x, -1)
        y.backward(g0)
        assert x.grad.dtype == tdt and x.grad.shape == x.shape
        errors[name] = (row_errors(y.detach().double().cpu().numpy(), ref_y).max(),
                        row_errors(x.grad.double().cpu().numpy(), ref_dx).max())
    assert errors["cunorm"][0] <= TOL[dtype]
    assert errors["cunorm"][1] <= 4 * TOL[dtype]
    factor = 2.0 if dtype == "float64" else 1.1
    assert errors["cunorm"][0] <= errors["torch"][0] * factor + 1e-18, errors
    assert errors["cunorm"][1] <= errors["torch"][1] * factor + 1e-18, errors


def test_torch_adapter_gradcheck_opcheck_and_compile():
    torch = pytest.importorskip("torch")
    import cunorm.torch as ct

    x = torch.randn(5, 37, device="cuda", dtype=torch.float64, requires_grad=True)
    for f in (ct.softmax, ct.log_softmax):
        assert torch.autograd.gradcheck(lambda t, f=f: f(t, dim=-1), (x,))
        assert torch.autograd.gradcheck(lambda t, f=f: f(t.transpose(0, 1), dim=0), (x,))
    xf = torch.randn(8, 300, device="cuda")
    torch.library.opcheck(torch.ops.cunorm.softmax.default, (xf, -1))
    torch.library.opcheck(torch.ops.cunorm.log_softmax.default, (xf, 1))
    yf = torch.softmax(xf, -1)
    torch.library.opcheck(torch.ops.cunorm.softmax_backward.default, (yf, xf, -1))
    torch.library.opcheck(torch.ops.cunorm.log_softmax_backward.default, (yf.log(), xf, -1))

    def loss(t):
        return (ct.softmax(t * 2, dim=-1) * torch.arange(300, device="cuda")).sum()

    a = torch.randn(8, 300, device="cuda", requires_grad=True)
    b = a.detach().clone().requires_grad_()
    loss(a).backward()
    torch.compile(loss, fullgraph=True)(b).backward()
    torch.testing.assert_close(b.grad, a.grad)
    with pytest.raises(TypeError, match=r"cunorm.torch.softmax\(\): dim must be an int"):
        ct.softmax(xf, dim=(0, 1))


# --- 64-bit indexing --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("rows,cols,path", [(2**21 + 3, 1024, "warp"),
                                            (2**16 + 1, 2**15, "block"),
                                            (2**15 + 1, 2**16, "uncached")])
def test_more_than_2_31_elements(rows, cols, path):
    assert rows * cols > 2**31
    y = cupy.random.random((rows, cols), dtype=np.float32).astype(np.float16)
    dy = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(np.float16)
    picks = [0, 1, rows - 2, rows - 1]
    yh, dyh = cupy.asnumpy(y[picks]), cupy.asnumpy(dy[picks])
    with _dispatch.force_path(path):
        dx = cunorm.softmax_backward(y, dy, out=dy)  # in place over 2^31+ elements
    assert row_errors(dx[picks], reference(yh, dyh, -1, False)).max() <= TOL["float16"]
    # (conftest frees the arrays after the test, as for every test marked slow)
