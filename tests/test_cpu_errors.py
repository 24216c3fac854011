"""Bad input to the public functions (DESIGN section 4), on NumPy inputs.

Every case checks the exception type and that the message names the function, the argument
and what was expected, and that a preallocated ``out`` was left untouched.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import ml_dtypes
import numpy as np
import pytest
from _fakes import TorchTensorStub

import cunorm
from cunorm import _array

FUNCS = {"softmax": cunorm.softmax, "log_softmax": cunorm.log_softmax}
EXPECTED_DTYPES = "float16, bfloat16, float32 or float64"
SENTINEL = -12345.0


@pytest.fixture(autouse=True)
def fresh_axis_cache() -> Iterator[None]:
    """Axis validation is memoized; start every test from an empty memo so a case is checked
    on its own (the order dependence is tested explicitly below)."""
    _array._normalize_axes_cached.cache_clear()
    yield
    _array._normalize_axes_cached.cache_clear()


@pytest.fixture(params=list(FUNCS))
def fname(request) -> str:
    return request.param


def call_fails(fn: Callable, exc: type[Exception], parts: list[str], x, out=None,
               **kwargs) -> pytest.ExceptionInfo:
    """Call ``fn(x, out=out, **kwargs)`` expecting ``exc`` whose message contains every part;
    ``out`` (if an ndarray) must come back unchanged."""
    before = out.copy() if isinstance(out, np.ndarray) else None
    with pytest.raises(exc) as info:
        fn(x, out=out, **kwargs) if out is not None else fn(x, **kwargs)
    msg = str(info.value)
    for part in parts:
        assert part in msg, f"{part!r} not in message {msg!r}"
    if before is not None:
        assert np.array_equal(out, before, equal_nan=True), "a failed call wrote into out"
    return info


def sentinel_out(shape=(3, 4), dtype=np.float64) -> np.ndarray:
    return np.full(shape, SENTINEL, dtype)


# --- x ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype",
    [np.int32, np.int64, np.uint8, np.bool_, np.complex64, np.complex128, object, "U3",
     "datetime64[s]", np.longdouble],
    ids=lambda dt: np.dtype(dt).name,
)
def test_x_wrong_dtype(fname: str, dtype) -> None:
    if np.dtype(dtype) == np.dtype(np.float64):
        pytest.skip("long double is float64 on this platform")
    x = np.zeros((3, 4), dtype=dtype)
    call_fails(FUNCS[fname], TypeError,
               [f"{fname}()", "x", np.dtype(dtype).name, EXPECTED_DTYPES], x, out=sentinel_out())


@pytest.mark.parametrize(
    "x",
    [[1.0, 2.0], [[1.0, 2.0]], (1.0, 2.0), 1.0, 3, None, "abc", np.float64(1.0),
     np.float32(2.0), {"a": 1}, memoryview(b"abcd")],
    ids=lambda v: type(v).__name__,
)
def test_x_not_an_array(fname: str, x) -> None:
    info = call_fails(FUNCS[fname], TypeError, [f"{fname}()", "x must be", "numpy.ndarray",
                                                "cupy.ndarray"], x)
    assert type(x).__name__ in str(info.value)


def test_x_zero_dim(fname: str) -> None:
    for x in (np.array(1.0), np.array(2.0, np.float32), np.array(1.0, ml_dtypes.bfloat16)):
        for axis in (-1, 0, ()):
            call_fails(FUNCS[fname], ValueError, [f"{fname}()", "x", "at least one dimension",
                                                  "0-d"], x, axis=axis)


# --- axis ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape", "axis", "bad"),
                         [((3, 4), 2, 2), ((3, 4), -3, -3), ((3, 4), (0, 5), 5),
                          ((5,), 1, 1), ((2, 3, 4), (-4, 0), -4), ((3, 4), 2**70, 2**70)],
                         ids=str)
def test_axis_out_of_range(fname: str, shape, axis, bad: int) -> None:
    x = np.zeros(shape)
    out = sentinel_out(shape)
    call_fails(FUNCS[fname], ValueError,
               [f"{fname}()", f"axis {bad}", "out of range", f"{len(shape)} dimension"], x,
               out=out, axis=axis)


@pytest.mark.parametrize("axis", [(0, 0), (1, -1), (-2, 0), (0, 1, 0)], ids=str)
def test_axis_repeated(fname: str, axis) -> None:
    call_fails(FUNCS[fname], ValueError, [f"{fname}()", "axis", "repeats"], np.zeros((3, 4)),
               out=sentinel_out(), axis=axis)


@pytest.mark.parametrize(
    "axis",
    [1.0, 1.5, "1", b"1", (0, 1.0), (0, "1"), ([0],), (0, [1]), np.float64(1.0), 1j,
     np.array(1), np.array([0, 1]), slice(None), {0}, {0: 1}],
    ids=repr,
)
def test_axis_not_int(fname: str, axis) -> None:
    call_fails(FUNCS[fname], TypeError, [f"{fname}()", "axis must be an int or a tuple of ints"],
               np.zeros((3, 4)), out=sentinel_out(), axis=axis)


@pytest.mark.parametrize("axis", [True, False, (True,), (0, True), (np.bool_(True),)], ids=repr)
def test_axis_bool(fname: str, axis) -> None:
    call_fails(FUNCS[fname], TypeError, [f"{fname}()", "axis must be an int or a tuple of ints"],
               np.zeros((3, 4)), out=sentinel_out(), axis=axis)


def test_axis_empty_tuple(fname: str) -> None:
    call_fails(FUNCS[fname], ValueError, [f"{fname}()", "axis", "at least one axis"],
               np.zeros((3, 4)), out=sentinel_out(), axis=())


@pytest.mark.parametrize("bad", [True, 1.0, np.float64(1.0), (True,), (1.0,)], ids=repr)
def test_axis_type_checked_after_a_valid_call(fname: str, bad) -> None:
    x = np.zeros((3, 4))
    FUNCS[fname](x, axis=1)
    FUNCS[fname](x, axis=(1,))
    call_fails(FUNCS[fname], TypeError, [f"{fname}()", "axis must be an int or a tuple of ints"],
               x, out=sentinel_out(), axis=bad)


# --- dtype= -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "shown"),
    [(np.int32, "int32"), ("int64", "int64"), (bool, "bool"), (np.complex64, "complex64"),
     (complex, "complex128"), (object, "object"), ("U2", "str"), ("notadtype", "notadtype"),
     (3.5, "3.5"), ("bf16", "bf16")],
    ids=str,
)
def test_dtype_not_float(fname: str, dtype, shown: str) -> None:
    call_fails(FUNCS[fname], TypeError, [f"{fname}()", "dtype", shown, EXPECTED_DTYPES],
               np.zeros((3, 4)), out=sentinel_out(), dtype=dtype)


def test_dtype_and_out_are_keyword_only(fname: str) -> None:
    x = np.zeros((3, 4))
    with pytest.raises(TypeError, match=re.escape(f"{fname}()")):
        FUNCS[fname](x, -1, np.float32)
    with pytest.raises(TypeError, match=re.escape(f"{fname}()")):
        FUNCS[fname](x, -1, None, sentinel_out())


# --- out= ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape", "out_shape"),
                         [((3, 4), (3, 5)), ((3, 4), (4, 3)), ((3, 4), (12,)),
                          ((3, 4), (1, 3, 4)), ((3, 4), (3, 1)), ((0, 4), (4,)),
                          ((2, 3, 4), (2, 3))],
                         ids=str)
def test_out_wrong_shape(fname: str, shape, out_shape) -> None:
    call_fails(FUNCS[fname], ValueError,
               [f"{fname}()", "out", f"shape {out_shape}", f"expected {shape}"],
               np.zeros(shape), out=sentinel_out(out_shape))


@pytest.mark.parametrize(
    ("x_dtype", "dtype", "out_dtype", "expected"),
    [(np.float64, None, np.float32, "float64"), (np.float32, None, np.float64, "float32"),
     (np.float16, None, ml_dtypes.bfloat16, "float16"),
     (ml_dtypes.bfloat16, None, np.float16, "bfloat16"),
     (np.float16, np.float32, np.float16, "float32"),
     (np.float32, "bfloat16", np.float32, "bfloat16"),
     (np.float64, None, np.int64, "float64"), (np.float64, None, np.complex128, "float64")],
    ids=str,
)
def test_out_wrong_dtype(fname: str, x_dtype, dtype, out_dtype, expected: str) -> None:
    out = sentinel_out(dtype=out_dtype)
    call_fails(FUNCS[fname], TypeError,
               [f"{fname}()", "out", np.dtype(out_dtype).name, f"expected {expected}"],
               np.zeros((3, 4), x_dtype), out=out, dtype=dtype)


class _FakeDLPack:
    """Stands in for a GPU framework array: only ``__dlpack__`` and a module name."""

    shape = (3, 4)
    dtype = np.dtype(np.float64)

    def __dlpack__(self, *args, **kwargs):  # pragma: no cover - never called
        raise AssertionError("a bad call must not touch the out array")


class FakeTorchTensor(_FakeDLPack):
    pass


class FakeJaxArray(_FakeDLPack):
    pass


class FakeCupyArray(_FakeDLPack):
    pass


FakeTorchTensor.__module__ = "torch"
FakeJaxArray.__module__ = "jaxlib.xla_extension"
FakeCupyArray.__module__ = "cupy._core.core"


@pytest.mark.parametrize(("out", "kind"),
                         [(FakeCupyArray(), "cupy"), (FakeTorchTensor(), "torch"),
                          (FakeJaxArray(), "jax")],
                         ids=["cupy", "torch", "jax"])
def test_out_other_array_kind(fname: str, out, kind: str) -> None:
    """Mixing a NumPy x with a GPU array out is an error, caught before any GPU work."""
    call_fails(FUNCS[fname], TypeError,
               [f"{fname}()", f"out is a {kind} array", "x is a numpy array", "same kind"],
               np.zeros((3, 4)), out=out)


@pytest.mark.parametrize(
    "out",
    [[[0.0] * 4] * 3, ((0.0,) * 4,) * 3, 0.0, "out", memoryview(np.zeros((3, 4))),
     np.float64(0.0)],
    ids=lambda v: type(v).__name__,
)
def test_out_not_an_array(fname: str, out) -> None:
    info = call_fails(FUNCS[fname], TypeError,
                      [f"{fname}()", "out must be", "numpy.ndarray"], np.zeros((3, 4)), out=out)
    assert type(out).__name__ in str(info.value)


def test_out_read_only_is_left_unchanged(fname: str) -> None:
    out = sentinel_out()
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        FUNCS[fname](np.zeros((3, 4)), out=out)
    assert np.all(out == SENTINEL)


# --- precedence and no partial writes -----------------------------------------------------
def test_first_bad_argument_reported_and_out_untouched(fname: str) -> None:
    out = sentinel_out()
    # bad x wins over a bad axis
    call_fails(FUNCS[fname], TypeError, ["x", "int32"], np.zeros((3, 4), np.int32), out=out,
               axis=5)
    # bad axis with a good out: nothing written
    call_fails(FUNCS[fname], ValueError, ["axis 5"], np.zeros((3, 4)), out=out, axis=5)
    # bad dtype= with a good-looking out
    call_fails(FUNCS[fname], TypeError, ["dtype", "int8"], np.zeros((3, 4)), out=out,
               dtype=np.int8)


def test_error_leaves_x_unchanged_for_out_is_x(fname: str) -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    before = x.copy()
    call_fails(FUNCS[fname], ValueError, ["axis"], x, out=x, axis=(0, 0))
    call_fails(FUNCS[fname], TypeError, ["out", "float64", "expected float32"], x, out=x,
               dtype=np.float32)
    assert np.array_equal(x, before)


def test_good_call_after_errors_still_works(fname: str) -> None:
    x = np.array([[0.0, 0.0]])
    for bad in ({"axis": 3}, {"dtype": int}, {"out": np.zeros(3)}):
        with pytest.raises((TypeError, ValueError)):
            FUNCS[fname](x, **bad)
    y = FUNCS[fname](x)
    expected = [[-np.log(2)] * 2] if fname == "log_softmax" else [[0.5, 0.5]]
    np.testing.assert_allclose(y, expected, rtol=1e-15)


@pytest.mark.parametrize("fname", list(FUNCS))
def test_torch_tensor_refused_with_reason(fname: str, monkeypatch) -> None:
    """A CPU tensor names the NumPy route; a CUDA tensor without CuPy names the install."""
    with pytest.raises(TypeError, match=rf"{fname}\(\): x is a CPU torch.Tensor"):
        FUNCS[fname](TorchTensorStub(is_cuda=False))
    monkeypatch.setattr(_array, "_cupy", lambda: None)
    with pytest.raises(RuntimeError, match=rf"{fname}\(\): .*CuPy is not installed"):
        FUNCS[fname](TorchTensorStub(is_cuda=True))
