"""``cunorm.attention`` without a GPU: the NumPy reference path, every bad input, and the
plumbing of the CuPy path (views, copies, loops, outputs) driven with NumPy arrays.

Values are checked against a float64 formula written here, one query row at a time
(``math.fsum`` dot products and normalizer, the causal and boolean masks as explicit
conditions on ``(i, j)``, the key/value head of query head ``h`` as ``h // (Hq // Hkv)``), so
each output must be within one rounding to the dtype of the formula.

The CuPy path's plumbing (:mod:`cunorm._attention_layout`) is array-module agnostic: here it
runs on NumPy arrays with a stand-in launcher that checks the launcher contract on every
call (4-D views, dtypes, a unit-stride last axis, the mask and lse shapes) and computes with
the NumPy reference, so what is copied, what is looped over and what is written are tested
without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from _fakes import TorchTensorStub

import cunorm
from cunorm import _array, _attention_layout, _attention_ref

# the module, not the function cunorm.attention that shadows it as an attribute of cunorm
attention_mod = importlib.import_module("cunorm.attention")

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
DTYPE_IDS = [dt.name for dt in DTYPES]
#: DESIGN section 3: relative max-norm error per row against float64
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-12}
UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-52}
TINY = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 0.0}
EXPECTED_DTYPES = "float16, bfloat16, float32 or float64"
SENTINEL = -12345.0


# --- the independent formula ------------------------------------------------------------------
def formula(q, k, v, *, causal=False, scale=None, mask=None):
    """float64 ``(out, lse)`` one query row at a time. A float ``mask`` is used as given (in
    float64): pass it already in q's dtype."""
    hq, lq, d = q.shape[-3:]
    hkv, lk, dv = v.shape[-3:]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    qb = np.broadcast_to(np.asarray(q, np.float64), (*lead, hq, lq, d))
    kb = np.broadcast_to(np.asarray(k, np.float64), (*lead, hkv, lk, d))
    vb = np.broadcast_to(np.asarray(v, np.float64), (*lead, hkv, lk, dv))
    mb = None if mask is None else np.broadcast_to(mask, (*lead, hq, lq, lk))
    group = hq // hkv if hkv else 1
    out = np.zeros((*lead, hq, lq, dv))
    lse = np.full((*lead, hq, lq), -np.inf)
    for idx in np.ndindex(*lead):
        for h in range(hq):
            g = h // group
            for i in range(lq):
                scores, rows = [], []
                for j in range(lk):
                    if causal and j > i + lk - lq:
                        continue
                    s = math.fsum(qb[idx][h, i] * kb[idx][g, j]) * scale
                    if mb is not None:
                        mval = mb[idx][h, i, j]
                        if mb.dtype == np.bool_:
                            if not mval:
                                continue
                        else:
                            s += float(mval)
                    scores.append(s)
                    rows.append(vb[idx][g, j])
                if not scores or max(scores) == -math.inf:
                    continue  # every key masked: 0 and -inf
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                total = math.fsum(w)
                for c in range(dv):
                    out[idx][h, i, c] = math.fsum(wj * r[c] for wj, r in zip(w, rows,
                                                                             strict=True)) / total
                lse[idx][h, i] = m + math.log(total)
    return out, lse


def assert_close_rows(y, ref: np.ndarray, dtype_name: str, slop: float = 1e-13) -> None:
    """DESIGN's bound (relative max-norm per row) and one rounding per element (plus the
    subnormal spacing and ``slop`` times the row's scale for float64's own error); rows whose
    reference is exactly 0 (fully masked) must be exactly 0."""
    y64 = np.asarray(y, dtype=np.float64)
    assert y64.shape == ref.shape, (y64.shape, ref.shape)
    assert np.isfinite(y64).all()
    err = np.abs(y64 - ref)
    scale = np.max(np.abs(ref), axis=-1, keepdims=True, initial=0.0)
    rel = np.max(err, axis=-1, keepdims=True, initial=0.0) / np.where(scale > 0, scale, 1.0)
    assert rel.max(initial=0.0) <= TOL[dtype_name], f"row error {rel.max()} > {TOL[dtype_name]}"
    bound = 1.01 * UNIT[dtype_name] * np.abs(ref) + TINY[dtype_name] + slop * scale
    assert np.max(err - bound, initial=-1.0) <= 0, "an element is off by more than one rounding"
    zero_rows = np.all(ref == 0, axis=-1)
    assert np.all(y64[zero_rows] == 0)


def assert_lse_close(lse, ref: np.ndarray) -> None:
    assert type(lse) is np.ndarray and lse.dtype == np.float32 and lse.shape == ref.shape
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(lse[finite].astype(np.float64), ref[finite], rtol=1.01 * 2**-24,
                               atol=1e-12)


def randn(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def make_mask(rng, kind: str | None, shape, dtype, full_rows: tuple = ()):
    """None, a bool mask (True keeps) or an additive one (N(0, 1/2) with some -inf), of
    ``shape``; the rows ``full_rows`` (indices into all but the last axis) fully masked."""
    if kind is None:
        return None
    keep = rng.random(shape) > 0.3
    for r in full_rows:
        keep[r] = False
    if kind == "bool":
        return keep
    add = (0.5 * rng.standard_normal(shape)).astype(dtype)
    return np.where(keep, add, np.array(-np.inf, dtype)).astype(dtype)


# --- values against the formula ---------------------------------------------------------------
#: (q shape, k shape, v shape, causal, mask kind, mask shape) - small, covering GQA, Lq != Lk
#: both ways, Lq = 1, Lk = 1, Dv != D, broadcast leading dims and broadcast masks
CASES = [
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), False, None, None),
    ((2, 4, 6, 8), (2, 1, 6, 8), (2, 1, 6, 4), True, None, None),  # MQA, Dv != D
    ((8, 9, 16), (2, 13, 16), (2, 13, 16), True, "bool", (9, 13)),  # GQA 4, Lq < Lk
    ((1, 4, 11, 8), (1, 2, 5, 8), (1, 2, 5, 8), True, "additive", (1, 4, 11, 5)),  # Lq > Lk
    ((2, 1, 2, 1, 8), (3, 2, 4, 8), (1, 3, 2, 4, 6), False, "additive", (4,)),  # leads broadcast
    ((3, 2, 1, 8), (2, 9, 8), (2, 9, 8), True, "bool", (3, 1, 1, 9)),  # decoding, Lq = 1
    ((2, 2, 4, 8), (2, 2, 1, 8), (2, 2, 1, 8), False, None, None),  # Lk = 1
    ((2, 6, 8), (2, 6, 8), (2, 6, 8), False, "bool", (2, 6, 6)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("qs", "ks", "vs", "causal", "mkind", "mshape"), CASES, ids=str)
def test_matches_formula(rng, dtype, qs, ks, vs, causal, mkind, mshape) -> None:
    q, k, v = randn(rng, qs, dtype), randn(rng, ks, dtype), randn(rng, vs, dtype)
    mask = make_mask(rng, mkind, mshape, dtype)
    before = [a.copy() for a in (q, k, v)]
    out, lse = cunorm.attention(q, k, v, causal=causal, mask=mask, return_lse=True)
    ref, ref_lse = formula(q, k, v, causal=causal, mask=mask)
    assert type(out) is np.ndarray and out.dtype == dtype and out.shape == ref.shape
    assert_close_rows(out, ref, dtype.name)
    assert_lse_close(lse, ref_lse)
    for a, b in zip((q, k, v), before, strict=True):
        assert a.tobytes() == b.tobytes()  # inputs untouched
    same = cunorm.attention(q, k, v, causal=causal, mask=mask)
    assert same.tobytes() == out.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gqa_is_repeated_key_value_heads(rng, dtype) -> None:
    q = randn(rng, (2, 8, 5, 8), dtype)
    k, v = randn(rng, (2, 2, 7, 8), dtype), randn(rng, (2, 2, 7, 8), dtype)
    gqa = cunorm.attention(q, k, v)
    rep = cunorm.attention(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1))
    np.testing.assert_allclose(gqa.astype(np.float64), rep.astype(np.float64),
                               rtol=UNIT[dtype.name] * 2, atol=0)


@pytest.mark.parametrize(("lq", "lk"), [(1, 9), (4, 9), (9, 9), (12, 9), (9, 1), (3, 1)],
                         ids=str)
def test_causal_is_the_bottom_right_mask(rng, lq, lk) -> None:
    q, k, v = randn(rng, (2, lq, 8), np.float64), randn(rng, (2, lk, 8), np.float64), \
        randn(rng, (2, lk, 8), np.float64)
    tri = np.tril(np.ones((lq, lk), bool), k=lk - lq)
    out, lse = cunorm.attention(q, k, v, causal=True, return_lse=True)
    out_m, lse_m = cunorm.attention(q, k, v, mask=tri, return_lse=True)
    assert out.tobytes() == out_m.tobytes() and lse.tobytes() == lse_m.tobytes()
    # the last query sees every key; with Lq > Lk the first Lq - Lk queries see none
    np.testing.assert_allclose(out[:, -1], cunorm.attention(q[:, -1:], k, v)[:, 0], rtol=1e-13,
                               atol=1e-14)
    blind = max(lq - lk, 0)
    assert np.all(out[:, :blind] == 0) and np.all(np.isneginf(lse[:, :blind]))
    assert np.isfinite(lse[:, blind:]).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bool_mask_equals_additive_zero_or_minus_inf(rng, dtype) -> None:
    q, k, v = randn(rng, (3, 6, 8), dtype), randn(rng, (3, 10, 8), dtype), \
        randn(rng, (3, 10, 8), dtype)
    keep = rng.random((3, 6, 10)) > 0.4
    keep[1, 2] = False
    add = np.where(keep, 0.0, -np.inf).astype(dtype)
    a, la = cunorm.attention(q, k, v, mask=keep, return_lse=True, causal=True)
    b, lb = cunorm.attention(q, k, v, mask=add, return_lse=True, causal=True)
    assert a.tobytes() == b.tobytes() and la.tobytes() == lb.tobytes()
    assert np.all(a[1, 2] == 0) and np.isneginf(la[1, 2])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mdtype", DTYPES, ids=DTYPE_IDS)
def test_float_mask_is_cast_to_q_dtype_first(rng, dtype, mdtype) -> None:
    q, k, v = randn(rng, (2, 4, 8), dtype), randn(rng, (2, 5, 8), dtype), \
        randn(rng, (2, 5, 8), dtype)
    mask = (rng.standard_normal((4, 5)) * 1.7).astype(mdtype)
    mask[0, 1] = -np.inf
    got = cunorm.attention(q, k, v, mask=mask)
    want = cunorm.attention(q, k, v, mask=mask.astype(dtype))
    assert got.tobytes() == want.tobytes()
    ref, _ = formula(q, k, v, mask=mask.astype(dtype))
    assert_close_rows(got, ref, dtype.name)


def test_huge_additive_mask_rounds_to_minus_inf_in_float16(rng) -> None:
    q, k, v = randn(rng, (1, 3, 8), np.float16), randn(rng, (1, 4, 8), np.float16), \
        randn(rng, (1, 4, 8), np.float16)
    mask = np.zeros((3, 4))
    mask[:, :2] = -1e30  # the usual "large negative" float32 mask: -inf once in float16
    mask[2] = -1e30
    out, lse = cunorm.attention(q, k, v, mask=mask, return_lse=True)
    np.testing.assert_array_equal(out, cunorm.attention(q[:, :, :], k[:, 2:], v[:, 2:])
                                  * np.array([1, 1, 0], np.float16)[:, None])
    assert np.isneginf(lse[0, 2]) and np.all(out[0, 2] == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("how", ["bool", "additive", "causal", "no_keys_left"])
def test_fully_masked_rows(rng, dtype, how) -> None:
    q, k, v = randn(rng, (2, 3, 6, 8), dtype), randn(rng, (2, 3, 4, 8), dtype), \
        randn(rng, (2, 3, 4, 8), dtype)
    full = [(0, 1, 2), (1, 2, 0), (1, 0, 5)]
    mask, causal = None, False
    if how in ("bool", "additive"):
        mask = make_mask(rng, how, (2, 3, 6, 4), dtype, full_rows=tuple(full))
    elif how == "causal":
        causal = True  # Lq = 6 > Lk = 4: queries 0 and 1 see no key
        full = [(b, h, i) for b in range(2) for h in range(3) for i in range(2)]
    else:
        mask = np.zeros((2, 3, 6, 4), bool)
        mask[..., 3:, :] = True
        full = [(b, h, i) for b in range(2) for h in range(3) for i in range(3)]
    out, lse = cunorm.attention(q, k, v, mask=mask, causal=causal, return_lse=True)
    for r in full:
        assert np.all(out[r] == 0) and np.isneginf(lse[r]), r
    ref, ref_lse = formula(q, k, v, mask=mask, causal=causal)
    assert_close_rows(out, ref, dtype.name)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_one_key_returns_its_value_exactly(rng, dtype) -> None:
    q, k, v = randn(rng, (2, 4, 5, 8), dtype), randn(rng, (2, 4, 1, 8), dtype), \
        randn(rng, (2, 4, 1, 3), dtype)
    out, lse = cunorm.attention(q, k, v, return_lse=True)
    assert np.array_equal(out, np.broadcast_to(v, out.shape))
    scores = np.einsum("bhid,bhjd->bhi", q.astype(np.float64), k.astype(np.float64)) / 8**0.5
    np.testing.assert_allclose(lse, scores, rtol=2**-23, atol=1e-12)
    # causal with Lq > Lk = 1: only the last query sees the key
    out = cunorm.attention(q, k, v, causal=True)
    assert np.all(out[:, :, :4] == 0) and np.array_equal(out[:, :, 4], v[:, :, 0])


def test_known_values() -> None:
    q = np.array([[[1.0, 0.0]]])
    k = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    v = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    p = math.e / (math.e + 1)
    out, lse = cunorm.attention(q, k, v, scale=1.0, return_lse=True)
    np.testing.assert_allclose(out, [[[p + 3 * (1 - p), 2 * p + 4 * (1 - p)]]], rtol=1e-15)
    np.testing.assert_allclose(lse, [[math.log(math.e + 1)]], rtol=1e-7)


@pytest.mark.parametrize("scale", [None, 0.25, 1, 0, -0.5, np.float32(0.3), np.float64(2.0),
                                   np.int64(1), 3.0], ids=repr)
def test_scale(rng, scale) -> None:
    q, k, v = randn(rng, (2, 3, 16), np.float32), randn(rng, (2, 5, 16), np.float32), \
        randn(rng, (2, 5, 16), np.float32)
    out = cunorm.attention(q, k, v, scale=scale)
    ref, _ = formula(q, k, v, scale=None if scale is None else float(scale))
    assert_close_rows(out, ref, "float32")
    if scale is None:
        assert out.tobytes() == cunorm.attention(q, k, v, scale=0.25).tobytes()
    if scale == 0:  # uniform weights: the mean of the values
        np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=1, keepdims=True), out.shape),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("flag", [True, False, np.True_, np.False_], ids=repr)
def test_flags_accept_numpy_bool(rng, flag) -> None:
    q = randn(rng, (1, 3, 4), np.float32)
    res = cunorm.attention(q, q, q, causal=flag, return_lse=flag)
    assert isinstance(res, tuple) if flag else isinstance(res, np.ndarray)


def test_leading_dims_broadcast(rng) -> None:
    q = randn(rng, (2, 1, 4, 3, 8), np.float32)
    k = randn(rng, (3, 2, 5, 8), np.float32)
    v = randn(rng, (1, 3, 2, 5, 6), np.float32)
    mask = rng.random((3, 1, 1, 5)) > 0.2
    out, lse = cunorm.attention(q, k, v, mask=mask, return_lse=True)
    assert out.shape == (2, 3, 4, 3, 6) and lse.shape == (2, 3, 4, 3)
    shape = (2, 3)
    full = [np.broadcast_to(a, shape + a.shape[-3:]) for a in (q, k, v)]
    out2 = cunorm.attention(*full, mask=np.broadcast_to(mask, (2, 3, 4, 3, 5)))
    assert out.tobytes() == out2.tobytes()
    ref, _ = formula(q, k, v, mask=mask)
    assert_close_rows(out, ref, "float32")


@pytest.mark.parametrize("view", ["blhd_transposed", "strided_last", "negative", "broadcast"])
def test_non_contiguous_inputs(rng, view) -> None:
    base = {n: randn(rng, (2, 7, 4, 16), np.float32) for n in "qkv"}  # (B, L, H, D)
    if view == "blhd_transposed":
        q, k, v = (base[n].transpose(0, 2, 1, 3) for n in "qkv")
    elif view == "strided_last":
        q, k, v = (base[n].transpose(0, 2, 1, 3)[..., ::2] for n in "qkv")
    elif view == "negative":
        q, k, v = (base[n].transpose(0, 2, 1, 3)[:, ::-1, ::-1] for n in "qkv")
    else:
        q = base["q"].transpose(0, 2, 1, 3)
        k, v = (np.broadcast_to(base[n][:1].transpose(0, 2, 1, 3), (2, 4, 7, 16)) for n in "kv")
    got = cunorm.attention(q, k, v, causal=True)
    want = cunorm.attention(*(np.ascontiguousarray(a) for a in (q, k, v)), causal=True)
    np.testing.assert_allclose(got, want, rtol=2**-22, atol=0)
    assert_close_rows(got, formula(q, k, v, causal=True)[0], "float32")


# --- empty results ----------------------------------------------------------------------------
@pytest.mark.parametrize(("qs", "ks", "vs"), [
    ((0, 2, 3, 8), (0, 2, 4, 8), (0, 2, 4, 8)),   # no batch
    ((2, 0, 3, 8), (2, 0, 4, 8), (2, 0, 4, 8)),   # no heads
    ((2, 0, 3, 8), (2, 2, 4, 8), (2, 2, 4, 8)),   # no query heads (0 % 2 == 0)
    ((2, 2, 0, 8), (2, 2, 4, 8), (2, 2, 4, 8)),   # no queries
    ((2, 2, 3, 8), (2, 2, 4, 8), (2, 2, 4, 0)),   # Dv = 0
    ((2, 2, 3, 8), (2, 2, 0, 8), (2, 2, 0, 5)),   # no keys: zeros, lse -inf
    ((0, 2, 3, 8), (2, 4, 8), (2, 4, 8)),         # empty broadcast leading dim
], ids=str)
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), np.dtype(np.float64)], ids=str)
def test_empty(rng, qs, ks, vs, dtype) -> None:
    q, k, v = randn(rng, qs, dtype), randn(rng, ks, dtype), randn(rng, vs, dtype)
    out, lse = cunorm.attention(q, k, v, causal=True, return_lse=True)
    lead = np.broadcast_shapes(qs[:-3], ks[:-3], vs[:-3])
    assert out.shape == (*lead, qs[-3], qs[-2], vs[-1]) and out.dtype == dtype
    assert lse.shape == (*lead, qs[-3], qs[-2]) and lse.dtype == np.float32
    if ks[-2] == 0:
        assert np.all(out == 0) and np.all(np.isneginf(lse))
    if vs[-1] == 0 and lse.size:  # no output columns, but the log-sum-exp is still computed
        _, lse1 = cunorm.attention(q, k, randn(rng, vs[:-1] + (1,), dtype), causal=True,
                                   return_lse=True)
        assert lse.tobytes() == lse1.tobytes()
    o = np.full(out.shape, SENTINEL, dtype)
    assert cunorm.attention(q, k, v, out=o) is o
    if ks[-2] == 0:
        assert np.all(o == 0)


# --- out= --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out(rng, dtype) -> None:
    q, k, v = randn(rng, (2, 4, 5, 8), dtype), randn(rng, (2, 2, 6, 8), dtype), \
        randn(rng, (2, 2, 6, 3), dtype)
    want, want_lse = cunorm.attention(q, k, v, causal=True, return_lse=True)
    out = np.full((2, 4, 5, 3), SENTINEL, dtype)
    assert cunorm.attention(q, k, v, causal=True, out=out) is out
    assert out.tobytes() == want.tobytes()
    out[...] = SENTINEL
    res, lse = cunorm.attention(q, k, v, causal=True, out=out, return_lse=True)
    assert res is out and out.tobytes() == want.tobytes() and lse.tobytes() == want_lse.tobytes()
    # a strided view (a (B, L, H, Dv) buffer seen as (B, H, L, Dv)) writes only the view
    buf = np.full((2, 5, 4, 6), SENTINEL, dtype)
    before = buf.copy()
    view = buf.transpose(0, 2, 1, 3)[..., ::2]
    assert cunorm.attention(q, k, v, causal=True, out=view) is view
    assert view.tobytes() == want.tobytes()
    assert buf[..., 1::2].tobytes() == before[..., 1::2].tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_is_q(rng, dtype) -> None:
    q, k, v = randn(rng, (3, 5, 8), dtype), randn(rng, (3, 7, 8), dtype), \
        randn(rng, (3, 7, 8), dtype)
    want = cunorm.attention(q, k, v)
    assert cunorm.attention(q, k, v, out=q) is q
    assert q.tobytes() == want.tobytes()


# --- bad input ----------------------------------------------------------------------------------
Q = np.linspace(-1, 1, 2 * 4 * 3 * 8, dtype=np.float32).reshape(2, 4, 3, 8)
K = np.linspace(1, -1, 2 * 2 * 5 * 8, dtype=np.float32).reshape(2, 2, 5, 8)
V = np.linspace(-2, 2, 2 * 2 * 5 * 6, dtype=np.float32).reshape(2, 2, 5, 6)
OUT_SHAPE = (2, 4, 3, 6)


def sentinel_out(shape=OUT_SHAPE, dtype=np.float32) -> np.ndarray:
    return np.full(shape, SENTINEL, dtype)


def call_fails(exc: type[Exception], parts: list[str], q=Q, k=K, v=V, out=None,
               **kwargs) -> pytest.ExceptionInfo:
    """``cunorm.attention(q, k, v, out=out, **kwargs)`` must raise ``exc`` with a message that
    starts with ``attention()`` and holds every part; ``out`` (default: a sentinel of the right
    shape) and the inputs must come back unchanged."""
    out = sentinel_out() if out is None else out
    arrays = [a for a in (q, k, v, out, kwargs.get("mask")) if isinstance(a, np.ndarray)]
    before = [a.tobytes() for a in arrays]
    with pytest.raises(exc) as info:
        cunorm.attention(q, k, v, out=out, **kwargs)
    msg = str(info.value)
    assert msg.startswith("attention()"), msg
    for part in parts:
        assert part in msg, f"{part!r} not in message {msg!r}"
    assert [a.tobytes() for a in arrays] == before, "a failed call wrote into an array"
    return info


class _FakeDLPack:
    shape = (2, 2, 5, 8)
    dtype = np.dtype(np.float32)
    ndim = 4

    def __dlpack__(self, *args, **kwargs):  # pragma: no cover - never called
        raise AssertionError("a bad call must not touch a GPU array")


class FakeCupyArray(_FakeDLPack):
    pass


class FakeTorchTensor(_FakeDLPack):
    is_cuda = True


class FakeJaxArray(_FakeDLPack):
    pass


FakeCupyArray.__module__ = "cupy._core.core"
FakeTorchTensor.__module__ = "torch"
FakeJaxArray.__module__ = "jaxlib.xla_extension"
FAKES = [(FakeCupyArray, "cupy"), (FakeTorchTensor, "torch"), (FakeJaxArray, "jax")]
NOT_ARRAYS = [[1.0, 2.0], (1.0,), 1.0, 3, "abc", np.float32(2.0), memoryview(b"abcd")]


@pytest.mark.parametrize("arg", ["q", "k", "v", "mask", "out"])
@pytest.mark.parametrize("bad", NOT_ARRAYS, ids=lambda b: type(b).__name__)
def test_not_an_array(arg, bad) -> None:
    kwargs = {"q": Q, "k": K, "v": V, arg: bad}
    if arg == "out":
        with pytest.raises(TypeError, match=r"^attention\(\): out must be a numpy.ndarray"):
            cunorm.attention(Q, K, V, out=bad)
        return
    info = call_fails(TypeError, [f"{arg} must be a numpy.ndarray", "cupy.ndarray",
                                  "torch.Tensor", "jax.Array", type(bad).__name__], **kwargs)
    assert type(bad).__name__ in str(info.value)


@pytest.mark.parametrize("arg", ["k", "v", "mask", "out"])
@pytest.mark.parametrize(("fake", "kind"), FAKES, ids=[k for _, k in FAKES])
def test_other_array_kind(arg, fake, kind) -> None:
    kwargs = {arg: fake()}
    if arg == "out":
        with pytest.raises(TypeError, match=rf"^attention\(\): out is a {kind} array but q is a "
                                            "numpy array; they must be the same kind"):
            cunorm.attention(Q, K, V, **kwargs)
        return
    call_fails(TypeError, [f"{arg} is a {kind} array but q is a numpy array",
                           "same kind"], **kwargs)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.bool_, np.complex64,
                                   np.complex128, object, "U3"], ids=lambda d: np.dtype(d).name)
def test_q_wrong_dtype(dtype) -> None:
    call_fails(TypeError, [f"q has dtype {np.dtype(dtype).name}", EXPECTED_DTYPES],
               q=np.zeros(Q.shape, dtype), k=K.astype(dtype), v=V.astype(dtype))


@pytest.mark.parametrize("arg", ["k", "v"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16, BF16, np.int32, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_k_v_dtype_differs_from_q(arg, dtype) -> None:
    kwargs = {arg: (K if arg == "k" else V).astype(dtype)}
    call_fails(TypeError, [f"{arg} has dtype {np.dtype(dtype).name}",
                           "expected float32 (the dtype of q)"], **kwargs)


@pytest.mark.parametrize("arg", ["q", "k", "v"])
@pytest.mark.parametrize("shape", [(), (8,), (3, 8)], ids=str)
def test_fewer_than_3_dims(arg, shape) -> None:
    kwargs = {arg: np.zeros(shape, np.float32)}
    dims = {"q": "(..., Hq, Lq, D)", "k": "(..., Hkv, Lk, D)", "v": "(..., Hkv, Lk, Dv)"}[arg]
    call_fails(ValueError, [f"{arg} must have at least 3 dimensions {dims}",
                            f"got shape {shape}"], **kwargs)


@pytest.mark.parametrize(("kwargs", "parts"), [
    ({"k": np.zeros((2, 2, 5, 7), np.float32)},
     ["k has head dim 7 (k.shape[-1]); expected 8, the head dim of q"]),
    ({"q": np.zeros((2, 4, 3, 6), np.float32)},
     ["k has head dim 8 (k.shape[-1]); expected 6, the head dim of q"]),
    ({"v": np.zeros((2, 2, 4, 6), np.float32)},
     ["v has 4 keys (v.shape[-2]); expected 5, the keys of k (k.shape[-2])"]),
    ({"v": np.zeros((2, 1, 5, 6), np.float32)},
     ["v has 1 heads (v.shape[-3]); expected 2, the heads of k (k.shape[-3])"]),
    ({"k": np.zeros((2, 3, 5, 8), np.float32), "v": np.zeros((2, 3, 5, 6), np.float32)},
     ["q has 4 heads, not a multiple of the 3 heads of k and v", "Hq % Hkv == 0"]),
    ({"k": np.zeros((2, 0, 5, 8), np.float32), "v": np.zeros((2, 0, 5, 6), np.float32)},
     ["q has 4 heads, not a multiple of the 0 heads of k and v"]),
    ({"q": np.zeros((2, 4, 3, 0), np.float32), "k": np.zeros((2, 2, 5, 0), np.float32)},
     ["q and k have head dim 0 (shape[-1]); expected 1 to 256"]),
    ({"q": np.zeros((1, 1, 1, 257), np.float32), "k": np.zeros((1, 1, 1, 257), np.float32),
      "v": np.zeros((1, 1, 1, 6), np.float32)},
     ["q and k have head dim 257 (shape[-1]); expected 1 to 256"]),
    ({"v": np.zeros((2, 2, 5, 300), np.float32)},
     ["v has head dim 300 (v.shape[-1]); expected at most 256"]),
    ({"k": np.zeros((3, 2, 5, 8), np.float32), "v": np.zeros((3, 2, 5, 6), np.float32)},
     ["the leading dimensions of q (2,), k (3,) and v (3,) do not broadcast together"]),
    ({"v": np.zeros((4, 3, 2, 5, 6), np.float32)},
     ["the leading dimensions of q (2,), k (2,) and v (4, 3) do not broadcast"]),
], ids=lambda v: "-".join(v) if isinstance(v, dict) else None)
def test_shape_mismatch(kwargs, parts) -> None:
    out = sentinel_out((1,))  # the shape error comes first
    call_fails(ValueError, parts, out=out, **kwargs)


def test_out_shape_follows_broadcast_leading_dims() -> None:
    call_fails(ValueError, ["out has shape (4, 3, 6); expected (2, 4, 3, 6)"],
               out=sentinel_out((4, 3, 6)))
    call_fails(ValueError, ["out has shape (2, 4, 3, 8); expected (2, 4, 3, 6)"],
               out=sentinel_out((2, 4, 3, 8)))
    q3 = Q[0]  # (Hq, Lq, D) with (B, Hkv, Lk, D) keys: the result has B
    out = sentinel_out()
    assert cunorm.attention(q3, K, V, out=out) is out


@pytest.mark.parametrize(("x_dtype", "out_dtype"), [(np.float32, np.float64),
                                                    (np.float16, BF16), (np.float32, np.int32)],
                         ids=str)
def test_out_wrong_dtype(x_dtype, out_dtype) -> None:
    call_fails(TypeError, [f"out has dtype {np.dtype(out_dtype).name}",
                           f"expected {np.dtype(x_dtype).name}"], q=Q.astype(x_dtype),
               k=K.astype(x_dtype), v=V.astype(x_dtype), out=sentinel_out(dtype=out_dtype))


def test_out_read_only() -> None:
    out = sentinel_out()
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cunorm.attention(Q, K, V, out=out)
    assert np.all(out == SENTINEL)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.complex64, object],
                         ids=lambda d: np.dtype(d).name)
def test_mask_wrong_dtype(dtype) -> None:
    call_fails(TypeError, [f"mask has dtype {np.dtype(dtype).name}", "expected bool",
                           "or float16, bfloat16, float32 or float64"],
               mask=np.zeros((3, 5), dtype))


@pytest.mark.parametrize("shape", [(4,), (3, 4), (5, 3), (3, 3, 5), (3, 2, 3, 5),
                                   (1, 2, 4, 3, 5), (2, 2, 4, 3, 5)], ids=str)
def test_mask_does_not_broadcast(shape) -> None:
    call_fails(ValueError, [f"mask has shape {shape}",
                            "expected a shape that broadcasts to (2, 4, 3, 5) (..., Hq, Lq, Lk)"],
               mask=np.ones(shape, bool))


@pytest.mark.parametrize("shape", [(), (5,), (3, 1), (4, 3, 5), (2, 1, 1, 5), (1, 1, 1, 1)],
                         ids=str)
def test_mask_broadcasts(rng, shape) -> None:
    mask = np.asarray(rng.random(shape) > 0.3)
    got = cunorm.attention(Q, K, V, mask=mask)
    want = cunorm.attention(Q, K, V, mask=np.broadcast_to(mask, (2, 4, 3, 5)).copy())
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("arg", ["causal", "return_lse"])
@pytest.mark.parametrize("flag", [1, 0, "yes", None, 1.0, np.int64(1), [True]], ids=repr)
def test_flag_not_a_bool(arg, flag) -> None:
    call_fails(TypeError, [f"{arg} must be a bool", repr(flag)[:4]], **{arg: flag})


@pytest.mark.parametrize("scale", [True, np.True_, "0.5", 1j, [0.5], b"1", np.array(0.5)],
                         ids=repr)
def test_scale_not_a_real_number(scale) -> None:
    call_fails(TypeError, ["scale must be a real number or None"], scale=scale)


@pytest.mark.parametrize("scale", [np.nan, np.inf, -np.inf, np.float32(np.inf), 10**400],
                         ids=repr)
def test_scale_not_finite(scale) -> None:
    call_fails(ValueError, ["scale must be finite"], scale=scale)


def test_keyword_only_arguments() -> None:
    with pytest.raises(TypeError, match="positional"):
        cunorm.attention(Q, K, V, True)  # causal is keyword-only


def test_every_failed_call_leaves_out_untouched() -> None:
    """One out through a sequence of bad calls (one bad argument each), then a good call."""
    out = sentinel_out()
    bad_calls: list[tuple[type[Exception], dict]] = [
        (TypeError, {"q": Q.astype(np.int32)}),
        (TypeError, {"k": K.astype(np.float64)}),
        (ValueError, {"v": V[:, :, :4]}),
        (ValueError, {"k": K[..., :7]}),
        (ValueError, {"mask": np.ones((3, 4), bool)}),
        (TypeError, {"mask": np.ones((3, 5), np.int32)}),
        (TypeError, {"causal": 1}),
        (ValueError, {"scale": np.nan}),
        (TypeError, {"return_lse": "no"}),
    ]
    for exc, bad in bad_calls:
        args = {"q": Q, "k": K, "v": V, "mask": np.ones((3, 5), bool), "causal": True,
                "return_lse": True, **bad}
        with pytest.raises(exc, match=r"^attention\(\)"):
            cunorm.attention(args.pop("q"), args.pop("k"), args.pop("v"), out=out, **args)
        assert np.all(out == SENTINEL), f"{bad} wrote into out"
    res, lse = cunorm.attention(Q, K, V, out=out, causal=True, return_lse=True)
    assert res is out and np.isfinite(out).all() and lse.shape == (2, 4, 3)


# --- frameworks (without their GPU) ---------------------------------------------------------
def test_torch_refused_with_reason(monkeypatch) -> None:
    cpu, gpu = TorchTensorStub(False), TorchTensorStub(True)
    with pytest.raises(TypeError, match=r"^attention\(\): q is a CPU torch.Tensor.*q.numpy\(\)"):
        cunorm.attention(cpu, cpu, cpu)
    with pytest.raises(TypeError, match=r"attention\(\): k is a numpy array but q is a torch"):
        cunorm.attention(gpu, K, V)
    with pytest.raises(TypeError, match="out= is not supported for jax.Array"):
        cunorm.attention(FakeJaxArray(), FakeJaxArray(), FakeJaxArray(), out=FakeJaxArray())
    monkeypatch.setattr(_array, "framework_stream",
                        lambda *args, **kwargs: contextlib.nullcontext())
    with pytest.raises(TypeError, match=r"^attention\(\): v is a CPU torch.Tensor but q is a "
                                        "CUDA tensor"):
        cunorm.attention(gpu, gpu, cpu)
    monkeypatch.undo()
    monkeypatch.setattr(_array, "_cupy", lambda: None)
    with pytest.raises(RuntimeError, match=r"^attention\(\): q is a CUDA torch.Tensor but CuPy "
                                           "is not installed"):
        cunorm.attention(gpu, gpu, gpu)


def test_jax_cpu_arrays_refused() -> None:
    jnp = pytest.importorskip("jax.numpy")
    q = jnp.zeros((1, 2, 4), jnp.float32)
    with pytest.raises(TypeError, match=r"^attention\(\): q is a jax.Array on cpu"):
        cunorm.attention(q, q, q)
    with pytest.raises(TypeError, match=r"^attention\(\): mask is a numpy array but q is a jax"):
        cunorm.attention(q, q, q, mask=np.ones(2, bool))
    with pytest.raises(TypeError, match="JAX arrays are immutable"):
        cunorm.attention(q, q, q, out=q)


# --- the CuPy path's plumbing, on NumPy arrays ---------------------------------------------------
class FakeLauncher:
    """Stands in for ``_attn_launch.launch_attention``: checks its contract on every call,
    records what it was given and computes with the NumPy reference."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, q, k, v, out, *, causal, scale, mask=None, lse=None) -> None:
        for name, a in (("q", q), ("k", k), ("v", v), ("out", out)):
            assert a.ndim == 4, name
            assert a.dtype == q.dtype, name
            es = _array.element_strides(a)
            assert es is not None and es[-1] == 1, (name, a.strides)
        b, hq, lq, d = q.shape
        _, hkv, lk, _ = k.shape
        dv = v.shape[-1]
        assert k.shape == (b, hkv, lk, d) and v.shape == (b, hkv, lk, dv)
        assert out.shape == (b, hq, lq, dv) and hq % hkv == 0
        assert lq >= 1 and lk >= 1 and 1 <= d <= 256 and 1 <= dv <= 256
        assert isinstance(causal, bool) and isinstance(scale, float)
        if mask is not None:
            assert mask.shape == (b, hq, lq, lk) and mask.dtype in (np.bool_, q.dtype)
            assert _array.element_strides(mask) is not None
        if lse is not None:
            assert lse.shape == (b, hq, lq) and lse.dtype == np.float32
        self.calls.append({"q": q, "k": k, "v": v, "out": out, "mask": mask, "lse": lse})
        o, ls = _attention_ref.reference(q, k, v, causal=causal, scale=scale, mask=mask)
        out[...] = o
        if lse is not None:
            lse[...] = ls


def run_layout(q, k, v, *, causal=False, scale=None, mask=None, return_lse=False, out=None,
               launch: Callable | None = None):
    """The CuPy path with NumPy arrays: ``((out, lse), launcher)``."""
    launch = FakeLauncher() if launch is None else launch
    call = attention_mod._validate("numpy", q, k, v, causal, scale, mask, return_lse, out)
    res = _attention_layout.run(call, q, k, v, mask, out, np, launch)
    return res, launch


def never(*args, **kwargs):  # pragma: no cover - a failure if reached
    raise AssertionError("the launcher must not be called")


@pytest.mark.parametrize(("lead", "strides", "expected"), [
    ((), ((), ()), (0, (0, 0))),
    ((4,), ((96,), (0,)), (0, (96, 0))),
    ((2, 3), ((3 * 64, 64), (3 * 32, 32)), (0, (64, 32))),       # contiguous
    ((2, 3), ((64, 128), (3 * 64, 64)), (1, (128, 64))),         # first tensor's dims swapped
    ((2, 3), ((3 * 64, 64), (0, 0)), (0, (64, 0))),              # one broadcast over both
    ((2, 3), ((3 * 64, 64), (64, 0)), (1, (64, 0))),             # broadcast over the last only
    ((2, 3), ((3 * 64, 64), (0, 64)), (1, (64, 64))),            # broadcast over the first only
    ((2, 1, 3), ((3 * 64, 5, 64), (3 * 8, 999, 8)), (0, (64, 8))),  # size-1 dims ignored
    ((1, 5), ((7, 100), (0, 3)), (0, (100, 3))),
    ((2, 3, 4), ((2 * 12 * 10, 20, 5), (0, 0, 0)), (1, (5, 0))),  # gap between dims 0 and 1
    ((2, 3, 4), ((-12, -4, -1), (12, 4, 1)), (0, (-1, 1))),      # negative strides
    ((2, 1), ((5, 5), (0, 0)), (0, (5, 0))),
], ids=str)
def test_batch_layout(lead, strides, expected) -> None:
    assert _attention_layout.batch_layout(lead, strides) == expected


def _owner(a) -> np.ndarray:
    """The array that owns ``a``'s memory (through views and as_strided)."""
    while getattr(a, "base", None) is not None:
        a = a.base
    assert isinstance(a, np.ndarray)
    return a


def test_layout_contiguous_is_one_launch_without_copies(rng) -> None:
    q, k, v = randn(rng, (2, 8, 5, 16), np.float16), randn(rng, (2, 2, 7, 16), np.float16), \
        randn(rng, (2, 2, 7, 8), np.float16)
    (out, lse), launch = run_layout(q, k, v, causal=True, return_lse=True)
    assert len(launch.calls) == 1
    c = launch.calls[0]
    for name, a in (("q", q), ("k", k), ("v", v)):
        assert np.shares_memory(c[name], a) and c[name].shape == a.shape, name
    assert c["k"].shape[1] == 2  # GQA: the key/value heads, not repeated
    assert np.shares_memory(c["out"], out) and np.shares_memory(c["lse"], lse)
    assert c["mask"] is None
    assert_close_rows(out, formula(q, k, v, causal=True)[0], "float16")
    assert_lse_close(lse, formula(q, k, v, causal=True)[1])


def test_layout_transposed_blhd_views_are_not_copied(rng) -> None:
    bq, bk, bv = (randn(rng, (3, L, 4, 16), np.float32) for L in (5, 9, 9))  # (B, L, H, D)
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (bq, bk, bv))
    obuf = np.full((3, 5, 4, 16), np.nan, np.float32)
    out = obuf.transpose(0, 2, 1, 3)
    (res, _), launch = run_layout(q, k, v, out=out)
    assert res is out and len(launch.calls) == 1
    c = launch.calls[0]
    for name, a in (("q", q), ("k", k), ("v", v), ("out", out)):
        assert c[name].strides == a.strides and np.shares_memory(c[name], a), name
    assert_close_rows(out, formula(q, k, v)[0], "float32")


def test_layout_broadcast_batch_has_zero_stride(rng) -> None:
    q = randn(rng, (4, 2, 3, 8), np.float32)
    k1, v1 = randn(rng, (2, 6, 8), np.float32), randn(rng, (2, 6, 8), np.float32)
    for k, v in ((k1, v1), (np.broadcast_to(k1, (4, 2, 6, 8)), np.broadcast_to(v1, (4, 2, 6, 8)))):
        (out, _), launch = run_layout(q, k, v)
        assert len(launch.calls) == 1
        c = launch.calls[0]
        assert c["k"].strides[0] == 0 and c["v"].strides[0] == 0
        assert np.shares_memory(c["k"], k1) and np.shares_memory(c["v"], v1)
        assert_close_rows(out, formula(q, k, v)[0], "float32")


def test_layout_strided_last_axis_is_copied_alone(rng) -> None:
    q = randn(rng, (2, 2, 3, 16), np.float32)[..., ::2]
    k, v = randn(rng, (2, 2, 4, 8), np.float32), randn(rng, (2, 2, 4, 8), np.float32)
    (out, _), launch = run_layout(q, k, v)
    c = launch.calls[0]
    assert not np.shares_memory(c["q"], q) and c["q"].strides[-1] == 4
    assert np.shares_memory(c["k"], k) and np.shares_memory(c["v"], v)
    assert_close_rows(out, formula(q, k, v)[0], "float32")


def test_layout_leading_dims_that_do_not_collapse_are_looped(rng) -> None:
    base = randn(rng, (2, 6, 2, 3, 8), np.float32)
    q = base[:, ::2]  # (2, 3, H, L, D): the two leading dims do not collapse
    k, v = randn(rng, (2, 3, 2, 5, 8), np.float32), randn(rng, (3, 2, 5, 4), np.float32)
    mask = rng.random((3, 1, 3, 5)) > 0.3
    (out, lse), launch = run_layout(q, k, v, mask=mask, return_lse=True)
    assert len(launch.calls) == 2  # one per index of the first leading dim
    for c in launch.calls:
        assert c["q"].shape == (3, 2, 3, 8) and np.shares_memory(c["q"], base)
        assert np.shares_memory(c["v"], v) and c["v"].strides[0] == 2 * 5 * 4 * 4
        assert np.shares_memory(c["mask"], mask) and c["mask"].strides[1] == 0
    ref, ref_lse = formula(q, k, v, mask=mask)
    assert_close_rows(out, ref, "float32")
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("mdtype", [np.float64, np.float32], ids=str)
def test_layout_float_mask_cast_on_its_own_shape(rng, mdtype) -> None:
    q, k, v = randn(rng, (3, 4, 5, 8), np.float16), randn(rng, (3, 4, 6, 8), np.float16), \
        randn(rng, (3, 4, 6, 8), np.float16)
    mask = rng.standard_normal((5, 6)).astype(mdtype)
    (out, _), launch = run_layout(q, k, v, mask=mask)
    m = launch.calls[0]["mask"]
    assert m.dtype == np.float16 and m.strides[:2] == (0, 0)
    assert _owner(m).nbytes == 5 * 6 * 2  # only the mask itself was cast, never broadcast
    assert_close_rows(out, formula(q, k, v, mask=mask.astype(np.float16))[0], "float16")
    m16 = mask.astype(np.float16)
    (_, _), launch = run_layout(q, k, v, mask=m16)  # already q's dtype: not even a cast
    assert _owner(launch.calls[0]["mask"]) is m16


def test_layout_broadcast_float_mask_is_cast_once(rng) -> None:
    """A float mask that is itself a broadcast view (torch's ``expand``: stride 0 over the
    batch and heads) is cast on its own elements only, and broadcast again for the launch."""
    q, k, v = randn(rng, (3, 4, 5, 8), np.float16), randn(rng, (3, 4, 6, 8), np.float16), \
        randn(rng, (3, 4, 6, 8), np.float16)
    pad = rng.standard_normal((3, 1, 1, 6)).astype(np.float32)
    mask = np.broadcast_to(pad, (3, 4, 5, 6))  # 360 elements viewed, 18 held
    (out, _), launch = run_layout(q, k, v, mask=mask)
    m = launch.calls[0]["mask"]
    assert m.dtype == np.float16 and m.strides[1:3] == (0, 0)
    assert _owner(m).nbytes == 3 * 6 * 2  # the 18 held elements, cast once
    assert_close_rows(out, formula(q, k, v, mask=mask.astype(np.float16))[0], "float16")


def test_layout_bool_mask_is_passed_as_a_view(rng) -> None:
    q, k, v = (randn(rng, (2, 2, 4, 8), np.float32) for _ in range(3))
    mask = rng.random((1, 4, 4)) > 0.5
    (out, _), launch = run_layout(q, k, v, mask=mask)
    m = launch.calls[0]["mask"]
    assert m.dtype == np.bool_ and np.shares_memory(m, mask) and m.strides[:2] == (0, 0)
    assert_close_rows(out, formula(q, k, v, mask=mask)[0], "float32")


@pytest.mark.parametrize("alias", ["q", "k", "v", "half_q"])
def test_layout_out_overlapping_an_input_goes_through_a_temporary(rng, alias) -> None:
    buf = randn(rng, (4, 2, 6, 8), np.float32)
    q, k, v = buf[:2], buf[2:], randn(rng, (2, 2, 6, 8), np.float32)
    out = {"q": q, "k": k, "v": v, "half_q": buf[1:3]}[alias]
    want = formula(q.copy(), k.copy(), v.copy())[0]
    (res, _), launch = run_layout(q, k, v, out=out)
    assert res is out and not np.shares_memory(launch.calls[0]["out"], buf)
    assert not np.shares_memory(launch.calls[0]["out"], v)
    assert_close_rows(out, want, "float32")


def test_layout_out_is_written_directly(rng) -> None:
    q, k, v = (randn(rng, (2, 2, 3, 8), np.float32) for _ in range(3))
    out = np.full((2, 2, 3, 8), np.nan, np.float32)
    (res, _), launch = run_layout(q, k, v, out=out)
    assert res is out and np.shares_memory(launch.calls[0]["out"], out)
    # strided last axis or a zero stride: through a temporary
    wide = np.full((2, 2, 3, 16), np.nan, np.float32)
    (res, _), launch = run_layout(q, k, v, out=wide[..., ::2])
    assert not np.shares_memory(launch.calls[0]["out"], wide)
    assert np.isnan(wide[..., 1::2]).all() and np.isfinite(wide[..., ::2]).all()


def test_layout_empty_never_launches(rng) -> None:
    for qs, ks, vs in [((0, 2, 3, 8), (0, 2, 4, 8), (0, 2, 4, 8)),
                       ((2, 2, 0, 8), (2, 2, 4, 8), (2, 2, 4, 8)),
                       ((2, 0, 3, 8), (2, 1, 4, 8), (2, 1, 4, 8)),
                       ((2, 2, 3, 8), (2, 2, 4, 8), (2, 2, 4, 0))]:
        q, k, v = randn(rng, qs, np.float32), randn(rng, ks, np.float32), \
            randn(rng, vs, np.float32)
        (out, lse), _ = run_layout(q, k, v, return_lse=vs[-1] != 0, launch=never)
        assert out.size == 0 and out.shape == (*qs[:-1], vs[-1])
    q = randn(rng, (2, 2, 3, 8), np.float32)
    kv = randn(rng, (2, 2, 0, 8), np.float32)
    out = np.full((2, 2, 3, 8), np.nan, np.float32)
    (res, lse), _ = run_layout(q, kv, kv, out=out, return_lse=True, launch=never)
    assert res is out and np.all(out == 0) and np.all(np.isneginf(lse))


def test_layout_dv_zero_still_computes_lse(rng) -> None:
    q, k = randn(rng, (2, 4, 3, 8), np.float32), randn(rng, (2, 2, 5, 8), np.float32)
    v = np.zeros((2, 2, 5, 0), np.float32)
    (out, lse), launch = run_layout(q, k, v, causal=True, return_lse=True)
    assert out.shape == (2, 4, 3, 0) and len(launch.calls) == 1
    assert launch.calls[0]["v"].shape == (2, 2, 5, 1)
    assert np.shares_memory(launch.calls[0]["v"], k)
    assert_lse_close(lse, formula(q, k, randn(rng, (2, 2, 5, 1), np.float32), causal=True)[1])
    (out, lse), _ = run_layout(q, k, v, causal=True, launch=never)  # no lse: nothing to launch
    assert lse is None


def test_layout_matches_numpy_path_on_every_case(rng) -> None:
    for qs, ks, vs, causal, mkind, mshape in CASES:
        q, k, v = (randn(rng, s, np.float32) for s in (qs, ks, vs))
        mask = make_mask(rng, mkind, mshape, np.float32)
        (out, lse), _ = run_layout(q, k, v, causal=causal, mask=mask, return_lse=True)
        want, want_lse = cunorm.attention(q, k, v, causal=causal, mask=mask, return_lse=True)
        np.testing.assert_allclose(out, want, rtol=2**-22, atol=1e-30)
        np.testing.assert_allclose(lse, want_lse, rtol=2**-22, atol=0)
