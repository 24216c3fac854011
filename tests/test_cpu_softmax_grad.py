"""softmax_backward / log_softmax_backward on the CPU: the NumPy path against the Jacobian of
the forward (explicit and by finite differences), every bad input with its message, and the
pure planner (:mod:`cunorm._grad_dispatch`) on fake devices."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_dispatch import A100, H100, H200, SMALL_80, fake_occ

import cunorm
from cunorm import _dispatch
from cunorm import _grad_dispatch as g

OPS = {"softmax_backward": (cunorm.softmax, cunorm.softmax_backward),
       "log_softmax_backward": (cunorm.log_softmax, cunorm.log_softmax_backward)}


def jacobian_product(x: np.ndarray, dy: np.ndarray, log: bool) -> np.ndarray:
    """dx = J(x)^T dy of (log_)softmax over the last axis, from the explicit Jacobian."""
    out = np.empty_like(x)
    for i, (row, g_row) in enumerate(zip(x.reshape(-1, x.shape[-1]),
                                         dy.reshape(-1, x.shape[-1]), strict=True)):
        p = np.exp(row - row.max())
        p /= p.sum()
        if log:
            jac = np.eye(p.size) - p[None, :]  # d log p_i / d x_j
        else:
            jac = np.diag(p) - np.outer(p, p)
        out.reshape(-1, x.shape[-1])[i] = jac.T @ g_row
    return out


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cols", [1, 2, 7, 100])
def test_numpy_path_is_the_jacobian_product(op, cols):
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((5, cols)) * 3
    dy = rng.standard_normal((5, cols))
    fwd, bwd = OPS[op]
    dx = bwd(fwd(x), dy)
    assert dx.dtype == np.float64 and dx.shape == x.shape
    np.testing.assert_allclose(dx, jacobian_product(x, dy, op.startswith("log")),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", OPS)
def test_numpy_path_matches_finite_differences(op):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 9))
    dy = rng.standard_normal((3, 9))
    fwd, bwd = OPS[op]
    h = 1e-6
    numeric = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        numeric[idx] = ((fwd(xp) - fwd(xm)) * dy).sum() / (2 * h)
    np.testing.assert_allclose(bwd(fwd(x), dy), numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("op", OPS)
def test_numpy_path_axes_dtypes_and_out(op):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 5, 6))
    dy = rng.standard_normal((4, 5, 6))
    fwd, bwd = OPS[op]
    log = op.startswith("log")
    # a tuple of axes is one flattened row
    y = fwd(x, axis=(1, 2))
    dx = bwd(y, dy, axis=(1, 2))
    flat = jacobian_product(x.reshape(4, 30), dy.reshape(4, 30), log).reshape(4, 5, 6)
    np.testing.assert_allclose(dx, flat, rtol=1e-12, atol=1e-14)
    # axis 0, and out= (dy itself)
    y0 = fwd(x, axis=0)
    ref = np.moveaxis(jacobian_product(np.moveaxis(x, 0, -1), np.moveaxis(dy, 0, -1), log),
                      -1, 0)
    d2 = dy.copy()
    assert bwd(y0, d2, axis=0, out=d2) is d2
    np.testing.assert_allclose(d2, ref, rtol=1e-12, atol=1e-14)
    # float32 in, float32 out
    d32 = bwd(y.astype(np.float32), dy.astype(np.float32), axis=(1, 2))
    assert d32.dtype == np.float32
    np.testing.assert_allclose(d32, flat, rtol=1e-5, atol=1e-6)
    # empty
    assert bwd(np.empty((0, 3)), np.empty((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("op", OPS)
def test_bad_inputs(op):
    bwd = OPS[op][1]
    y = np.zeros((2, 3))
    with pytest.raises(TypeError, match=rf"{op}\(\): y must be a numpy.ndarray"):
        bwd([[0.0]], y)
    with pytest.raises(TypeError, match=rf"{op}\(\): dy must be a numpy.ndarray"):
        bwd(y, [[0.0]])
    with pytest.raises(ValueError, match=r"dy has shape \(3, 2\); expected \(2, 3\) \(the "
                                         r"shape of y\)"):
        bwd(y, np.zeros((3, 2)))
    with pytest.raises(TypeError, match="dy has dtype float32; expected float64"):
        bwd(y, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="y has dtype int64"):
        bwd(np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        bwd(y, y, axis=2)
    with pytest.raises(ValueError, match="repeats an axis"):
        bwd(y, y, axis=(1, -1))
    with pytest.raises(TypeError, match="axis must be an int"):
        bwd(y, y, axis=1.0)
    with pytest.raises(ValueError, match=r"out has shape \(3,\)"):
        bwd(y, y, out=np.zeros(3))
    with pytest.raises(TypeError, match="out has dtype float32; expected float64"):
        bwd(y, y, out=np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        bwd(y, y, out=[0.0])
    with pytest.raises(ValueError, match="out is a broadcast view"):
        bwd(y, y, out=np.broadcast_to(np.zeros(3), (2, 3)))
    with pytest.raises(ValueError, match="y must have at least one dimension"):
        bwd(np.array(1.0), np.array(1.0))


def long_double_log_softmax_grad(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """log_softmax's gradient over the last axis in ``long double`` from the rounded y and
    dy: ``dy - exp(y) s`` (``s = sum(dy)``), as ``(dy - s) - expm1(y) s`` where exp(y) is
    near 1. A ``long double`` exp(y) near 1 keeps 1e-19 of it: 1e-8 of a result of 1e-11."""
    yl, dl = y.astype(np.longdouble), dy.astype(np.longdouble)
    s = dl.sum(-1, keepdims=True)
    near_one = (dl - s) - np.expm1(yl) * s
    return np.where(yl > -0.7, near_one, dl - np.exp(yl) * s).astype(np.float64)


def test_numpy_log_softmax_backward_of_a_confident_prediction():
    """dx_t = p_t - 1 with p_t near 1 (cross-entropy, a confident prediction): exp(y) would
    lose it to cancellation in float64 too; the NumPy path takes expm1 there, as the kernels
    do. Against a ``long double`` reference from the same y and dy."""
    if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        pytest.skip("long double is double here: no reference wider than the path")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 50))
    x[:, 3] += 30  # 1 - p_t ~ 1e-12
    y = cunorm.log_softmax(x)
    # y_t as a float64 forward leaves it is -log(s) of a float64 s, whose exp(y) comes out
    # exact: any other y_t near 0 shows the cancellation
    y[:, 3] = -rng.uniform(1e-12, 1e-11, 8)
    dy = np.zeros_like(x)
    dy[:, 3] = -1
    ref = long_double_log_softmax_grad(y, dy)
    err = np.abs(cunorm.log_softmax_backward(y, dy) - ref).max(-1) / np.abs(ref).max(-1)
    assert err.max() <= 1e-12
    plain = dy - np.exp(y) * dy.sum(-1, keepdims=True)  # the formula as written
    assert (np.abs(plain - ref).max(-1) / np.abs(ref).max(-1)).max() > 1e-6


# --- the planner --------------------------------------------------------------------------
def plan(cols: int, dtype: str = "float16", *, rows: int = 4096, align: int = 16, props=H200,
         force: str | None = None, op: str = "softmax_backward"):
    return g.plan_grad(op, dtype, rows, cols, align, props, fake_occ(props), force)


@pytest.mark.parametrize(("dtype", "warp_top"), [("float16", 1024), ("bfloat16", 1024),
                                                 ("float32", 512), ("float64", 256)])
def test_paths_by_row_length(dtype, warp_top):
    itemsize = _dispatch.ITEMSIZE[dtype]
    pack = 16 // itemsize
    assert plan(warp_top, dtype).path == "warp"
    assert plan(warp_top + pack, dtype).path == "block"
    block_top = 1024 * g.GRAD_BLOCK_MAX_PACKS * pack  # 64 KB of each operand a row
    assert block_top * itemsize == 64 * 1024
    assert plan(block_top, dtype).path == "block"
    # past a block: clusters on sm_90 (float64 is not measured), up to 8 x 1024 threads of
    # 4 packs (512 KB of each operand a row); read twice past them, and on sm_80
    # (test_cluster_rows_by_op: where each op takes them)
    clustered = dtype != "float64"
    assert plan(block_top + pack, dtype).path == ("cluster" if clustered else "uncached")
    assert plan(block_top + pack, dtype, props=A100).path == "uncached"
    cluster_top = 8 * block_top  # (softmax_backward's 16-bit rows stop at 2 packs a thread)
    log = "log_softmax_backward"
    assert plan(cluster_top, dtype, op=log).path == ("cluster" if clustered else "uncached")
    assert plan(cluster_top + pack, dtype, op=log).path == "uncached"


def args(kernel: str) -> tuple[str, ...]:
    """Template arguments of a ``softmax_grad`` name: (T, LOG, PACK, BOUND, GROUP, N, HOLD)."""
    return tuple(a.strip() for a in kernel.split("<", 1)[1].rstrip(">").split(","))


@pytest.mark.parametrize(("cols", "expect"), [
    # (pack, threads of the block, the kernel's bound on them, threads a row, packs a thread)
    (1, (1, 128, 128, 1, 1)), (8, (8, 128, 128, 1, 1)), (16, (8, 128, 128, 2, 1)),
    (24, (8, 128, 128, 4, 1)), (256, (8, 128, 128, 32, 1)), (264, (8, 128, 128, 32, 2)),
    (1024, (8, 128, 128, 32, 4)), (1032, (8, 128, 1024, 0, 2)), (2056, (8, 128, 1024, 0, 3)),
    (3000, (8, 128, 1024, 0, 3)), (4096, (8, 128, 1024, 0, 4)), (12288, (8, 384, 1024, 0, 4)),
    (16384, (8, 512, 1024, 0, 4)), (16392, (8, 544, 1024, 0, 4)),
    (32768, (8, 1024, 1024, 0, 4)), (32776, (8, 1024, 1024, 0, 2)),
])
def test_layout_of_float16_rows(cols, expect):
    p = plan(cols, props=A100 if cols > 32768 else H200)  # (sm_90 holds 32776 on clusters)
    pack, block, bound, group, packs = expect
    hold = "false" if p.path == "uncached" else "true"
    assert args(p.kernel) == ("cunorm::half_t", "false", str(pack), str(bound), str(group),
                              str(packs), hold)
    assert p.block == block and p.smem == 0
    assert args(plan(cols, op="log_softmax_backward").kernel)[1] == "true"


def test_cluster_rows():
    """Rows past a block (sm_90): the first layout of GRAD_CLUSTER_LAYOUTS (slices of at
    most 512 threads of 2 packs, then 1024 threads of 2, then of 4) on the smallest cluster
    that holds them; one wave of whole clusters (the driver's count where given), rows
    capping it."""
    def layout(cols, dtype="float16", **kw):  # (block, packs a thread, cluster)
        p = plan(cols, dtype, **kw)
        assert p.path == "cluster" and args(p.kernel)[3] == "1024", p
        return p.block, int(args(p.kernel)[4]), int(args(p.kernel)[5])

    assert plan(32776).kernel == "cunorm::softmax_grad_cluster<cunorm::half_t, false, 8, 1024, " \
        "2, 8>"
    assert layout(32776) == (288, 2, 8)  # 4097 packs: 4 x 513 threads is past 512
    assert layout(65536) == (512, 2, 8)
    assert layout(131072) == (1024, 2, 8)
    # 8 x 1024 threads of 2 packs do not hold 32768 packs: 4 (log_softmax_backward's choice)
    assert layout(262144, "bfloat16", op="log_softmax_backward") == (1024, 4, 8)
    assert layout(32768, "float32") == (512, 2, 8)
    assert layout(131072, "float32") == (1024, 4, 8)
    assert plan(262144, "float32").path == "uncached"
    # the grid: every resident cluster (the fake occupancy's, else the driver's), rows cap it
    p = plan(65536, rows=49152)
    per_sm = fake_occ(H200)(p.kernel, p.block, 0)
    assert p.grid == H200.sm_count * per_sm // 8 * 8
    assert plan(65536, rows=5).grid == 5 * 8
    p = g.plan_grad("softmax_backward", "float16", 49152, 65536, 16, H200, fake_occ(H200),
                    clusters=lambda kernel, cluster, block, smem: 29)
    assert p.grid == 29 * 8
    # a device that runs no such cluster: read twice, or an error where forced
    none = dict(clusters=lambda kernel, cluster, block, smem: 0)
    assert g.plan_grad("softmax_backward", "float16", 99, 65536, 16, H200, fake_occ(H200),
                       **none).path == "uncached"
    with pytest.raises(ValueError, match="runs no cluster of 8 x 512 threads"):
        g.plan_grad("softmax_backward", "float16", 99, 65536, 16, H200, fake_occ(H200),
                    "cluster", **none)
    # forced: float64 and rows a block holds take it too; packs narrower than 16 bytes do not
    assert layout(65536, "float64", force="cluster") == (1024, 4, 8)
    assert layout(4096, force="cluster") == (128, 2, 2)
    with pytest.raises(ValueError, match="do not fit the 'cluster' path"):
        plan(65536, align=4, force="cluster")
    with pytest.raises(ValueError, match="'cluster' needs sm_90 or newer; device is sm_80"):
        plan(65536, props=A100, force="cluster")


def test_cluster_rows_by_op():
    """Unforced: softmax_backward takes clusters past a block but on 16-bit rows of four
    packs a thread (GRAD_CLUSTER_MAX_PACKS); log_softmax_backward from GRAD_CLUSTER_FROM
    columns (its two reads cost less: the first takes dy alone). Forced, any layout."""
    log = "log_softmax_backward"
    assert g.GRAD_CLUSTER_FROM[log] == 131072
    for dtype in ("float16", "bfloat16"):
        assert plan(262144, dtype).path == "uncached"
        assert plan(262144, dtype, force="cluster").path == "cluster"
        assert plan(262144, dtype, op=log).path == "cluster"
        assert plan(131072, dtype, op=log).path == "cluster"
        assert plan(131064, dtype, op=log).path == "uncached"
        assert plan(65536, dtype, op=log).path == "uncached"
        assert plan(65536, dtype, op=log, force="cluster").path == "cluster"
    assert plan(131072, "float32").path == plan(131072, "float32", op=log).path == "cluster"
    assert plan(65536, "float32", op=log).path == "uncached"
    assert plan(32776, "float32").path == "cluster"
    # float64 is not measured on clusters: read twice past a block, unforced
    assert plan(8200, "float64").path == "uncached"
    assert plan(8200, "float64", force="cluster").path == "cluster"


def test_pack_follows_alignment_and_columns():
    assert args(plan(1024).kernel)[2:6] == ("8", "128", "32", "4")
    assert args(plan(1024, align=2).kernel)[2:6] == ("2", "1024", "0", "4")
    assert plan(1024, align=2).block == 128
    assert args(plan(1023).kernel)[2:6] == ("1", "1024", "0", "4")
    assert plan(1023).block == 256
    assert args(plan(1000, "float32", align=2).kernel)[2:6] == ("2", "1024", "0", "4")
    # scalar 16-bit rows leave the warp path past 32 lanes x 4 packs
    assert plan(128, align=1).path == "warp" and plan(129, align=1).path == "block"


def test_grid_is_capped_in_waves_of_resident_blocks():
    p = plan(4096, rows=10**7)
    per_sm = H200.max_threads_per_sm // p.block
    assert p.grid == H200.sm_count * per_sm * g.GRAD_WAVES
    assert plan(4096, rows=3).grid == 3
    assert plan(64, rows=100).grid == 7  # 8 lanes a row: 16 rows a block
    assert plan(64, rows=100, props=SMALL_80).grid == 7


@pytest.mark.parametrize("force", g.GRAD_PATHS)
@pytest.mark.parametrize("props", [H100, A100, SMALL_80, H200])
def test_forced_paths(force, props):
    for cols in (1, 100, 2048, 2049, 30000, 1 << 20):
        fits = g.grad_config(force, cols, _dispatch.max_pack(cols, 2, 16), 2) is not None
        if force == "cluster" and not props.has_clusters:
            with pytest.raises(ValueError, match="'cluster' needs sm_90"):
                plan(cols, props=props, force=force)
        elif fits:
            assert plan(cols, props=props, force=force).path == force
        else:
            with pytest.raises(ValueError, match=f"do not fit the '{force}' path"):
                plan(cols, props=props, force=force)
    assert plan(1 << 24, force="uncached").path == "uncached"


def test_plan_errors():
    with pytest.raises(ValueError, match="has no 'smem' path"):
        plan(100, force="smem")
    with pytest.raises(ValueError, match="unknown op 'softmax'"):
        plan(100, op="softmax")
    with pytest.raises(ValueError, match="no softmax_backward kernel for int8"):
        plan(100, "int8")
    with pytest.raises(ValueError, match="nothing to plan"):
        plan(0)


def test_every_planned_kernel_is_listed():
    """precompile and the nvcc test compile :func:`all_grad_kernel_names`: every plan, forced
    or not, on every alignment, names one of them, and the names reach
    :func:`cunorm._dispatch.all_kernel_names` with grad.cu as their source."""
    names = g.all_grad_kernel_names()
    listed = set(names)
    assert len(names) == len(listed)
    assert set(g.all_grad_kernel_names(80)) == {n for n in listed if "cluster" not in n}
    planned = set()
    for dtype in _dispatch.ITEMSIZE:
        for op in g.GRAD_OPS:
            for align in (1, 2, 4, 8, 16):
                # (131072 and 262144: the cluster layouts of 1024 threads of 2 and 4 packs)
                for cols in [*range(1, 300), *range(300, 70000, 97), 131072, 262144, 1 << 20]:
                    for force in (None, *g.GRAD_PATHS):
                        try:
                            p = plan(cols, dtype, align=align, force=force, op=op)
                        except ValueError:
                            continue
                        planned.add(p.kernel)
    assert planned <= listed
    everything = set(_dispatch.all_kernel_names(90))
    assert listed <= everything
    assert set(g.all_grad_kernel_names(80)) <= set(_dispatch.all_kernel_names(80))
    assert {_dispatch.kernel_file(n) for n in listed} == {"grad.cu"}
