"""layer_norm_backward / rms_norm_backward on the CPU: the NumPy path against finite
differences of the forward, every bad input with its message, and the pure planner
(:func:`cunorm._grad_dispatch.plan_norm_grad`) on fake devices."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_dispatch import A100, H100, H200, SMALL_80, fake_occ

import cunorm
from cunorm import _dispatch
from cunorm import _grad_dispatch as g

OPS = ("layer_norm_backward", "rms_norm_backward")


def forward_and_backward(op, x, w, b, dy, axis):
    """(loss function of (x, w, b), the op's gradients) for sum(forward(x) * dy)."""
    if op == "layer_norm_backward":
        def loss(x, w, b):
            return float((cunorm.layer_norm(x, w, b, axis=axis) * dy).sum())
        _, mean, rstd = cunorm.layer_norm(x, w, b, axis=axis, return_stats=True)
        return loss, cunorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)

    def loss(x, w, b):
        return float((cunorm.rms_norm(x, w, axis=axis) * dy).sum())
    _, rstd = cunorm.rms_norm(x, w, axis=axis, return_stats=True)
    return loss, cunorm.rms_norm_backward(dy, x, rstd, w, axis=axis)


def finite_difference(f, a: np.ndarray, h: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[i] += h
        down[i] -= h
        out[i] = (f(up) - f(down)) / (2 * h)
    return out


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("shape", "axis"), [((4, 6), -1), ((3, 1), -1), ((2, 3, 4), (1, 2)),
                                             ((5, 3), 0), ((2, 3, 4), (0, 2))])
@pytest.mark.parametrize("with_weight", [True, False])
def test_numpy_path_matches_finite_differences(op, shape, axis, with_weight):
    rng = np.random.default_rng(len(shape) * 7 + with_weight)
    x = rng.standard_normal(shape) * 2 + 1
    dy = rng.standard_normal(shape)
    axes = tuple(np.atleast_1d(axis) % len(shape))
    wshape = tuple(shape[a] for a in sorted(axes))
    w = rng.standard_normal(wshape) if with_weight else None
    b = rng.standard_normal(wshape)
    loss, grads = forward_and_backward(op, x, w, b, dy, axis)
    dx = grads[0]
    assert dx.shape == shape and dx.dtype == np.float64
    np.testing.assert_allclose(dx, finite_difference(lambda a: loss(a, w, b), x), atol=1e-7)
    weight = w if with_weight else np.ones(wshape)
    fd_w = finite_difference(lambda a: loss(x, a, b), weight)
    np.testing.assert_allclose(grads[1], fd_w, atol=1e-7)  # (with or without a weight)
    if op == "layer_norm_backward":
        np.testing.assert_allclose(grads[2], finite_difference(lambda a: loss(x, w, a), b),
                                   atol=1e-7)
    else:
        assert len(grads) == 2


@pytest.mark.parametrize("op", OPS)
def test_numpy_dtypes_and_empty(op):
    for dtype in (np.float16, np.float32):
        x = np.linspace(-1, 1, 12, dtype=dtype).reshape(3, 4)
        loss, grads = forward_and_backward(op, x, None, None, x, -1)
        assert all(a.dtype == dtype for a in grads)
    x = np.zeros((0, 5), np.float32)
    stats = np.zeros(0, np.float32)
    grads = (cunorm.layer_norm_backward(x, x, stats, stats) if op == "layer_norm_backward"
             else cunorm.rms_norm_backward(x, x, stats))
    assert grads[0].shape == (0, 5)
    assert all(a.shape == (5,) and not a.any() for a in grads[1:])


def test_bad_inputs():
    x = np.zeros((3, 4), np.float32)
    s = np.zeros(3, np.float32)
    lnb, rnb = cunorm.layer_norm_backward, cunorm.rms_norm_backward
    with pytest.raises(TypeError, match=r"layer_norm_backward\(\): dy has dtype float64; "
                                        r"expected float32 \(the dtype of x\)"):
        lnb(x.astype(np.float64), x, s, s)
    with pytest.raises(ValueError, match=r"dy has shape \(3, 5\); expected \(3, 4\)"):
        lnb(np.zeros((3, 5), np.float32), x, s, s)
    with pytest.raises(ValueError, match=r"mean has shape \(4,\); expected \(3,\) \(x's shape "
                                         r"without the normalized axes\)"):
        lnb(x, x, np.zeros(4, np.float32), s)
    with pytest.raises(TypeError, match=r"rstd has dtype float64; expected float32 \(the "
                                        r"statistics' dtype for float32 x\)"):
        rnb(x, x, s.astype(np.float64))
    with pytest.raises(TypeError, match=r"rstd has dtype float32; expected float64"):
        rnb(x.astype(np.float64), x.astype(np.float64), s)
    with pytest.raises(TypeError, match=r"layer_norm_backward\(\): mean is None; pass the "
                                        r"forward's statistics \(return_stats=True\)"):
        lnb(x, x, None, s)
    with pytest.raises(TypeError, match=r"rms_norm_backward\(\): rstd is None"):
        rnb(x, x, None)
    with pytest.raises(ValueError, match=r"weight has shape \(3,\); expected \(4,\)"):
        rnb(x, x, s, np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"weight has dtype float16; expected float32"):
        rnb(x, x, s, np.ones(4, np.float16))
    with pytest.raises(TypeError, match="x has dtype int32"):
        rnb(x.astype(np.int32), x.astype(np.int32), s)
    with pytest.raises(TypeError, match=r"rms_norm_backward\(\): x must be a numpy.ndarray"):
        rnb(x, [[0.0] * 4] * 3, s)
    with pytest.raises(ValueError, match=r"rms_norm_backward\(\): axis 2 is out of range"):
        rnb(x, x, s, axis=2)


# --- the planner --------------------------------------------------------------------------
def plan(cols: int, dtype: str = "float16", *, rows: int = 49152, align: int = 16,
         props=H200, force: str | None = None, op: str = "layer_norm_backward"):
    return g.plan_norm_grad(op, dtype, rows, cols, align, props, fake_occ(props), force)


def args(kernel: str) -> tuple[str, ...]:
    """Template arguments of a ``norm_grad_rows`` name: (T, RMS, PACK, BOUND, GROUP, N,
    HOLD)."""
    return tuple(a.strip() for a in kernel.split("<", 1)[1].rstrip(">").split(","))


@pytest.mark.parametrize(("dtype", "pack"), [("float16", 8), ("bfloat16", 8), ("float32", 4),
                                             ("float64", 2)])
def test_paths_by_row_length(dtype, pack):
    # 16-bit: one pack a thread up to 128 packs (32 lanes x 1 pack on the warp path); others
    # two (32 lanes x 2 packs)
    warp_top = 32 * (1 if pack == 8 else g.NORM_GRAD_PACKS) * pack
    assert plan(warp_top, dtype).rows.path == "warp"
    assert plan(warp_top + pack, dtype).rows.path == "block"
    for op in g.NORM_GRAD_OPS:
        top = g.NORM_GRAD_BLOCK * g.NORM_GRAD_BLOCK_MAX_PACKS[op] * pack
        if dtype == "float32":  # 1024 threads of two packs (float arithmetic)
            top = max(top, g.NORM_GRAD_BLOCK_MAX_THREADS * g.NORM_GRAD_FLOAT_BLOCK_PACKS * pack)
        assert plan(top, dtype, op=op).rows.path == "block"
        # past a block: a cluster (sm_90) for the dtypes measured faster there
        on_cluster = dtype in g.NORM_GRAD_CLUSTER_DTYPES[op]
        assert plan(top + pack, dtype, op=op).rows.path == ("cluster" if on_cluster
                                                            else "uncached")
        assert plan(top + pack, dtype, op=op, props=A100).rows.path == "uncached"
    # misaligned (scalar) rows: one element a thread, 1024 threads at most
    assert plan(1024, dtype, align=1).rows.path == "block"
    assert plan(1025, dtype, align=1).rows.path == "uncached"


@pytest.mark.parametrize(("cols", "expect"), [
    # (block threads, bound, threads a row, packs a thread, dynamic shared memory)
    (8, (512, 512, 1, 1, 512 * 8 * 4)), (32, (512, 512, 4, 1, 128 * 32 * 4)),
    (256, (512, 512, 32, 1, 16 * 256 * 4)), (264, (512, 512, 64, 1, 8 * 264 * 4)),
    (1000, (512, 512, 128, 1, 4 * 1000 * 4)), (1024, (512, 512, 128, 1, 4 * 1024 * 4)),
    # past 128 packs: two a thread
    (1032, (512, 512, 128, 2, 4 * 1032 * 4)), (4096, (512, 512, 256, 2, 2 * 4096 * 4)),
    (4104, (288, 512, 0, 2, 0)), (8192, (512, 512, 0, 2, 0)), (12288, (512, 512, 0, 3, 0)),
])
def test_layout_of_float16_rows(cols, expect):
    p = plan(cols)
    block, bound, group, packs, smem = expect
    assert args(p.rows.kernel) == ("cunorm::half_t", "false", "8", str(bound), str(group),
                                   str(packs), "true", "true")
    assert (p.rows.block, p.rows.smem) == (block, smem)
    assert p.hold and p.direct is None and p.partial_rows == p.rows.grid
    assert p.final == ("cunorm::norm_grad_cols<cunorm::half_t, false, false>",
                       (-(-cols // 32), 1))
    assert args(plan(cols, op="rms_norm_backward").rows.kernel)[1] == "true"
    # rms_norm keeps no bias sums: 16384 columns on 512 threads of 4 packs
    assert args(plan(16384, op="rms_norm_backward").rows.kernel)[3:] == ("512", "0", "4",
                                                                          "true", "true")
    assert plan(16384).rows.path == "cluster"


@pytest.mark.parametrize("force", [None, "warp", "block", "uncached"])  # cluster: below
def test_float32_rows_work_in_double_below_the_wide_limit(force):
    """WIDE (the last template argument) for float32 rows of fewer than NORM_GRAD_WIDE_BELOW
    columns on every path, not from there on; always for the other dtypes (whose arithmetic
    type does not depend on it, so no kernel is built twice)."""
    edge = g.NORM_GRAD_WIDE_BELOW
    for cols, wide in ((3, "true"), (edge - 4, "true"), (edge, "false"), (edge + 4, "false")):
        assert args(plan(cols, "float32", force=force).rows.kernel)[-1] == wide, cols
    for dtype in ("float16", "bfloat16", "float64"):
        for cols in (8, edge, edge + 8):
            assert args(plan(cols, dtype, force=force).rows.kernel)[-1] == "true"


def test_float32_blocks_of_1024_threads_take_two_packs():
    """float32 rows worked in float: whole-block rows of 2 packs a thread on kernels bound to
    1024 threads (64 registers) past 512 threads, up to 8192 columns for either op."""
    for op in g.NORM_GRAD_OPS:
        for cols, block, bound in ((2052, 288, 512), (4096, 512, 512), (4100, 544, 1024),
                                   (8192, 1024, 1024)):
            p = plan(cols, "float32", op=op)
            assert args(p.rows.kernel)[3:] == (str(bound), "0", "2", "true", "false"), (op, cols)
            assert (p.rows.path, p.rows.block) == ("block", block)
    # WIDE rows and 16-bit rows keep one pack a thread on 1024-thread blocks
    assert args(plan(4104, "float16").rows.kernel)[3:6] == ("512", "0", "2")


def test_prefetch_where_an_sm_has_little_in_flight():
    """The row kernel asks for each next row on the cluster path, and on the block path where
    an SM holds one row or fewer than NORM_GRAD_PREFETCH_BELOW bytes of x and dy; never on the
    warp and uncached paths."""
    def prefetch(cols, dtype, per_sm, *, op="layer_norm_backward", rows=49152, force=None):
        return g.plan_norm_grad(op, dtype, rows, cols, 16, H200,
                                lambda kernel, block, smem: per_sm, force).prefetch

    # float32, 2 blocks of one row an SM: 3000 columns hold 47 KB, 4096 64 KB
    assert prefetch(3000, "float32", 2) and not prefetch(4096, "float32", 2)
    assert g.NORM_GRAD_PREFETCH_BELOW == 48 * 1024
    # one row an SM, whatever it holds; a grid of one block an SM holds one row too
    assert prefetch(8192, "float32", 1) and prefetch(4096, "float32", 2, rows=132)
    # 16-bit rows of 2048 columns: 4 rows a 512-thread block (32 KB a block)
    assert prefetch(2048, "float16", 1)
    assert not prefetch(2048, "float16", 2, op="rms_norm_backward")
    # the warp path (lane groups of a warp) and the uncached path never; clusters always
    assert not prefetch(256, "float16", 1) and plan(256).rows.path == "warp"
    assert not prefetch(3000, "float32", 1, force="uncached")
    assert prefetch(32768, "float16", 4, op="rms_norm_backward")
    assert plan(32768, op="rms_norm_backward").rows.path == "cluster"


def test_cluster_rows():
    """Rows past a block (sm_90): slices of at most 512 threads on the smallest cluster that
    holds them, else of 1024; the grid is one wave of whole clusters (the driver's count where
    given), each writing one partial row; WIDE as on the other paths."""
    p = plan(32768, op="rms_norm_backward")  # 4096 packs: 8 blocks of 512 threads, 1 pack
    assert p.rows.kernel == ("cunorm::norm_grad_rows_cluster<cunorm::half_t, true, 8, 512, 1, "
                             "true, 8>")
    assert (p.rows.path, p.rows.block, p.hold, p.direct) == ("cluster", 512, True, None)
    per_sm = fake_occ(H200)(p.rows.kernel, 512, 0)
    assert p.rows.grid == H200.sm_count * per_sm // 8 * 8 and p.partial_rows == p.rows.grid // 8
    # 8192 packs: no cluster of 8 x 512 threads holds them, 8 x 1024 do
    assert args(plan(65536).rows.kernel)[3:] == ("1024", "1", "true", "8")
    # float32: two packs a thread, in float; 12288 columns on 4 x 384 threads
    for op in g.NORM_GRAD_OPS:
        p = plan(12288, "float32", op=op)
        assert args(p.rows.kernel)[3:] == ("512", "2", "false", "4") and p.rows.block == 384
    # the driver's count of resident clusters sizes the grid, and rows cap it
    p = g.plan_norm_grad("rms_norm_backward", "float16", 49152, 32768, 16, H200, fake_occ(H200),
                         clusters=lambda kernel, cluster, block, smem: 29)
    assert (p.rows.grid, p.partial_rows) == (29 * 8, 29)
    assert plan(32768, rows=5, op="rms_norm_backward").rows.grid == 5 * 8
    # a device that runs no such cluster: read twice, or an error where forced
    none = dict(clusters=lambda kernel, cluster, block, smem: 0)
    assert g.plan_norm_grad("rms_norm_backward", "float16", 99, 32768, 16, H200,
                            fake_occ(H200), **none).rows.path == "uncached"
    with pytest.raises(ValueError, match="runs no cluster of 8 x 512 threads"):
        g.plan_norm_grad("rms_norm_backward", "float16", 99, 32768, 16, H200, fake_occ(H200),
                         "cluster", **none)
    # forced onto short float32 rows, which keep double below NORM_GRAD_WIDE_BELOW
    edge = g.NORM_GRAD_WIDE_BELOW
    assert args(plan(edge - 4, "float32", force="cluster").rows.kernel)[-2] == "true"
    assert args(plan(edge, "float32", force="cluster").rows.kernel)[-2] == "false"
    # packs narrower than 16 bytes do not take clusters
    with pytest.raises(ValueError, match="do not fit the 'cluster' path"):
        plan(32768, align=4, force="cluster")


def test_shared_memory_stays_under_48_kb():
    """The row groups' staged column sums need no opt-in: at most 48 KB a block, on every
    path of either op."""
    for dtype in _dispatch.ITEMSIZE:
        for op in g.NORM_GRAD_OPS:
            for force in (None, *g.NORM_GRAD_PATHS):
                for cols in range(1, 20000, 7):
                    for align in (1, 16):
                        try:
                            p = plan(cols, dtype, align=align, op=op, force=force)
                        except ValueError:
                            continue
                        assert p.rows.smem <= 48 * 1024, (dtype, cols, p.rows)


def test_holding_grids_are_one_wave_and_long_rows_go_direct():
    p = plan(4096, rows=10**6)
    assert p.rows.grid == H200.sm_count * (H200.max_threads_per_sm // 512)  # one wave
    assert plan(8192, rows=3).rows.grid == 3 == plan(8192, rows=3).partial_rows
    assert plan(32, rows=300).rows.grid == 3  # 128 rows a block
    u = plan(65536, rows=3000, props=A100)
    assert u.rows.path == "uncached" and not u.hold
    name, grid, chunk = u.direct
    assert name == "cunorm::norm_grad_cols<cunorm::half_t, false, true>"
    assert grid == (2048, u.partial_rows) and chunk * u.partial_rows >= 3000
    assert u.final[1] == (2048, 1)
    narrow = plan(16400, "float64", rows=100000)  # few column blocks: rows split in chunks
    assert narrow.direct[1][0] * narrow.direct[1][1] >= H200.sm_count


@pytest.mark.parametrize("force", g.NORM_GRAD_PATHS)
@pytest.mark.parametrize("props", [H100, A100, SMALL_80, H200])
def test_forced_paths(force, props):
    for cols in (1, 100, 256, 264, 2048, 2056, 8192, 8200, 1 << 20):
        fits = g.norm_grad_config(force, "layer_norm_backward", cols,
                                    _dispatch.max_pack(cols, 2, 16), 2) is not None
        if force == "cluster" and not props.has_clusters:
            with pytest.raises(ValueError, match="'cluster' needs sm_90 or newer"):
                plan(cols, props=props, force=force)
        elif fits:
            assert plan(cols, props=props, force=force).rows.path == force
        else:
            with pytest.raises(ValueError, match=f"do not fit the '{force}' path"):
                plan(cols, props=props, force=force)


def test_plan_errors():
    with pytest.raises(ValueError, match="has no 'smem' path"):
        plan(100, force="smem")
    with pytest.raises(ValueError, match="unknown op 'layer_norm'"):
        plan(100, op="layer_norm")
    with pytest.raises(ValueError, match="no layer_norm_backward kernel for int8"):
        plan(100, "int8")
    with pytest.raises(ValueError, match="nothing to plan"):
        plan(0)


def test_every_planned_kernel_is_listed():
    """Every plan, forced or not, on every alignment, names kernels of
    :func:`all_norm_grad_kernel_names`, which reach :func:`cunorm._dispatch.all_kernel_names`
    with grad.cu as their source."""
    listed = set(g.all_norm_grad_kernel_names())
    planned = set()
    for dtype in _dispatch.ITEMSIZE:
        for op in g.NORM_GRAD_OPS:
            for align in (1, 2, 4, 8, 16):
                for cols in [*range(1, 300), *range(300, 40000, 97), 1 << 20]:
                    for force in (None, *g.NORM_GRAD_PATHS):
                        try:
                            p = plan(cols, dtype, align=align, force=force, op=op)
                        except ValueError:
                            continue
                        planned.update((p.rows.kernel, p.final[0]))
                        if p.direct:
                            planned.add(p.direct[0])
    assert planned <= listed
    everything = set(_dispatch.all_kernel_names(90))
    assert listed <= everything
    assert {_dispatch.kernel_file(n) for n in listed} == {"grad.cu"}
