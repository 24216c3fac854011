"""``cunorm.layer_norm`` / ``cunorm.rms_norm`` on NumPy inputs (the reference path, no GPU).

Values are checked against float64 formulas written here, independently of the library: the
mean and the sum of squared deviations are exact-rounded sums (``math.fsum``) per slice and
the result is ``(x - mean) / sqrt(var + eps) * w + b`` (``x / sqrt(mean(x**2) + eps) * w``),
so each output must be within one rounding to x's dtype of the formula. Then every form of
bad input (DESIGN section 4): the exception type, a message naming the function and the
argument, and a preallocated ``out`` left untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from _fakes import TorchTensorStub

import cunorm

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
DTYPE_IDS = [dt.name for dt in DTYPES]
#: DESIGN section 3: relative max-norm error per slice against float64
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-12}
#: unit roundoff: the NumPy path computes in float64 and rounds once to the output dtype
UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-52}
TINY = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 0.0}
OPS = ("layer_norm", "rms_norm")
EXPECTED_DTYPES = "float16, bfloat16, float32 or float64"
SENTINEL = -12345.0


# --- helpers --------------------------------------------------------------------------------
def _axes(axis, ndim: int) -> tuple[int, ...]:
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(a % ndim for a in axes))


def norm_shape(shape: tuple[int, ...], axis) -> tuple[int, ...]:
    """x's shape restricted to the (sorted) reduced axes: the shape of weight and bias."""
    return tuple(shape[a] for a in _axes(axis, len(shape)))


def stats_shape(shape: tuple[int, ...], axis) -> tuple[int, ...]:
    axes = _axes(axis, len(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def call(op: str, x, weight=None, bias=None, **kwargs):
    """``cunorm.<op>(x, weight[, bias], **kwargs)`` (rms_norm has no bias)."""
    if op == "rms_norm":
        assert bias is None
        return cunorm.rms_norm(x, weight, **kwargs)
    return cunorm.layer_norm(x, weight, bias, **kwargs)


def reference(op: str, x: np.ndarray, axis=-1, weight=None, bias=None, eps=None,
              residual=None) -> dict[str, np.ndarray | None]:
    """float64 y, h (x + residual rounded to x's dtype), mean and rstd of ``op``.

    Per slice: ``mean = fsum(v) / n``, ``var = fsum((v - mean)**2) / n`` (rms_norm:
    ``fsum(v**2) / n``), ``y = (v - mean) / sqrt(var + eps) * w + b``. y, mean, rstd have
    the shapes of x and of x without the reduced axes."""
    if eps is None:
        eps = 1e-5 if op == "layer_norm" else 1e-6
    h = None
    if residual is not None:
        h = (np.asarray(x, np.float64) + np.asarray(residual, np.float64)).astype(x.dtype)
    v = np.asarray(x if h is None else h, np.float64)
    axes = _axes(axis, v.ndim)
    keep = [i for i in range(v.ndim) if i not in axes]
    perm = keep + list(axes)
    k = math.prod(v.shape[a] for a in axes)
    rows = np.transpose(v, perm).reshape(-1, k)
    w = np.ones(k) if weight is None else np.asarray(weight, np.float64).reshape(k)
    b = np.zeros(k) if bias is None else np.asarray(bias, np.float64).reshape(k)
    y = np.empty_like(rows)
    mean = np.empty(rows.shape[0])
    rstd = np.empty(rows.shape[0])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for i, row in enumerate(rows):
            if op == "layer_norm":
                m = math.fsum(row) / k if k else math.nan
                var = math.fsum((row - m) ** 2) / k if k else math.nan
            else:
                m = 0.0
                var = math.fsum(row**2) / k if k else math.nan
            mean[i] = m
            rstd[i] = 1.0 / math.sqrt(var + eps) if not math.isnan(var) else math.nan
            y[i] = (row - m) / np.sqrt(var + eps) * w + b
    y = np.transpose(y.reshape([v.shape[i] for i in perm]), np.argsort(perm))
    sshape = tuple(v.shape[i] for i in keep)
    return {"y": y, "h": h, "mean": mean.reshape(sshape), "rstd": rstd.reshape(sshape)}


def assert_close_slices(y: np.ndarray, ref: np.ndarray, axis, dtype_name: str,
                        slop: float = 1e-13) -> None:
    """DESIGN's bound (relative max-norm per slice, over the slice's max |ref|) and the
    one-rounding bound: each element within one unit roundoff of the float64 value (plus the
    subnormal spacing, plus ``slop`` times the slice's scale for float64's own error)."""
    y64 = np.asarray(y, dtype=np.float64)
    assert y64.shape == ref.shape
    axes = _axes(axis, y64.ndim)
    assert np.array_equal(np.isnan(y64), np.isnan(ref)), "NaN pattern differs"
    finite = np.isfinite(ref)
    assert np.array_equal(y64[~finite], ref[~finite], equal_nan=True), "non-finite values differ"
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(y64 - ref), 0.0)
    scale = np.max(np.where(finite, np.abs(ref), 0.0), axis=axes, keepdims=True)
    rel = np.max(err, axis=axes, keepdims=True) / np.where(scale > 0, scale, 1.0)
    assert rel.max(initial=0.0) <= TOL[dtype_name], f"slice error {rel.max()} > {TOL[dtype_name]}"
    bound = 1.01 * UNIT[dtype_name] * np.abs(ref) + TINY[dtype_name] + slop * scale
    worst = np.max(err - bound, initial=-1.0)
    assert worst <= 0, f"an element is off by more than one rounding ({worst:.3g} over)"


def assert_stats_close(got: np.ndarray, ref: np.ndarray, x_dtype: np.dtype, scale: float) -> None:
    """Statistics: float64 values rounded once to the stats dtype (float32, float64 for
    float64 x), plus float64's own error relative to the data's scale."""
    want = np.dtype(np.float64) if x_dtype == np.float64 else np.dtype(np.float32)
    assert type(got) is np.ndarray and got.dtype == want and got.shape == ref.shape
    unit = 2.0**-52 if want == np.float64 else 2.0**-24
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1.01 * unit, atol=1e-13 * scale)


def random_input(rng: np.random.Generator, shape, dtype, scale: float = 3.0,
                 loc: float = 0.0) -> np.ndarray:
    return (loc + scale * rng.standard_normal(shape)).astype(dtype)


# --- values against the formulas -----------------------------------------------------------
AXES_CASES = [((5, 37), -1), ((5, 37), 1), ((5, 37), 0), ((5, 37), -2), ((37,), 0),
              ((4, 6, 9), -1), ((4, 6, 9), 0), ((4, 6, 9), 1), ((4, 6, 9), (1, 2)),
              ((4, 6, 9), (-2, -1)), ((4, 6, 9), (0, 1)), ((4, 6, 9), (0, 2)),
              ((4, 6, 9), (2, 0)), ((4, 6, 9), (0, 1, 2)), ((3, 4, 5, 6), (1, 3)),
              ((3, 4, 5, 6), (0, 2, 3)), ((3, 4, 5, 6), (-3, -2))]
#: (op, which affine parameters are given): rms_norm has no bias
OP_AFFINE = [("layer_norm", "none"), ("layer_norm", "weight"), ("layer_norm", "bias"),
             ("layer_norm", "weight+bias"), ("rms_norm", "none"), ("rms_norm", "weight")]


@pytest.mark.parametrize(("op", "affine"), OP_AFFINE, ids="-".join)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("shape", "axis"), AXES_CASES, ids=str)
def test_matches_float64_formula(rng, op: str, affine: str, dtype: np.dtype, shape,
                                 axis) -> None:
    x = random_input(rng, shape, dtype, loc=0.5)
    wshape = norm_shape(shape, axis)
    w = random_input(rng, wshape, dtype, scale=1.0, loc=1.0) if "weight" in affine else None
    b = random_input(rng, wshape, dtype, scale=1.0) if "bias" in affine else None
    x_before = x.copy()
    y = call(op, x, w, b, axis=axis)
    assert type(y) is np.ndarray and y.dtype == dtype and y.shape == x.shape
    assert not np.shares_memory(y, x)
    assert np.array_equal(x.view(np.uint8), x_before.view(np.uint8))  # input untouched
    assert_close_slices(y, reference(op, x, axis, w, b)["y"], axis, dtype.name)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("shape", "axis"), AXES_CASES, ids=str)
def test_return_stats(rng, op: str, dtype: np.dtype, shape, axis) -> None:
    x = random_input(rng, shape, dtype, loc=1.0)
    w = random_input(rng, norm_shape(shape, axis), dtype, scale=1.0)
    res = call(op, x, w, axis=axis, return_stats=True)
    ref = reference(op, x, axis, w)
    scale = float(np.abs(x.astype(np.float64)).max())
    assert isinstance(res, tuple) and len(res) == (3 if op == "layer_norm" else 2)
    y, *stats = res
    assert y.dtype == dtype and y.shape == shape
    assert_close_slices(y, ref["y"], axis, dtype.name)
    assert np.array_equal(y.view(np.uint8), call(op, x, w, axis=axis).view(np.uint8))
    if op == "layer_norm":
        mean, rstd = stats
        assert mean.shape == stats_shape(shape, axis)
        assert_stats_close(mean, ref["mean"], dtype, scale)
    else:
        (rstd,) = stats
    assert rstd.shape == stats_shape(shape, axis)
    assert_stats_close(rstd, ref["rstd"], dtype, 1.0)
    assert np.all(rstd > 0)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("flag", [True, False, np.True_, np.False_], ids=repr)
def test_return_stats_accepts_numpy_bool(op: str, flag) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    res = call(op, x, return_stats=flag)
    assert isinstance(res, tuple) if flag else isinstance(res, np.ndarray)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(1,), (2,), (1, 1), (3, 1), (1, 200), (2, 3, 4, 5)], ids=str)
def test_default_axis_is_last(rng, op: str, dtype: np.dtype, shape) -> None:
    x = random_input(rng, shape, dtype)
    y = call(op, x)
    assert_close_slices(y, reference(op, x, -1)["y"], -1, dtype.name)
    assert np.array_equal(y, call(op, x, axis=len(shape) - 1), equal_nan=True)


def test_known_values() -> None:
    x = np.array([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]])
    y = cunorm.layer_norm(x, eps=0.0)
    np.testing.assert_allclose(y[0], [-math.sqrt(1.5), 0.0, math.sqrt(1.5)], rtol=1e-15)
    y = cunorm.layer_norm(x)  # a constant slice is 0 (then the bias) when eps > 0
    assert np.array_equal(y[1], [0.0, 0.0, 0.0])
    b = np.array([1.0, -2.0, 0.5])
    assert np.array_equal(cunorm.layer_norm(x, None, b)[1], b)
    np.testing.assert_allclose(cunorm.rms_norm(np.array([3.0, 4.0]), eps=0.0),
                               [3 / math.sqrt(12.5), 4 / math.sqrt(12.5)], rtol=1e-15)
    np.testing.assert_allclose(cunorm.rms_norm(np.array([3.0, 4.0]), np.array([2.0, -1.0]),
                                               eps=0.0),
                               [6 / math.sqrt(12.5), -4 / math.sqrt(12.5)], rtol=1e-15)
    assert np.array_equal(cunorm.rms_norm(np.zeros((2, 3))), np.zeros((2, 3)))


@pytest.mark.parametrize("op", OPS)
def test_defaults(rng, op: str) -> None:
    """eps defaults to 1e-5 (layer_norm) and 1e-6 (rms_norm), axis to -1."""
    x = random_input(rng, (4, 3, 8), np.float64, scale=1e-3)  # var ~ 1e-6: eps matters
    default = 1e-5 if op == "layer_norm" else 1e-6
    y = call(op, x)
    assert np.array_equal(y, call(op, x, axis=-1, eps=default))
    assert not np.allclose(y, call(op, x, eps=0.0), rtol=1e-3)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("eps", [0, 0.0, 1e-12, 0.25, 1.0, 3, np.float32(0.5), np.float64(2.0),
                                 np.int64(1), 1e6], ids=repr)
def test_eps_is_respected(rng, op: str, dtype: np.dtype, eps) -> None:
    x = random_input(rng, (6, 40), dtype, scale=1.0, loc=0.5)
    y = call(op, x, eps=eps)
    assert_close_slices(y, reference(op, x, -1, eps=float(eps))["y"], -1, dtype.name)


@pytest.mark.parametrize("op", OPS)
def test_eps_closed_form(op: str) -> None:
    """Slices (a, -a): var = mean(x**2) = a**2, so y = +-a / sqrt(a**2 + eps)."""
    x = np.array([[0.5, -0.5], [3.0, -3.0]], np.float32)
    res = call(op, x, eps=0.75, return_stats=True)
    y, rstd = res[0], res[-1]
    np.testing.assert_array_equal(y[0], [0.5, -0.5])  # 0.5 / sqrt(0.25 + 0.75)
    np.testing.assert_allclose(y[1], [3 / math.sqrt(9.75), -3 / math.sqrt(9.75)], rtol=1e-7)
    np.testing.assert_allclose(rstd, [1.0, 1 / math.sqrt(9.75)], rtol=1e-7)


# --- residual --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("shape", "axis"), [((5, 37), -1), ((4, 6, 9), (0, 2)),
                                             ((4, 6, 9), 1), ((3, 4, 5, 6), (1, 3))], ids=str)
@pytest.mark.parametrize("stats", [False, True], ids=["y_h", "with_stats"])
def test_residual(rng, op: str, dtype: np.dtype, shape, axis, stats: bool) -> None:
    x = random_input(rng, shape, dtype)
    r = random_input(rng, shape, dtype, scale=2.0)
    wshape = norm_shape(shape, axis)
    w = random_input(rng, wshape, dtype, scale=1.0, loc=1.0)
    b = random_input(rng, wshape, dtype, scale=1.0) if op == "layer_norm" else None
    x_before, r_before = x.copy(), r.copy()
    res = call(op, x, w, b, axis=axis, residual=r, return_stats=stats)
    ref = reference(op, x, axis, w, b, residual=r)
    n = 2 + (0 if not stats else 2 if op == "layer_norm" else 1)
    assert isinstance(res, tuple) and len(res) == n
    y, h = res[:2]
    # h = x + r rounded once to x's dtype (exactly, bit for bit)
    assert type(h) is np.ndarray and h.dtype == dtype and h.shape == shape
    assert np.array_equal(h.view(np.uint8), ref["h"].view(np.uint8))
    assert not np.shares_memory(h, x) and not np.shares_memory(h, r)
    # y = norm(h), not norm(x + r) in float64
    assert_close_slices(y, ref["y"], axis, dtype.name)
    assert np.array_equal(y, call(op, h, w, b, axis=axis), equal_nan=True)
    if stats:
        scale = float(np.abs(ref["h"].astype(np.float64)).max())
        if op == "layer_norm":
            assert_stats_close(res[2], ref["mean"], dtype, scale)
        assert_stats_close(res[-1], ref["rstd"], dtype, 1.0)
    assert np.array_equal(x.view(np.uint8), x_before.view(np.uint8))
    assert np.array_equal(r.view(np.uint8), r_before.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
def test_residual_is_rounded_before_normalizing(dtype: np.dtype) -> None:
    """x + r is not representable in 16 bits: h is the rounded sum and y normalizes h."""
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype)
    r = np.array([[2.0**-9, 0.0, 2.0**-8, 0.0]], dtype)  # below half an ulp of x for bf16
    y, h = cunorm.layer_norm(x, residual=r)
    exact = x.astype(np.float64) + r.astype(np.float64)
    assert np.array_equal(h, exact.astype(dtype))
    assert np.array_equal(y, cunorm.layer_norm(h))


@pytest.mark.parametrize("op", OPS)
def test_residual_order_of_results(rng, op: str) -> None:
    x = random_input(rng, (3, 16), np.float32)
    r = random_input(rng, (3, 16), np.float32)
    y, h, *stats = call(op, x, residual=r, return_stats=True)
    assert [s.shape for s in stats] == [(3,)] * (2 if op == "layer_norm" else 1)
    assert h.shape == (3, 16) and y.shape == (3, 16)
    y2, *stats2 = call(op, h, return_stats=True)
    assert np.array_equal(y, y2)
    for s, s2 in zip(stats, stats2, strict=True):
        assert np.array_equal(s, s2)


# --- out= ------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("axis", [-1, 0, (0, 2)], ids=str)
def test_out(rng, op: str, dtype: np.dtype, axis) -> None:
    x = random_input(rng, (3, 9, 4), dtype)
    w = random_input(rng, norm_shape(x.shape, axis), dtype)
    expected = call(op, x, w, axis=axis)
    out = np.full(x.shape, SENTINEL, dtype=dtype)
    res = call(op, x, w, axis=axis, out=out)
    assert res is out
    assert np.array_equal(out.view(np.uint8), expected.view(np.uint8))
    y, *stats = call(op, x, w, axis=axis, out=out, return_stats=True)
    assert y is out and len(stats) == (2 if op == "layer_norm" else 1)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("axis", [-1, 1, (0, 1)], ids=str)
def test_out_is_x(rng, op: str, dtype: np.dtype, axis) -> None:
    x = random_input(rng, (5, 33), dtype)
    w = random_input(rng, norm_shape(x.shape, axis), dtype)
    ref = reference(op, x, axis, w)
    expected = call(op, x, w, axis=axis)
    res = call(op, x, w, axis=axis, out=x)
    assert res is x
    assert_close_slices(x, ref["y"], axis, dtype.name)
    assert np.array_equal(x.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_is_x_with_residual(rng, op: str, dtype: np.dtype) -> None:
    x = random_input(rng, (4, 21), dtype)
    r = random_input(rng, (4, 21), dtype)
    ref = reference(op, x, -1, residual=r)
    y, h = call(op, x, residual=r, out=x)
    assert y is x
    assert np.array_equal(h.view(np.uint8), ref["h"].view(np.uint8))  # from x before the write
    assert_close_slices(x, ref["y"], -1, dtype.name)
    # out may also be the residual
    x2 = random_input(rng, (4, 21), dtype)
    ref2 = reference(op, x2, -1, residual=r)
    y2, h2 = call(op, x2, residual=r, out=r)
    assert y2 is r
    assert np.array_equal(h2.view(np.uint8), ref2["h"].view(np.uint8))
    assert_close_slices(r, ref2["y"], -1, dtype.name)


def test_out_non_contiguous_view_writes_only_the_view(rng) -> None:
    x = random_input(rng, (6, 10), np.float32)
    base = np.full((6, 20), -5.0, np.float32)
    view = base[:, ::2]
    assert cunorm.layer_norm(x, out=view) is view
    assert_close_slices(base[:, ::2], reference("layer_norm", x)["y"], -1, "float32")
    assert np.all(base[:, 1::2] == -5.0)


def test_out_overlapping_x(rng) -> None:
    buf = random_input(rng, (9, 16), np.float64)
    x, out = buf[1:], buf[:-1]
    ref = reference("rms_norm", x.copy())
    assert cunorm.rms_norm(x, out=out) is out
    assert_close_slices(out, ref["y"], -1, "float64")


# --- layouts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("view", ["transposed", "row_stride", "col_stride", "negative",
                                  "broadcast"])
def test_non_contiguous_inputs(rng, op: str, view: str) -> None:
    base = random_input(rng, (12, 40), np.float32)
    x = {"transposed": base.T, "row_stride": base[::3, :32], "col_stride": base[:, ::2],
         "negative": base[:, ::-1], "broadcast": np.broadcast_to(base[0], (5, 40))}[view]
    wbase = random_input(rng, (2 * x.shape[-1],), np.float32)
    w = wbase[::2]  # non-contiguous weight
    assert_close_slices(call(op, x, w), reference(op, x, -1, w)["y"], -1, "float32")


# --- special values --------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_and_inf_stay_in_their_slice(rng, op: str, dtype: np.dtype) -> None:
    x = random_input(rng, (6, 50), dtype)
    w = random_input(rng, (50,), dtype, loc=1.0)
    x[1, 7] = np.nan
    x[3, 20] = np.inf
    x[4, 0] = -np.inf
    y, *stats = call(op, x, w, return_stats=True)
    y64 = y.astype(np.float64)
    clean = [0, 2, 5]
    assert np.isfinite(y64[clean]).all()
    assert np.array_equal(y[clean], call(op, x[clean], w), equal_nan=True)
    assert np.isnan(y64[1]).all()  # NaN: the whole slice
    for s in stats:
        assert np.isnan(s[1]) and np.isfinite(s[clean]).all()
    if op == "layer_norm":
        assert np.isnan(y64[3]).all() and np.isnan(y64[4]).all()  # inf - inf in the mean
    else:
        # x / sqrt(mean(x**2)) with an infinite x: finite / inf = 0, inf / inf = NaN
        ref = reference(op, x, -1, w)["y"]
        for r in (3, 4):
            assert np.array_equal(np.isnan(y64[r]), np.isnan(ref[r]))
            assert np.isnan(y64[r]).any()


@pytest.mark.parametrize("op", OPS)
def test_nan_in_weight_stays_in_its_column(op: str) -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    w = np.ones(6, np.float32)
    w[2] = np.nan
    y = call(op, x, w)
    assert np.isnan(y[:, 2]).all()
    assert np.isfinite(np.delete(y, 2, axis=1)).all()


# --- empty arrays ----------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("shape", "axis"), [((0, 5), -1), ((3, 0), -1), ((0, 5), 0),
                                             ((2, 0, 3), 1), ((2, 0, 3), (0, 2)), ((0,), 0)],
                         ids=str)
def test_empty(op: str, dtype: np.dtype, shape, axis) -> None:
    x = np.empty(shape, dtype)
    wshape = norm_shape(shape, axis)
    w = np.ones(wshape, dtype)
    r = np.zeros(shape, dtype)
    y, h, *stats = call(op, x, w, axis=axis, residual=r, return_stats=True)
    assert y.shape == shape and y.dtype == dtype
    assert h.shape == shape and h.dtype == dtype
    sdt = np.float64 if dtype == np.float64 else np.float32
    assert len(stats) == (2 if op == "layer_norm" else 1)
    reduced_is_empty = math.prod(wshape) == 0
    for s in stats:
        assert s.shape == stats_shape(shape, axis) and s.dtype == sdt
        if reduced_is_empty:  # a slice with no elements has no mean (NumPy: NaN)
            assert np.isnan(s).all()
    assert call(op, x, axis=axis).shape == shape
    out = np.empty(shape, dtype)
    assert call(op, x, axis=axis, out=out) is out


# --- the numerically hard case ---------------------------------------------------------------
@pytest.mark.parametrize("cols", [64, 1000, 4096])
def test_large_offset_float32(rng, cols: int) -> None:
    """1e4 + N(0, 1) in float32: the one-pass variance E[x^2] - E[x]^2 loses every digit in
    float32; the result must still have mean 0 and std 1 (eps = 0) to float32 precision."""
    x = random_input(rng, (16, cols), np.float32, scale=1.0, loc=1e4)
    y = cunorm.layer_norm(x, eps=0.0).astype(np.float64)
    assert np.abs(y.std(axis=-1) - 1.0).max() <= 1e-6
    assert np.abs(y.mean(axis=-1)).max() <= 1e-6
    ref = reference("layer_norm", x, eps=0.0)["y"]
    assert_close_slices(y, ref, -1, "float32", slop=1e-11)
    y, mean, rstd = cunorm.layer_norm(x, return_stats=True)
    ref = reference("layer_norm", x)
    assert_close_slices(y, ref["y"], -1, "float32", slop=1e-11)
    np.testing.assert_allclose(mean, ref["mean"], rtol=2**-23)
    np.testing.assert_allclose(rstd, ref["rstd"], rtol=2**-23)


# --- bad input -------------------------------------------------------------------------------
def call_fails(op: str, exc: type[Exception], parts: list[str], x, *args, out=None,
               **kwargs) -> pytest.ExceptionInfo:
    """Call ``cunorm.<op>(x, *args, out=out, **kwargs)`` expecting ``exc`` whose message starts
    with ``<op>()`` and contains every part; ``out`` (an ndarray) must come back unchanged."""
    fn: Callable = getattr(cunorm, op)
    before = out.copy() if isinstance(out, np.ndarray) else None
    with pytest.raises(exc) as info:
        fn(x, *args, out=out, **kwargs) if out is not None else fn(x, *args, **kwargs)
    msg = str(info.value)
    assert msg.startswith(f"{op}()"), msg
    for part in parts:
        assert part in msg, f"{part!r} not in message {msg!r}"
    if before is not None:
        assert out.tobytes() == before.tobytes(), "a failed call wrote into out"
    return info


def sentinel_out(shape=(4, 6), dtype=np.float32) -> np.ndarray:
    return np.full(shape, SENTINEL, dtype)


X = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(4, 6)


class _FakeDLPack:
    """Stands in for a GPU framework array: ``__dlpack__``, a shape, a dtype, a module."""

    shape = (6,)
    dtype = np.dtype(np.float32)

    def __dlpack__(self, *args, **kwargs):  # pragma: no cover - never called
        raise AssertionError("a bad call must not touch a GPU array")


class FakeCupyArray(_FakeDLPack):
    pass


class FakeTorchTensor(_FakeDLPack):
    pass


class FakeJaxArray(_FakeDLPack):
    pass


FakeCupyArray.__module__ = "cupy._core.core"
FakeTorchTensor.__module__ = "torch"
FakeJaxArray.__module__ = "jaxlib.xla_extension"
FAKES = [(FakeCupyArray, "cupy"), (FakeTorchTensor, "torch"), (FakeJaxArray, "jax")]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("x", [[1.0, 2.0], [[1.0, 2.0]], (1.0, 2.0), 1.0, 3, None, "abc",
                               np.float32(2.0), memoryview(b"abcd")],
                         ids=lambda v: type(v).__name__)
def test_x_not_an_array(op: str, x) -> None:
    info = call_fails(op, TypeError, ["x must be", "numpy.ndarray", "cupy.ndarray",
                                      "torch.Tensor", "jax.Array"], x)
    assert type(x).__name__ in str(info.value)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.bool_, np.complex64,
                                   np.complex128, object, "U3"], ids=lambda d: np.dtype(d).name)
def test_x_wrong_dtype(op: str, dtype) -> None:
    x = np.zeros((4, 6), dtype=dtype)
    call_fails(op, TypeError, ["x has dtype", np.dtype(dtype).name, EXPECTED_DTYPES], x,
               out=sentinel_out())


@pytest.mark.parametrize("op", OPS)
def test_x_zero_dim(op: str) -> None:
    call_fails(op, ValueError, ["x", "at least one dimension", "0-d"], np.array(1.0, np.float32),
               out=sentinel_out(()))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("axis", "bad"), [(2, 2), (-3, -3), ((0, 5), 5), (2**70, 2**70)],
                         ids=str)
def test_axis_out_of_range(op: str, axis, bad: int) -> None:
    call_fails(op, ValueError, [f"axis {bad}", "out of range", "2 dimensions"], X,
               out=sentinel_out(), axis=axis)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis", [(0, 0), (1, -1), (-2, 0), (0, 1, 0)], ids=str)
def test_axis_repeated(op: str, axis) -> None:
    call_fails(op, ValueError, ["axis", "repeats"], X, out=sentinel_out(), axis=axis)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis", [1.0, "1", None, (0, 1.0), ([0],), True, (0, True), np.float64(1),
                                  np.array([0, 1])], ids=repr)
def test_axis_not_int(op: str, axis) -> None:
    call_fails(op, TypeError, ["axis must be an int or a tuple of ints"], X, out=sentinel_out(),
               axis=axis)


@pytest.mark.parametrize("op", OPS)
def test_axis_empty_tuple(op: str) -> None:
    call_fails(op, ValueError, ["axis", "at least one axis"], X, out=sentinel_out(), axis=())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("axis", "wshape", "expected"),
                         [(-1, (5,), (6,)), (-1, (1, 6), (6,)), (-1, (4, 6), (6,)),
                          (-1, (), (6,)), (0, (6,), (4,)), ((0, 1), (6, 4), (4, 6)),
                          ((0, 1), (24,), (4, 6))], ids=str)
def test_weight_wrong_shape(op: str, axis, wshape, expected) -> None:
    w = np.ones(wshape, np.float32)
    call_fails(op, ValueError, [f"weight has shape {wshape}", f"expected {expected}"], X, w,
               out=sentinel_out(), axis=axis)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("wdtype", [np.float64, np.float16, BF16, np.int32, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_weight_wrong_dtype(op: str, wdtype) -> None:
    w = np.ones(6, wdtype)
    call_fails(op, TypeError, [f"weight has dtype {np.dtype(wdtype).name}",
                               "expected float32 (the dtype of x)"], X, w, out=sentinel_out())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("w", [[1.0] * 6, (1.0,) * 6, 1.0, "w", memoryview(np.ones(6))],
                         ids=lambda v: type(v).__name__)
def test_weight_not_an_array(op: str, w) -> None:
    info = call_fails(op, TypeError, ["weight must be", "numpy.ndarray"], X, w,
                      out=sentinel_out())
    assert type(w).__name__ in str(info.value)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("fake", "kind"), FAKES, ids=[k for _, k in FAKES])
def test_weight_other_array_kind(op: str, fake, kind: str) -> None:
    call_fails(op, TypeError, [f"weight is a {kind} array", "x is a numpy array", "same kind"],
               X, fake(), out=sentinel_out())


@pytest.mark.parametrize(("bshape", "expected"), [((5,), (6,)), ((1, 6), (6,)), ((4, 6), (6,))],
                         ids=str)
def test_bias_wrong_shape(bshape, expected) -> None:
    call_fails("layer_norm", ValueError, [f"bias has shape {bshape}", f"expected {expected}"], X,
               None, np.ones(bshape, np.float32), out=sentinel_out())


@pytest.mark.parametrize("bdtype", [np.float64, np.float16, BF16, np.int64],
                         ids=lambda d: np.dtype(d).name)
def test_bias_wrong_dtype(bdtype) -> None:
    call_fails("layer_norm", TypeError, [f"bias has dtype {np.dtype(bdtype).name}",
                                         "expected float32 (the dtype of x)"],
               X, np.ones(6, np.float32), np.ones(6, bdtype), out=sentinel_out())


def test_bias_not_an_array_or_other_kind() -> None:
    call_fails("layer_norm", TypeError, ["bias must be", "numpy.ndarray", "list"], X, None,
               [0.0] * 6, out=sentinel_out())
    for fake, kind in FAKES:
        call_fails("layer_norm", TypeError, [f"bias is a {kind} array", "x is a numpy array"],
                   X, None, fake(), out=sentinel_out())


def test_rms_norm_has_no_bias() -> None:
    with pytest.raises(TypeError, match="bias"):
        cunorm.rms_norm(X, bias=np.ones(6, np.float32))
    with pytest.raises(TypeError, match=r"rms_norm\(\)"):
        cunorm.rms_norm(X, np.ones(6, np.float32), np.ones(6, np.float32))


@pytest.mark.parametrize("op", OPS)
def test_keyword_only_arguments(op: str) -> None:
    args = (X, None, None) if op == "layer_norm" else (X, None)
    with pytest.raises(TypeError, match=rf"{op}\(\)"):
        getattr(cunorm, op)(*args, -1)  # axis is keyword-only


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("rshape", "expected"), [((4, 5), (4, 6)), ((6,), (4, 6)),
                                                  ((1, 6), (4, 6)), ((6, 4), (4, 6)),
                                                  ((1, 4, 6), (4, 6))], ids=str)
def test_residual_wrong_shape(op: str, rshape, expected) -> None:
    """No broadcasting: the residual has x's shape."""
    call_fails(op, ValueError, [f"residual has shape {rshape}", f"expected {expected}"], X,
               out=sentinel_out(), residual=np.ones(rshape, np.float32))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("rdtype", [np.float64, np.float16, BF16, np.int32],
                         ids=lambda d: np.dtype(d).name)
def test_residual_wrong_dtype(op: str, rdtype) -> None:
    call_fails(op, TypeError, [f"residual has dtype {np.dtype(rdtype).name}",
                               "expected float32 (the dtype of x)"], X, out=sentinel_out(),
               residual=np.ones((4, 6), rdtype))


@pytest.mark.parametrize("op", OPS)
def test_residual_not_an_array_or_other_kind(op: str) -> None:
    call_fails(op, TypeError, ["residual must be", "numpy.ndarray", "list"], X,
               out=sentinel_out(), residual=[[0.0] * 6] * 4)
    call_fails(op, TypeError, ["residual must be", "float"], X, out=sentinel_out(), residual=1.0)
    for fake, kind in FAKES:
        call_fails(op, TypeError, [f"residual is a {kind} array", "x is a numpy array"], X,
                   out=sentinel_out(), residual=fake())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("eps", [-1.0, -1e-30, -1, np.nan, np.inf, -np.inf, np.float32(np.nan),
                                 np.float64(-0.5), np.int64(-2)], ids=repr)
def test_eps_out_of_range(op: str, eps) -> None:
    call_fails(op, ValueError, ["eps must be finite and >= 0", repr(eps)[:3]], X,
               out=sentinel_out(), eps=eps)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("eps", [True, False, np.True_, "1e-5", None, 1j, [1e-5], b"1"],
                         ids=repr)
def test_eps_not_a_real_number(op: str, eps) -> None:
    call_fails(op, TypeError, ["eps must be a real number"], X, out=sentinel_out(), eps=eps)


@pytest.mark.parametrize("op", OPS)
def test_eps_huge_int_is_a_value_error(op: str) -> None:
    call_fails(op, ValueError, ["eps must be finite and >= 0"], X, out=sentinel_out(),
               eps=10**400)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("flag", [1, 0, "yes", None, 1.0, np.int64(1), [True]], ids=repr)
def test_return_stats_not_a_bool(op: str, flag) -> None:
    call_fails(op, TypeError, ["return_stats must be a bool", repr(flag)[:4]], X,
               out=sentinel_out(), return_stats=flag)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("oshape", [(4, 5), (6, 4), (24,), (1, 4, 6), (4,)], ids=str)
def test_out_wrong_shape(op: str, oshape) -> None:
    call_fails(op, ValueError, [f"out has shape {oshape}", "expected (4, 6)"], X,
               out=sentinel_out(oshape))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("x_dtype", "out_dtype"),
                         [(np.float32, np.float64), (np.float64, np.float32),
                          (np.float16, BF16), (BF16, np.float16), (np.float32, np.float16),
                          (np.float32, np.int32)], ids=str)
def test_out_wrong_dtype(op: str, x_dtype, out_dtype) -> None:
    """No dtype= for the norms: out must have x's dtype."""
    call_fails(op, TypeError, [f"out has dtype {np.dtype(out_dtype).name}",
                               f"expected {np.dtype(x_dtype).name}"], X.astype(x_dtype),
               out=sentinel_out(dtype=out_dtype))


@pytest.mark.parametrize("op", OPS)
def test_out_not_an_array_or_other_kind(op: str) -> None:
    call_fails(op, TypeError, ["out must be", "numpy.ndarray", "list"], X,
               out=[[0.0] * 6] * 4)
    for fake, kind in FAKES:
        call_fails(op, TypeError, [f"out is a {kind} array", "x is a numpy array", "same kind"],
                   X, out=fake())


@pytest.mark.parametrize("op", OPS)
def test_out_read_only(op: str) -> None:
    out = sentinel_out()
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        call(op, X, out=out)
    assert np.all(out == SENTINEL)


@pytest.mark.parametrize("op", OPS)
def test_every_failed_call_leaves_out_and_inputs_untouched(op: str) -> None:
    """One preallocated out through a sequence of bad calls (each bad in one argument only,
    the others valid), then a good call still works."""
    out = sentinel_out()
    x = X.copy()
    w = np.ones(6, np.float32)
    r = np.ones((4, 6), np.float32)
    bad_calls: list[tuple[type[Exception], dict]] = [
        (TypeError, {"x": x.astype(np.int32)}),
        (ValueError, {"axis": 3}),
        (ValueError, {"weight": np.ones(5, np.float32)}),
        (TypeError, {"weight": np.ones(6, np.float64)}),
        (ValueError, {"residual": np.ones((4, 5), np.float32)}),
        (TypeError, {"residual": r.astype(np.float16)}),
        (ValueError, {"eps": -1.0}),
        (TypeError, {"eps": "0"}),
        (TypeError, {"return_stats": 1}),
    ]
    if op == "layer_norm":
        bad_calls += [(ValueError, {"bias": np.ones(7, np.float32)}),
                      (TypeError, {"bias": np.ones(6, np.float16)})]
    for exc, bad in bad_calls:
        args = {"x": x, "weight": w, "residual": r, "eps": 1e-5, "return_stats": True, **bad}
        xx = args.pop("x")
        with pytest.raises(exc, match=rf"^{op}\(\)"):
            call(op, xx, out=out, **args)
        assert np.all(out == SENTINEL), f"{bad} wrote into out"
    # out is x: a failed call leaves x as it was
    with pytest.raises(ValueError):
        call(op, x, w, out=x, axis=(0, 0))
    assert np.array_equal(x, X)
    assert np.array_equal(w, np.ones(6, np.float32)) and np.array_equal(r, np.ones((4, 6)))
    y, h, *_ = call(op, x, w, out=out, residual=r, return_stats=True)
    assert y is out and np.isfinite(out).all()
    assert np.array_equal(h, X + r)


@pytest.mark.parametrize("op", OPS)
def test_cpu_torch_tensor_refused_with_reason(op: str, monkeypatch) -> None:
    with pytest.raises(TypeError, match=rf"{op}\(\): x is a CPU torch.Tensor"):
        call(op, TorchTensorStub(is_cuda=False))
    # a NumPy weight with a torch x: refused before any GPU work
    with pytest.raises(TypeError, match=rf"{op}\(\): weight is a numpy array but x is a torch"):
        call(op, TorchTensorStub(is_cuda=True), np.ones(3, np.float32))
    from cunorm import _array

    monkeypatch.setattr(_array, "_cupy", lambda: None)
    with pytest.raises(RuntimeError, match=rf"{op}\(\): .*CuPy is not installed"):
        call(op, TorchTensorStub(is_cuda=True))
