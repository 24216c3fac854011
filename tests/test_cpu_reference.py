"""The NumPy path of ``cunorm.softmax`` / ``cunorm.log_softmax`` against float64 formulas.

The formulas are deliberately not the library's (max subtraction then normalization): each
output is ``1 / (1 + sum_{j != i} exp(x_j - x_i))`` (and ``-log1p`` of that sum), which needs
no shift and is accurate to float64 rounding. Inputs are fresh random arrays of every dtype
(float16, bfloat16, float32, float64) for every axis form, ``dtype=``, ``out=`` (including
``out=x``), special values, empty arrays and non-contiguous views.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest

import cunorm

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
DTYPE_IDS = [dt.name for dt in DTYPES]
#: DESIGN section 3: relative max-norm error per row against float64
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-12}
#: unit roundoff: the NumPy path computes in float64 and rounds once to the output dtype
UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-52}
TINY = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 0.0}

FUNCS = {"softmax": cunorm.softmax, "log_softmax": cunorm.log_softmax}
Func = Callable[..., np.ndarray]


def _normalize(axis: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(a % ndim for a in axes))


def reference(x: np.ndarray, axis: int | tuple[int, ...], log: bool) -> np.ndarray:
    """float64 softmax / log_softmax of ``x`` (any dtype) over ``axis`` without max shift:
    y_i = 1 / (1 + T_i), log y_i = -log1p(T_i), T_i = sum_{j != i} exp(x_j - x_i).

    Slices must be finite apart from ``-inf`` entries (which give 0 / ``-inf``) and hold at
    least one finite value."""
    x64 = np.asarray(x, dtype=np.float64)
    axes = _normalize(axis, x64.ndim)
    keep = [i for i in range(x64.ndim) if i not in axes]
    moved = np.transpose(x64, keep + list(axes))
    k = int(np.prod([x64.shape[a] for a in axes]))
    rows = moved.reshape(-1, k)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = rows[:, None, :] - rows[:, :, None]  # [r, i, j] = x_j - x_i
        e = np.exp(diff)
        e[:, np.arange(k), np.arange(k)] = 0.0  # j != i (also drops inf - inf on the diagonal)
        t = e.sum(axis=-1)
        y = -np.log1p(t) if log else 1.0 / (1.0 + t)
        y[rows == -np.inf] = -np.inf if log else 0.0  # also where -inf - -inf made t nan
    out = y.reshape(moved.shape)
    return np.transpose(out, np.argsort(keep + list(axes)))


def assert_close_rows(y: np.ndarray, ref: np.ndarray, axis, dtype_name: str) -> None:
    """DESIGN's bound (relative max-norm per slice) and the one-rounding bound (each element
    within one unit roundoff of the float64 value, plus the subnormal spacing)."""
    y64 = np.asarray(y, dtype=np.float64)
    assert y64.shape == ref.shape
    axes = _normalize(axis, y64.ndim)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(y64), finite), "non-finite values differ"
    assert np.array_equal(y64[~finite], ref[~finite]), "infinities differ"
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(y64 - ref), 0.0)
    scale = np.max(np.where(finite, np.abs(ref), 0.0), axis=axes, keepdims=True)
    rel = np.max(err, axis=axes, keepdims=True) / np.where(scale > 0, scale, 1.0)
    assert rel.max(initial=0.0) <= TOL[dtype_name], f"row error {rel.max()} > {TOL[dtype_name]}"
    # float64's own error (a few ulps of the slice's values) is far below the rounding
    bound = (1.01 * UNIT[dtype_name] * np.abs(ref) + TINY[dtype_name]
             + 1e-13 * (np.abs(ref) + scale))
    worst = np.max(err - bound, initial=-1.0)
    assert worst <= 0, f"an element is off by more than one rounding ({worst:.3g} over)"


def random_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
                 scale: float = 3.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(dtype)


# --- values against the formulas -----------------------------------------------------------
AXES_3D = [0, 1, 2, -1, -2, -3, (1, 2), (0, 1), (0, 2), (2, 0), (-1, 0), (0, 1, 2), (-3, -2, -1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize("axis", AXES_3D, ids=str)
def test_matches_float64_formula(rng, dtype: np.dtype, fname: str, axis) -> None:
    x = random_input(rng, (4, 7, 5), dtype)
    x_before = x.copy()
    y = FUNCS[fname](x, axis=axis)
    assert type(y) is np.ndarray and y.dtype == dtype and y.shape == x.shape
    assert y is not x and not np.shares_memory(y, x)
    assert np.array_equal(x, x_before)  # input untouched
    assert_close_rows(y, reference(x, axis, fname == "log_softmax"), axis, dtype.name)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize("shape", [(1,), (2,), (33,), (1, 1), (3, 1), (1, 200), (2, 3, 4, 5)],
                         ids=str)
def test_default_axis_is_last(rng, dtype: np.dtype, fname: str, shape) -> None:
    x = random_input(rng, shape, dtype)
    y = FUNCS[fname](x)
    assert_close_rows(y, reference(x, -1, fname == "log_softmax"), -1, dtype.name)
    assert np.array_equal(y, FUNCS[fname](x, axis=len(shape) - 1), equal_nan=True)


def test_known_values() -> None:
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose(cunorm.softmax(x)[0], e / e.sum(), rtol=1e-15)
    np.testing.assert_allclose(cunorm.softmax(x)[1], [1 / 3] * 3, rtol=1e-15)
    np.testing.assert_allclose(cunorm.log_softmax(x)[1], [-np.log(3)] * 3, rtol=1e-15)
    np.testing.assert_allclose(cunorm.softmax(x, axis=0)[:, 0], 1 / (1 + np.exp([-1.0, 1.0])),
                               rtol=1e-15)


# --- dtype= ------------------------------------------------------------------------------
@pytest.mark.parametrize("src", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("dst", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
def test_dtype_argument(rng, src: np.dtype, dst: np.dtype, fname: str) -> None:
    x = random_input(rng, (6, 40), src)
    y = FUNCS[fname](x, axis=1, dtype=dst)
    assert y.dtype == dst
    assert_close_rows(y, reference(x, 1, fname == "log_softmax"), 1, dst.name)


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [("float32", np.float32), (np.float16, np.float16), ("bfloat16", BF16),
     (ml_dtypes.bfloat16, BF16), (np.dtype("float64"), np.float64), ("f4", np.float32),
     (float, np.float64)],
    ids=str,
)
def test_dtype_spellings(spelling, expected) -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    assert cunorm.softmax(x, dtype=spelling).dtype == np.dtype(expected)
    assert cunorm.log_softmax(x, dtype=spelling).dtype == np.dtype(expected)


def test_float16_input_float32_output_is_not_rounded_through_float16(rng) -> None:
    x = random_input(rng, (8, 300), np.float16)
    y = cunorm.softmax(x, dtype=np.float32)
    assert_close_rows(y, reference(x, -1, False), -1, "float32")  # 2e-6, far below fp16's


# --- out= --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize("axis", [-1, 0, (0, 2)], ids=str)
def test_out(rng, dtype: np.dtype, fname: str, axis) -> None:
    x = random_input(rng, (3, 9, 4), dtype)
    out = np.full(x.shape, 7, dtype=dtype)
    res = FUNCS[fname](x, axis=axis, out=out)
    assert res is out
    assert_close_rows(out, reference(x, axis, fname == "log_softmax"), axis, dtype.name)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize("axis", [-1, 1, (0, 1)], ids=str)
def test_out_is_x(rng, dtype: np.dtype, fname: str, axis) -> None:
    x = random_input(rng, (5, 33), dtype)
    ref = reference(x, axis, fname == "log_softmax")
    expected = FUNCS[fname](x, axis=axis)
    res = FUNCS[fname](x, axis=axis, out=x)
    assert res is x
    assert_close_rows(x, ref, axis, dtype.name)
    assert np.array_equal(x, expected)


def test_out_with_dtype(rng) -> None:
    x = random_input(rng, (4, 50), np.float16)
    out = np.zeros(x.shape, np.float32)
    assert cunorm.softmax(x, dtype=np.float32, out=out) is out
    assert_close_rows(out, reference(x, -1, False), -1, "float32")


def test_out_non_contiguous_view_writes_only_the_view(rng) -> None:
    x = random_input(rng, (6, 10), np.float32)
    base = np.full((6, 20), -5.0, np.float32)
    view = base[:, ::2]
    assert cunorm.log_softmax(x, out=view) is view
    assert_close_rows(base[:, ::2], reference(x, -1, True), -1, "float32")
    assert np.all(base[:, 1::2] == -5.0)


def test_out_is_x_along_axis_0(rng) -> None:
    x = random_input(rng, (8, 8), np.float64)
    ref = reference(x, 0, False)
    assert cunorm.softmax(x, axis=0, out=x) is x
    assert_close_rows(x, ref, 0, "float64")


def test_out_is_transposed_view_of_x(rng) -> None:
    """out overlaps x element by element in another order: no value is read after it was
    overwritten."""
    x = random_input(rng, (8, 8), np.float64)
    ref = reference(x, -1, False)
    assert cunorm.softmax(x, out=x.T).base is x
    assert_close_rows(x.T, ref, -1, "float64")


# --- special values ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
def test_nan_poisons_its_row_only(rng, dtype: np.dtype, fname: str) -> None:
    x = random_input(rng, (5, 17), dtype)
    x[2, 6] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = FUNCS[fname](x)
    assert np.all(np.isnan(y[2].astype(np.float64)))
    rest = np.delete(np.arange(5), 2)
    assert_close_rows(y[rest], reference(x[rest], -1, fname == "log_softmax"), -1, dtype.name)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
def test_nan_along_axis_0_poisons_its_column_only(rng, dtype: np.dtype, fname: str) -> None:
    x = random_input(rng, (6, 4), dtype)
    x[3, 1] = np.nan
    y = FUNCS[fname](x, axis=0).astype(np.float64)
    assert np.all(np.isnan(y[:, 1]))
    assert not np.any(np.isnan(y[:, [0, 2, 3]]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize("n_inf", [1, 2])
def test_posinf_row_is_nan(rng, dtype: np.dtype, fname: str, n_inf: int) -> None:
    x = random_input(rng, (3, 9), dtype)
    x[1, 2] = np.inf
    if n_inf == 2:
        x[1, 7] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = FUNCS[fname](x).astype(np.float64)
    assert np.all(np.isnan(y[1]))  # as NumPy: exp(inf - inf) = nan
    assert np.all(np.isfinite(y[[0, 2]]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
def test_all_neginf_row_is_nan(rng, dtype: np.dtype, fname: str) -> None:
    x = random_input(rng, (4, 12), dtype)
    x[0] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = FUNCS[fname](x).astype(np.float64)
    assert np.all(np.isnan(y[0]))
    assert np.all(np.isfinite(y[1:]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
def test_neginf_mixed_with_finite(rng, dtype: np.dtype, fname: str) -> None:
    x = random_input(rng, (6, 20), dtype)
    mask = rng.random(x.shape) < 0.4
    mask[:, 0] = False  # every row keeps a finite value
    x[mask] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = FUNCS[fname](x).astype(np.float64)
    if fname == "softmax":
        assert np.all(y[mask] == 0.0)
    else:
        assert np.all(y[mask] == -np.inf)
    ref = reference(x, -1, fname == "log_softmax")
    assert_close_rows(y, ref, -1, dtype.name)
    # the finite entries are the softmax of the finite entries alone
    row = x[3][~mask[3]]
    assert_close_rows(FUNCS[fname](row), reference(row, -1, fname == "log_softmax"), -1,
                      dtype.name)


# --- properties --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
def test_shift_invariance_exact(rng, dtype: np.dtype, fname: str) -> None:
    """Integer inputs and shift are exact in every dtype, so the result is identical."""
    x = rng.integers(-8, 9, size=(7, 31)).astype(dtype)
    shifted = (x.astype(np.float64) + 128).astype(dtype)
    assert np.array_equal(shifted.astype(np.float64), x.astype(np.float64) + 128)
    assert np.array_equal(FUNCS[fname](x), FUNCS[fname](shifted))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize("shift", [1e3, -1e3, 3e4])
def test_shift_invariance_large(rng, dtype, fname: str, shift: float) -> None:
    """exp(1e3) overflows: the max must be subtracted first."""
    x = rng.integers(-20, 21, size=(5, 64)).astype(dtype)
    y = FUNCS[fname](x + dtype(shift))
    assert np.all(np.isfinite(y))
    assert_close_rows(y, reference(x, -1, fname == "log_softmax"), -1, np.dtype(dtype).name)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("axis", [-1, 0, (0, 2), (0, 1, 2)], ids=str)
def test_rows_sum_to_one(rng, dtype: np.dtype, axis) -> None:
    x = random_input(rng, (6, 50, 3), dtype, scale=5.0)
    y = cunorm.softmax(x, axis=axis).astype(np.float64)
    n = np.prod([x.shape[a] for a in _normalize(axis, 3)])
    sums = y.sum(axis=axis)
    assert np.all(y >= 0) and np.all(y <= 1)
    assert np.max(np.abs(sums - 1)) <= 2 * UNIT[dtype.name] * 2 + n * 2.0**-52
    lse = np.log(np.exp(cunorm.log_softmax(x, axis=axis, dtype=np.float64)).sum(axis=axis))
    assert np.max(np.abs(lse)) <= 1e-13


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_log_softmax_is_log_of_softmax(rng, dtype: np.dtype) -> None:
    x = random_input(rng, (4, 25), dtype)
    lhs = cunorm.log_softmax(x, dtype=np.float64)
    rhs = np.log(cunorm.softmax(x, dtype=np.float64))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-13, atol=1e-14)
    assert np.all(lhs <= 0)


# --- empty arrays ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((0, 5), -1), ((0, 5), 0), ((5, 0), -1), ((5, 0), 0), ((0,), 0), ((2, 0, 3), 1),
     ((2, 0, 3), (0, 2)), ((2, 0, 3), (0, 1, 2)), ((0, 0), -1)],
    ids=str,
)
def test_empty(dtype: np.dtype, fname: str, shape, axis) -> None:
    x = np.zeros(shape, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = FUNCS[fname](x, axis=axis)
        assert type(y) is np.ndarray and y.shape == shape and y.dtype == dtype
        y32 = FUNCS[fname](x, axis=axis, dtype=np.float32)
        assert y32.shape == shape and y32.dtype == np.float32
        out = np.empty(shape, dtype)
        assert FUNCS[fname](x, axis=axis, out=out) is out


# --- non-contiguous inputs ---------------------------------------------------------------
VIEWS = {
    "strided_cols": lambda a: a[:, ::2],
    "strided_rows": lambda a: a[::3, :],
    "transposed": lambda a: a.T,
    "reversed": lambda a: a[::-1, ::-1],
    "column_slice": lambda a: a[:, 3:17],
    "broadcast": lambda a: np.broadcast_to(a[:1], (5, a.shape[1])),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fname", FUNCS)
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("axis", [-1, 0, (0, 1)], ids=str)
def test_non_contiguous_views(rng, dtype: np.dtype, fname: str, view: str, axis) -> None:
    base = random_input(rng, (12, 24), dtype)
    x = VIEWS[view](base)
    before = base.copy()
    y = FUNCS[fname](x, axis=axis)
    assert y.shape == x.shape and y.dtype == dtype
    contiguous = FUNCS[fname](np.ascontiguousarray(x), axis=axis).astype(np.float64)
    # same values up to float64 summation order, i.e. at most one rounding step apart
    rtol = max(2.01 * UNIT[dtype.name], 1e-13)
    atol = 2 * TINY[dtype.name] + 1e-13 * np.abs(contiguous).max(initial=0.0)
    np.testing.assert_allclose(y.astype(np.float64), contiguous, rtol=rtol, atol=atol)
    assert_close_rows(y, reference(x, axis, fname == "log_softmax"), axis, dtype.name)
    assert np.array_equal(base, before)


def test_fortran_order_3d(rng) -> None:
    x = np.asfortranarray(random_input(rng, (3, 4, 5), np.float32))
    for axis in (0, 1, 2, (0, 2)):
        assert_close_rows(cunorm.softmax(x, axis=axis), reference(x, axis, False), axis,
                          "float32")


def test_numpy_integer_axis(rng) -> None:
    x = random_input(rng, (3, 4), np.float64)
    assert np.array_equal(cunorm.softmax(x, axis=np.int64(0)), cunorm.softmax(x, axis=0))
    assert np.array_equal(cunorm.softmax(x, axis=(np.int32(0), 1)),
                          cunorm.softmax(x, axis=(0, 1)))
