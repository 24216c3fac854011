"""GPU tests of layer_norm_backward / rms_norm_backward: every path forced on the same inputs
at every boundary column count against a float64 reference (outputs poisoned first), grids
that loop over many rows, layouts and axes, empty arrays, frameworks, accuracy against
torch's own gradients, 64-bit indexing. Skipped (with the reason) where no CUDA GPU is
present."""

from __future__ import annotations

import numpy as np
import pytest
from _gpu import DTYPES, GPU_MARKS, TOL, cupy, poisoned_allocations, row_errors, spy_launches

import cunorm
from cunorm import _dispatch, _grad_dispatch, norm_grad
from cunorm._device import device_props

pytestmark = GPU_MARKS
OPS = ("layer_norm_backward", "rms_norm_backward")
# Every regime edge of the planner: lane groups (1-32 packs), row groups of 64-256 threads
# (256 packs), whole blocks (1024 packs), clusters past them (12296: 16-bit layer_norm's
# first; 32768 and 32776: full and partly filled slices of a cluster of 8), the uncached path
# past those, packs of every width.
BOUNDARY_COLS = [1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 66, 127, 128, 129, 132, 255, 256,
                 257, 264, 511, 512, 513, 514, 1000, 1023, 1024, 1025, 1028, 2047, 2048, 2049,
                 2050, 2056, 4096, 4100, 8192, 8200, 12296, 16385, 32768, 32776, 65537]


def forward(op: str, x, weight):
    """(mean or None, rstd) of cunorm's forward on x (GPU)."""
    if op == "layer_norm_backward":
        _, mean, rstd = cunorm.layer_norm(x, weight, return_stats=True)
        return mean, rstd
    _, rstd = cunorm.rms_norm(x, weight, return_stats=True)
    return None, rstd


def backward(op: str, dy, x, mean, rstd, weight, axis=-1):
    """(dx, dweight, dbias or None) of either op."""
    if op == "layer_norm_backward":
        return cunorm.layer_norm_backward(dy, x, mean, rstd, weight, axis=axis)
    return (*cunorm.rms_norm_backward(dy, x, rstd, weight, axis=axis), None)


def host64(*arrays):
    return [None if a is None else cupy.asnumpy(a).astype(np.float64) for a in arrays]


def reference(op, dy, x, mean, rstd, weight, axis=-1):
    """float64 gradients (NumPy path) from the same rounded operands and statistics."""
    return backward(op, *host64(dy, x, mean, rstd, weight), axis=axis)


def inputs(shape, dtype, seed: int, with_weight=True, norm_shape=None):
    rng = np.random.default_rng(seed)
    x = cupy.asarray((rng.standard_normal(shape) * 2 + 0.5).astype(dtype))
    dy = cupy.asarray(rng.standard_normal(shape).astype(dtype))
    wshape = norm_shape if norm_shape is not None else shape[-1:]
    w = cupy.asarray((1 + 0.5 * rng.standard_normal(wshape)).astype(dtype)) if with_weight else None
    return x, dy, w


def col_error(got, ref) -> float:
    """Largest |got - ref| over the largest |ref| (the column sums as one row)."""
    host = cupy.asnumpy(got).astype(np.float64).ravel()
    assert not np.isnan(host).any(), "unwritten or NaN column sums"
    return float(np.abs(host - ref.ravel()).max() / max(np.abs(ref).max(), 1e-300))


def degenerate_scale(dy, rstd, weight) -> np.ndarray:
    """Each row's rstd * max |dy * weight|: the size of dx's terms before they cancel. The
    forward of a row of one column (two for layer_norm) is +-1 whatever x (up to eps), so
    its gradient is ~eps / var and its terms cancel almost wholly: there dx is held to this
    scale rather than to its own (a float64 row of one column has dx = 0 exactly)."""
    dyh, rs, w = host64(dy, rstd, weight)
    g = np.abs(dyh if w is None else dyh * w)
    return rs.reshape(-1) * g.reshape(rs.size, -1).max(axis=-1)


def check(op, dtype, got, ref, what="", scale=None):
    tol = TOL[dtype.name]
    dx = cupy.asnumpy(got[0]).astype(np.float64)
    assert not np.isnan(dx).any(), f"{what}: unwritten or NaN dx"
    err = row_errors(dx.reshape(ref[0].shape), ref[0])
    if scale is not None:
        ref_max = np.abs(ref[0]).reshape(scale.size, -1).max(axis=-1)
        err = err * ref_max / np.maximum(ref_max, scale)
    err = err.max()
    assert err <= tol, f"{what}: dx error {err:.3g} > {tol}"
    for name, g, r in (("dweight", got[1], ref[1]), ("dbias", got[2], ref[2])):
        if r is not None:
            e = col_error(g, r)
            assert e <= tol, f"{what}: {name} error {e:.3g} > {tol}"


def fits(path: str, op: str, cols: int, dtype) -> bool:
    if path == "cluster" and not device_props(cupy.cuda.Device().id).has_clusters:
        return False
    itemsize = np.dtype(dtype).itemsize
    pack = _dispatch.max_pack(cols, itemsize, 16)
    return _grad_dispatch.norm_grad_config(path, op, cols, pack, itemsize) is not None


# --- every path on the same inputs at every boundary ------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("cols", BOUNDARY_COLS)
def test_paths_agree_at_boundaries(op, dtype, cols, monkeypatch):
    rows = 37 if cols <= 4096 else 5  # odd: the last block's row groups are partly empty
    x, dy, w = inputs((rows, cols), dtype, seed=cols)
    mean, rstd = forward(op, x, w)
    ref = reference(op, dy, x, mean, rstd, w)
    scale = degenerate_scale(dy, rstd, w) if cols <= (1 if op == "rms_norm_backward" else 2) \
        else None
    launched = spy_launches(monkeypatch)
    results = {}
    for path in (None, *_grad_dispatch.NORM_GRAD_PATHS):
        if path is not None and not fits(path, op, cols, dtype):
            with _dispatch.force_path(path), pytest.raises(ValueError,
                                                           match="do not fit|needs sm_90"):
                backward(op, dy, x, mean, rstd, w)
            continue
        with poisoned_allocations(), _dispatch.force_path(path):
            got = backward(op, dy, x, mean, rstd, w)
        plans = [p for k, (p, *_) in norm_grad._PLANS.items()
                 if k[1:5] == (op, dtype.name, rows, cols) and k[-1] == path]
        assert len(plans) == 1 and (path is None or plans[0].rows.path == path), plans
        assert "norm_grad_cols" in launched[-1][0], launched[-1]
        check(op, dtype, got, ref, f"path {path}", scale)
        results[path] = [cupy.asnumpy(g).astype(np.float64) for g in got if g is not None]
    for path, host in results.items():  # one function whatever the path
        for a, b in zip(host, results[None], strict=True):
            size = max(np.abs(b).max(), 0 if scale is None else scale.max())
            np.testing.assert_allclose(a, b, rtol=0, atol=2 * TOL[dtype.name] * size,
                                       err_msg=str(path))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("cols,with_weight,rows", [(64, True, 200001), (1000, False, 20001),
                                                   (3000, True, 20001), (20000, False, 1501)])
def test_many_rows(op, dtype, cols, with_weight, rows):
    """Grids that loop over rows (200001 rows of 64 columns: 3126 blocks' worth of 64 rows on
    at most 528 resident blocks, the last pass leaving part of a warp), every block's column
    sums over many rows, added up."""
    x, dy, w = inputs((rows, cols), dtype, seed=rows + cols, with_weight=with_weight)
    mean, rstd = forward(op, x, w)
    with poisoned_allocations():
        got = backward(op, dy, x, mean, rstd, w)
    check(op, dtype, got, reference(op, dy, x, mean, rstd, w), f"{rows} x {cols}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_cluster_grids_loop_over_rows(op, dtype):
    """The cluster path forced on every dtype with more rows than twice the resident clusters,
    so every cluster exchanges through its mail again after the barrier that closes a row."""
    if not device_props(cupy.cuda.Device().id).has_clusters:
        pytest.skip("thread-block clusters need sm_90")
    rows, cols = 1001, 16384
    x, dy, w = inputs((rows, cols), dtype, seed=7)
    mean, rstd = forward(op, x, w)
    with poisoned_allocations(), _dispatch.force_path("cluster"):
        got = backward(op, dy, x, mean, rstd, w)
    plan = next(p for k, (p, *_) in norm_grad._PLANS.items()
                if k[1:5] == (op, dtype.name, rows, cols) and k[-1] == "cluster")
    clusters = plan.partial_rows
    assert plan.rows.path == "cluster" and rows > 2 * clusters, plan
    check(op, dtype, got, reference(op, dy, x, mean, rstd, w), f"{clusters} clusters")


# --- layouts and axes -------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_layouts_and_axes(op, dtype):
    # several trailing axes, with a weight of their shape
    x, dy, w = inputs((6, 5, 40), dtype, seed=1, norm_shape=(5, 40))
    if op == "layer_norm_backward":
        _, mean, rstd = cunorm.layer_norm(x, w, axis=(1, 2), return_stats=True)
    else:
        mean, (_, rstd) = None, cunorm.rms_norm(x, w, axis=(1, 2), return_stats=True)
    got = backward(op, dy, x, mean, rstd, w, axis=(1, 2))
    assert got[0].shape == x.shape and got[1].shape == (5, 40)
    check(op, dtype, got, reference(op, dy, x, mean, rstd, w, axis=(1, 2)), "axes (1, 2)")
    # a leading axis (moved last by a copy), and views with row strides
    x, dy, w = inputs((50, 7), dtype, seed=2, norm_shape=(50,))
    if op == "layer_norm_backward":
        _, mean, rstd = cunorm.layer_norm(x, w, axis=0, return_stats=True)
    else:
        mean, (_, rstd) = None, cunorm.rms_norm(x, w, axis=0, return_stats=True)
    (dx, *sums), (ref_dx, *ref_sums) = (backward(op, dy, x, mean, rstd, w, axis=0),
                                        reference(op, dy, x, mean, rstd, w, axis=0))
    check(op, dtype, [dx.T, *sums], [ref_dx.T, *ref_sums], "axis 0")  # rows: x's columns
    big, dbig, w = inputs((30, 304), dtype, seed=3, norm_shape=(256,))
    for x, dy in ((big[:, 10:266], dbig[:, 20:276]),  # row strides 304: narrow packs
                  (big[:, 8:264], dbig[:, 16:272]),  # row strides 304, 16-byte packs
                  (big[:, 8:264], dbig.T.copy().T[:, 16:272])):  # dy column-major: copied
        mean, rstd = forward(op, x, w)
        check(op, dtype, backward(op, dy, x, mean, rstd, w),
              reference(op, dy, x, mean, rstd, w), f"strided rows {x.strides} {dy.strides}")


def test_empty_and_bad_gpu_inputs():
    x = cupy.zeros((0, 8), np.float32)
    dx, dw, db = cunorm.layer_norm_backward(x, x, cupy.zeros(0, np.float32),
                                            cupy.zeros(0, np.float32))
    assert dx.shape == (0, 8) and float(abs(dw).sum() + abs(db).sum()) == 0 and dw.shape == (8,)
    x = cupy.ones((4, 8), np.float16)
    rstd = cupy.ones(4, np.float32)
    with pytest.raises(TypeError, match=r"rstd has dtype float16; expected float32"):
        cunorm.rms_norm_backward(x, x, rstd.astype(np.float16))
    with pytest.raises(ValueError, match=r"weight has shape \(4,\); expected \(8,\)"):
        cunorm.rms_norm_backward(x, x, rstd, cupy.ones(4, np.float16))
    with pytest.raises(TypeError, match="weight is a numpy array but dy is a cupy array"):
        cunorm.rms_norm_backward(x, x, rstd, np.ones(8, np.float16))


# --- frameworks -------------------------------------------------------------------------
def test_torch_and_jax_round_trips():
    torch = pytest.importorskip("torch")
    t = torch.randn(33, 777, device="cuda", dtype=torch.float32)
    w = torch.randn(777, device="cuda")
    g = torch.randn_like(t)
    _, mean, rstd = cunorm.layer_norm(t, w, return_stats=True)
    dx, dw, db = cunorm.layer_norm_backward(g, t, mean, rstd, w)
    assert all(isinstance(a, torch.Tensor) and a.device == t.device for a in (dx, dw, db))
    want = torch.ops.aten.native_layer_norm_backward(
        g.double(), t.double(), [777], mean.double()[:, None], rstd.double()[:, None],
        w.double(), torch.zeros_like(w.double()), [True, True, True])
    for a, b in zip((dx, dw, db), want, strict=True):
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-5)
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here (the torch half ran)")
    on = [jax.device_put(np.asarray(a.cpu()), gpu) for a in (g, t, rstd, w)]
    dxj, dwj = cunorm.rms_norm_backward(*on)
    assert isinstance(dxj, jax.Array) and isinstance(dwj, jax.Array)
    dxc, dwc = cunorm.rms_norm_backward(*(cupy.asarray(np.asarray(a)) for a in on))
    np.testing.assert_allclose(np.asarray(dxj), cupy.asnumpy(dxc), rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(dwj), cupy.asnumpy(dwc), rtol=0, atol=0)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("cols", [100, 1024, 5000, 40000])
def test_no_less_accurate_than_torch(op, dtype, cols):
    """dx, dweight (and dbias) from each library's own forward statistics, against the exact
    gradient of the forward at the same rounded x, dy and weight (float64 statistics)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rows = 64
    gen = torch.Generator(device="cuda").manual_seed(cols)
    tdt = getattr(torch, dtype)
    x = (torch.randn(rows, cols, device="cuda", generator=gen) * 2 + 0.5).to(tdt)
    dy = torch.randn(rows, cols, device="cuda", generator=gen).to(tdt)
    w = (1 + 0.5 * torch.randn(cols, device="cuda", generator=gen)).to(tdt)
    b = torch.zeros(cols, device="cuda", dtype=tdt)
    rms = op == "rms_norm_backward"
    # exact: float64 forward statistics, NumPy path
    x64, dy64, w64 = (a.double().cpu().numpy() for a in (x, dy, w))
    if rms:
        _, r64 = cunorm.rms_norm(x64, w64, return_stats=True)
        exact = (*cunorm.rms_norm_backward(dy64, x64, r64, w64), None)
    else:
        _, m64, r64 = cunorm.layer_norm(x64, w64, return_stats=True)
        exact = cunorm.layer_norm_backward(dy64, x64, m64, r64, w64)
    # torch: autograd of its own forward
    xt, wt, bt = (a.clone().requires_grad_() for a in (x, w, b))
    yt = F.rms_norm(xt, [cols], wt, eps=1e-6) if rms else F.layer_norm(xt, [cols], wt, bt)
    yt.backward(dy)
    theirs = (xt.grad, wt.grad, None if rms else bt.grad)
    # cunorm: its forward's statistics, then the backward
    mean, rstd = forward(op, x, w)
    ours = backward(op, dy, x, mean, rstd, w)
    for i, name in enumerate(("dx", "dweight", "dbias")):
        if exact[i] is None:
            continue
        t = theirs[i].double().cpu().numpy()
        o = cupy.asnumpy(cupy.asarray(ours[i])).astype(np.float64) if not isinstance(
            ours[i], torch.Tensor) else ours[i].double().cpu().numpy()
        if i == 0:
            e_t, e_o = row_errors(t, exact[0]).max(), row_errors(o, exact[0]).max()
        else:
            e_t, e_o = (float(np.abs(a - exact[i]).max() / np.abs(exact[i]).max())
                        for a in (t, o))
        assert e_o <= max(1.05 * e_t, TOL[dtype] / 4), f"{name}: cunorm {e_o:.3g}, torch {e_t:.3g}"


# --- 64-bit indexing --------------------------------------------------------------------
def normal_float16(rows: int, cols: int, seed: int):
    """N(0, 1) float16 of (rows, cols), drawn a chunk of rows at a time (no float32 array of
    the whole size beside it: the other test workers hold memory too)."""
    out = cupy.empty((rows, cols), np.float16)
    rng = cupy.random.default_rng(seed)
    step = max(1, (1 << 28) // cols)
    for r in range(0, rows, step):
        out[r:r + step] = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("rows,cols,path", [(2**21 + 3, 1024, "block"),
                                            (2**15 + 1, 2**16, "uncached")])
def test_more_than_2_31_elements(rows, cols, path):
    assert rows * cols > 2**31
    x, dy = normal_float16(rows, cols, 1), normal_float16(rows, cols, 2)
    _, rstd = cunorm.rms_norm(x, return_stats=True)
    with _dispatch.force_path(path):
        dx, dw = cunorm.rms_norm_backward(dy, x, rstd)
    picks = [0, 1, rows - 2, rows - 1]
    ref = reference("rms_norm_backward", dy[picks], x[picks], None, rstd[picks], None)
    assert row_errors(dx[picks], ref[0]).max() <= TOL["float16"]
    # dweight over every row: the column sums of x * rstd * dy, in float64 a chunk of rows at
    # a time (no temporaries of 2^31 elements beside the operands)
    want = cupy.zeros(cols, np.float64)
    step = max(1, (1 << 26) // cols)
    for r in range(0, rows, step):
        part = x[r:r + step].astype(np.float64) * rstd[r:r + step, None]
        want += (part * dy[r:r + step]).sum(axis=0)
    assert col_error(dw, cupy.asnumpy(want)) <= TOL["float16"]
    # (conftest frees the arrays after the test, as for every test marked slow)
