"""GPU tests of ``cunorm.attention``: every dtype and head dim, causal or not, no / boolean /
additive (broadcast) masks, grouped-query heads, Lq != Lk at ragged lengths, non-contiguous
layouts, every split-KV count forced on the same inputs; log-sum-exp, fully masked rows,
Lk = 1, empty problems, bad input, PyTorch SDPA on large shapes, PyTorch / JAX round trips.
Skipped (with the reason) where no CUDA GPU is present.

Errors are relative max-norms per row (the largest |out - ref| over the largest |ref| of a
query row, as ``test_gpu_norm.rel_err``) against a float64 reference computed on the host
from the same rounded inputs. Each must be within DESIGN section 3's bound for the dtype and
at most twice the error of a naive implementation in the same precision (cuBLAS-style
matmuls accumulating in float32, float64 for float64, rounded to the dtype; a softmax in
float32 for 16-bit inputs, as PyTorch's math path), plus two units of the dtype's rounding
so that exact cases do not fail on rounding ties.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from dataclasses import dataclass

import numpy as np
import pytest
from _gpu import (  # the shared GPU preamble
    BF16,
    DTYPES,
    GPU_MARKS,
    N_GPUS,
    TOL,
    cupy,
    poisoned_allocations,
    row_errors,
)

import cunorm

pytestmark = GPU_MARKS
#: unit roundoff of each dtype; twice it is the slack over 2x the naive error (a rounding tie)
UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-52}
#: (D, Dv): every head dim the issue names, and Dv != D
HEAD_DIMS = [(16, 16), (32, 32), (40, 40), (64, 64), (80, 80), (96, 96), (128, 128),
             (160, 160), (256, 256), (64, 32)]
#: None: the dispatcher's choice; then every forced split-KV count (1 = no split)
SPLITS = [None, 1, 2, 7]
#: (split-KV count, warpgroups per block, persistent grid, warp-specialized kernel) forced
#: together: every split, then each warpgroup count of the sm_90 warpgroup kernel, persistent
#: grids of one block (every row tile in its own round) and of three, then attn_ws (head dims
#: up to 128) and attn_wg without it (elsewhere the planner ignores the last three)
CHOICES = ([(split, None, None, None) for split in SPLITS]
           + [(None, 1, None, None), (None, 2, None, None), (None, 1, 1, None), (None, 2, 1, None),
              (None, 2, 3, None), (None, None, None, True), (None, None, None, False)])


# --- helpers ----------------------------------------------------------------------------
def launch_module():
    return importlib.import_module("cunorm._attn_launch")


def force_split(n: int | None):
    """The dispatcher's own choice (None) or ``n`` KV splits forced."""
    if n is None:
        return contextlib.nullcontext()
    return importlib.import_module("cunorm._attn_dispatch").force_split(n)


@contextlib.contextmanager
def force_choices(split: int | None, groups: int | None, blocks: int | None = None,
                  ws: bool | None = None):
    """``split`` KV splits, ``groups`` warpgroups per block, a persistent grid of ``blocks``
    and the warp-specialized kernel (``ws``) forced (None: the planner's)."""
    dispatch = importlib.import_module("cunorm._attn_dispatch")
    with force_split(split), dispatch.force_warpgroups(groups), \
            dispatch.force_persistent(blocks), dispatch.force_warp_specialized(ws):
        yield


def to_host(a) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else cupy.asnumpy(a)


def reference(q, k, v, *, causal: bool = False, scale: float | None = None, mask=None):
    """``(out, lse)`` on the host in float64 (``np.longdouble`` for float64 inputs, whose own
    rounding a float64 reference would share): key/value heads repeated for grouped queries,
    masks applied as conditions, max-subtracted softmax; fully masked rows 0 and -inf."""
    wide = np.longdouble if to_host(q).dtype == np.float64 else np.float64
    q, k, v = (np.asarray(to_host(a), wide) for a in (q, k, v))
    mask = None if mask is None else to_host(mask)
    hq, lq, d = q.shape[-3:]
    hkv, lk, dv = v.shape[-3:]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    q = np.broadcast_to(q, (*lead, hq, lq, d))
    k = np.repeat(np.broadcast_to(k, (*lead, hkv, lk, d)), hq // hkv, axis=-3)
    v = np.repeat(np.broadcast_to(v, (*lead, hkv, lk, dv)), hq // hkv, axis=-3)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = (q @ np.swapaxes(k, -1, -2)) * scale
        if mask is not None:
            m = np.broadcast_to(mask, s.shape)
            s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m.astype(wide)
        if causal:
            s = np.where(np.tril(np.ones((lq, lk), bool), k=lk - lq), s, -np.inf)
        mx = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
        dead = np.isneginf(mx)
        p = np.exp(s - np.where(dead, 0.0, mx))
        total = p.sum(axis=-1, keepdims=True)
        out = (p @ v) / np.where(dead, 1.0, total)
        lse = np.where(dead, -np.inf, mx + np.log(total))[..., 0]
    return out, lse


def naive(q, k, v, *, causal: bool = False, scale: float | None = None, mask=None):
    """Attention as a framework computes it without fusion, on the GPU in q's precision:
    ``S = q @ k^T`` (float32 accumulation, float64 for float64, rounded to the dtype), scaled
    and masked in the dtype, a softmax computed in float32 (float64) and rounded, then
    ``P @ v`` rounded. Fully masked rows come out NaN (they are checked separately)."""
    dt = q.dtype
    acc = np.float64 if dt == np.float64 else np.float32

    def rnd(a):
        return a.astype(dt).astype(acc)

    hq, lq, d = q.shape[-3:]
    hkv, lk, dv = v.shape[-3:]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    qa = cupy.broadcast_to(q, (*lead, hq, lq, d)).astype(acc)
    ka = cupy.repeat(cupy.broadcast_to(k, (*lead, hkv, lk, d)).astype(acc), hq // hkv, axis=-3)
    va = cupy.repeat(cupy.broadcast_to(v, (*lead, hkv, lk, dv)).astype(acc), hq // hkv, axis=-3)
    s = rnd(qa @ cupy.swapaxes(ka, -1, -2))
    s = rnd(s * acc(scale))
    if mask is not None:
        if mask.dtype == np.bool_:
            s = cupy.where(cupy.broadcast_to(mask, s.shape), s, -np.inf)
        else:
            s = rnd(s + mask.astype(dt).astype(acc))
    if causal:
        keep = cupy.asarray(np.tril(np.ones((lq, lk), bool), k=lk - lq))
        s = cupy.where(keep, s, -np.inf)
    e = cupy.exp(s - s.max(axis=-1, keepdims=True))
    p = rnd(e / e.sum(axis=-1, keepdims=True))
    return (p @ va).astype(dt)


def check(out, lse, ref: np.ndarray, ref_lse: np.ndarray, naive_err: float, dtype: np.dtype,
          where: str) -> float:
    """out / lse of one run against the reference: fully masked rows exactly 0 and -inf;
    other rows within DESIGN's bound and 2x the naive error (+ 2 units of rounding).
    Returns the error."""
    assert isinstance(out, cupy.ndarray) and out.dtype == dtype, where
    assert out.shape == ref.shape, (where, out.shape, ref.shape)
    host = np.asarray(to_host(out), np.float64)
    dead = np.isneginf(ref_lse).reshape(-1)
    rows = host.reshape(-1, ref.shape[-1])
    assert np.all(rows[dead] == 0), f"{where}: a fully masked row is not exactly 0"
    err = float(row_errors(host, ref)[~dead].max(initial=0.0))
    bound = min(TOL[dtype.name], 2 * naive_err + 2 * UNIT[dtype.name])
    assert err <= bound, (f"{where}: error {err:.3g} > {bound:.3g} (naive {naive_err:.3g}, "
                          f"bound {TOL[dtype.name]:.3g})")
    if lse is not None:
        assert isinstance(lse, cupy.ndarray) and lse.dtype == np.float32, where
        assert lse.shape == ref_lse.shape, (where, lse.shape)
        got = to_host(lse).astype(np.float64)
        assert np.array_equal(np.isneginf(got), np.isneginf(ref_lse)), f"{where}: -inf rows"
        fin = np.isfinite(ref_lse)
        np.testing.assert_allclose(got[fin], ref_lse[fin], rtol=1e-5, atol=1e-5,
                                   err_msg=f"{where}: lse")
    return err


def assert_is_value(got: np.ndarray, want: np.ndarray, dtype: np.dtype, where: str) -> None:
    """A query that sees exactly one key returns that key's value: bit for bit in 16-bit
    dtypes (the weight 1 may come out 1 +- an ulp of float32, far below a 16-bit rounding),
    within 4 units of rounding in float32 / float64."""
    want = np.broadcast_to(want, got.shape)
    if dtype.itemsize == 2:
        assert np.array_equal(got, want), where
    else:
        np.testing.assert_allclose(got, want, rtol=4 * UNIT[dtype.name], atol=0, err_msg=where)


def randn(rng: np.random.Generator, shape, dtype, scale: float = 1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(dtype)


# --- the scenarios every (dtype, head dim, causal) case runs --------------------------------
@dataclass(frozen=True)
class Scenario:
    """One problem: sizes, a mask and the layout of the operands. Together the scenarios
    cover Lq in {1, 17, 63, 65, 129}, Lk in {17, 63, 65, 129, 300}, Lq > Lk, GQA 1 and 4,
    no / bool / additive masks broadcast in several ways, fully masked rows, and layouts:
    contiguous, (B, L, H, D) transposed views (out included), a zero-stride batch, 3-D K/V
    under 4-D queries, a strided last axis (copied) and leading dims that do not collapse."""

    name: str
    lead: tuple[int, ...]
    hq: int
    hkv: int
    lq: int
    lk: int
    mask: str | None  # None, "bool", "additive"
    mask_shape: str  # which broadcast of (..., Hq, Lq, Lk)
    layout: str


SCENARIOS = [
    Scenario("decode", (3,), 8, 2, 1, 300, None, "", "blhd"),
    Scenario("prefill_bool", (2,), 3, 3, 17, 63, "bool", "b1qk", "contiguous"),
    Scenario("lq_gt_lk_additive", (2,), 8, 2, 65, 17, "additive", "qk", "broadcast_batch"),
    Scenario("padding_loop", (2, 3), 4, 1, 129, 129, "bool", "k", "lead_loop"),
    Scenario("strided_q_full_mask", (2,), 2, 2, 63, 65, "additive", "full", "strided_last"),
]


def make_case(rng, sc: Scenario, dtype: np.dtype, d: int, dv: int):
    """(q, k, v, mask, out) CuPy arrays in ``sc``'s layout; out poisoned with NaN."""
    def dev(shape, order=None):
        a = cupy.asarray(randn(rng, shape, dtype))
        return a if order is None else a.transpose(order)

    lead, hq, hkv, lq, lk = sc.lead, sc.hq, sc.hkv, sc.lq, sc.lk
    if sc.layout == "blhd":  # (B, L, H, D) buffers passed as (B, H, L, D) views
        q = dev((*lead, lq, hq, d), (0, 2, 1, 3))
        k = dev((*lead, lk, hkv, d), (0, 2, 1, 3))
        v = dev((*lead, lk, hkv, dv), (0, 2, 1, 3))
        out = cupy.full((*lead, lq, hq, dv), np.nan, dtype).transpose(0, 2, 1, 3)
    elif sc.layout == "broadcast_batch":  # one K/V for the whole batch, zero stride
        q = dev((*lead, hq, lq, d))
        k = cupy.broadcast_to(dev((1, hkv, lk, d)), (*lead, hkv, lk, d))
        v = cupy.broadcast_to(dev((1, hkv, lk, dv)), (*lead, hkv, lk, dv))
        out = cupy.full((*lead, hq, lq, dv), np.nan, dtype)
    elif sc.layout == "lead_loop":  # q's two leading dims cannot collapse into one
        q = dev((lead[0], 2 * lead[1], hq, lq, d))[:, ::2]
        k, v = dev((lead[1], hkv, lk, d)), dev((lead[1], hkv, lk, dv))
        out = cupy.full((*lead, hq, lq, dv), np.nan, dtype)
    elif sc.layout == "strided_last":  # q's last axis strided (copied); K/V 3-D
        q = dev((*lead, hq, lq, 2 * d))[..., ::2]
        k, v = dev((hkv, lk, d)), dev((hkv, lk, dv))
        out = cupy.full((*lead, hq, lq, dv), np.nan, dtype)
    else:
        q = dev((*lead, hq, lq, d))
        k, v = dev((*lead, hkv, lk, d)), dev((*lead, hkv, lk, dv))
        out = cupy.full((*lead, hq, lq, dv), np.nan, dtype)

    mask = None
    if sc.mask is not None:
        shape = {"b1qk": (*lead, 1, lq, lk), "qk": (lq, lk), "k": (1, 1, lk),
                 "full": (*lead, hq, lq, lk)}[sc.mask_shape]
        keep = rng.random(shape) > 0.25
        if sc.mask_shape == "k":
            keep[..., lk - 29:] = False  # key padding
        if len(shape) >= 3 and shape[-2] > 5:
            keep[..., 5, :] = False  # a fully masked query row
        if sc.mask == "bool":
            mask = cupy.asarray(keep)
        else:
            add = np.where(keep, 0.5 * rng.standard_normal(shape), -np.inf).astype(dtype)
            mask = cupy.asarray(add)
    return q, k, v, mask, out


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("d", "dv"), HEAD_DIMS, ids=lambda x: str(x))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dt: dt.name)
def test_matches_reference(rng, dtype, d, dv, causal):
    """Every scenario, every split count and warpgroup count on the same inputs, out
    poisoned with NaN."""
    for sc in SCENARIOS:
        q, k, v, mask, out = make_case(rng, sc, dtype, d, dv)
        ref, ref_lse = reference(q, k, v, causal=causal, mask=mask)
        live = ~np.isneginf(ref_lse).reshape(-1)
        nerr = float(row_errors(naive(q, k, v, causal=causal, mask=mask), ref)[live]
                     .max(initial=0.0))
        for split, groups, blocks, ws in CHOICES:
            out[...] = np.nan  # every element must be written
            with force_choices(split, groups, blocks, ws):
                res, lse = cunorm.attention(q, k, v, causal=causal, mask=mask, out=out,
                                            return_lse=True)
            assert res is out
            check(out, lse, ref, ref_lse, nerr, dtype,
                  f"{sc.name} split={split} groups={groups} blocks={blocks} ws={ws}")
        # no out=, no lse: a fresh CuPy array of the broadcast shape
        res = cunorm.attention(q, k, v, causal=causal, mask=mask)
        check(res, None, ref, ref_lse, nerr, dtype, f"{sc.name} fresh")


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dt: dt.name)
def test_one_key(rng, dtype, split):
    """Lk = 1: each query that sees the key returns its value exactly; lse is the score."""
    q = cupy.asarray(randn(rng, (2, 4, 5, 64), dtype))
    k = cupy.asarray(randn(rng, (2, 2, 1, 64), dtype))
    v = cupy.asarray(randn(rng, (2, 2, 1, 64), dtype))
    vfull = np.repeat(cupy.asnumpy(v), 2, axis=1)
    ref_lse = reference(q, k, v)[1]
    for causal in (False, True):
        with force_split(split):
            out, lse = cunorm.attention(q, k, v, causal=causal, return_lse=True)
        host = cupy.asnumpy(out)
        seen = slice(4, 5) if causal else slice(0, 5)  # causal: only the last query sees it
        assert_is_value(host[:, :, seen], vfull, dtype, f"causal={causal}")
        if causal:
            assert np.all(host[:, :, :4] == 0)
            assert np.all(np.isneginf(cupy.asnumpy(lse)[:, :, :4]))
        np.testing.assert_allclose(cupy.asnumpy(lse)[:, :, seen], ref_lse[:, :, seen],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dt: dt.name)
def test_fully_masked_rows_and_empty_chunks(rng, dtype, split):
    """Rows with no key (exactly 0, lse -inf) next to rows whose only keys sit in one split
    chunk, so most chunks of a split row hold nothing but -inf."""
    lq, lk, d = 8, 1000, 64
    q = cupy.asarray(randn(rng, (2, 4, lq, d), dtype))
    k = cupy.asarray(randn(rng, (2, 4, lk, d), dtype))
    v = cupy.asarray(randn(rng, (2, 4, lk, d), dtype))
    keep = np.zeros((2, 4, lq, lk), bool)
    keep[:, :, 1, 0] = True  # the first key only
    keep[:, :, 2, -1] = True  # the last key only
    keep[:, :, 3, 490:510] = True  # a window in the middle
    keep[:, :, 4] = True
    keep[1, 2, 4] = False
    keep[:, :, 6, ::97] = True
    mask = cupy.asarray(keep)
    additive = cupy.asarray(np.where(keep, 0.0, -np.inf).astype(dtype))
    ref, ref_lse = reference(q, k, v, mask=mask)
    live = ~np.isneginf(ref_lse).reshape(-1)
    nerr = float(row_errors(naive(q, k, v, mask=mask), ref)[live].max(initial=0.0))
    for m in (mask, additive):
        out = cupy.full((2, 4, lq, d), np.nan, dtype)
        with force_split(split):
            res, lse = cunorm.attention(q, k, v, mask=m, out=out, return_lse=True)
        check(res, lse, ref, ref_lse, nerr, dtype, f"split={split} mask={m.dtype}")
        host = cupy.asnumpy(res)
        assert np.all(host[:, :, [0, 5, 7]] == 0) and np.all(host[1, 2, 4] == 0)
        assert_is_value(host[:, :, 1], cupy.asnumpy(v)[:, :, 0], dtype, "first key only")
        assert_is_value(host[:, :, 2], cupy.asnumpy(v)[:, :, -1], dtype, "last key only")


@pytest.mark.parametrize(("split", "blocks", "ws"),
                         [(s, None, None) for s in SPLITS] + [(None, 1, None), (None, 2, None),
                                                              (None, None, True)])
def test_causal_lq_greater_than_lk(rng, split, blocks, ws):
    """Bottom-right alignment: with Lq = 200 > Lk = 25 the first 175 queries see nothing, so
    the first two 64-row tiles of each head have no key (a persistent block, forced, passes
    through them between tiles that have; attn_ws's loader loads only their Q)."""
    q = cupy.asarray(randn(rng, (1, 2, 200, 64), np.float16))
    k = cupy.asarray(randn(rng, (1, 2, 25, 64), np.float16))
    v = cupy.asarray(randn(rng, (1, 2, 25, 64), np.float16))
    with force_choices(split, None if ws else 1, blocks, ws):
        out, lse = cunorm.attention(q, k, v, causal=True, return_lse=True)
    host, lh = cupy.asnumpy(out), cupy.asnumpy(lse)
    assert np.all(host[:, :, :175] == 0) and np.all(np.isneginf(lh[:, :, :175]))
    ref, ref_lse = reference(q, k, v, causal=True)
    nerr = float(row_errors(naive(q, k, v, causal=True), ref)[
        ~np.isneginf(ref_lse).reshape(-1)].max())
    check(out, lse, ref, ref_lse, nerr, np.dtype(np.float16),
          f"split={split} blocks={blocks} ws={ws}")


# --- layouts: what reaches the launcher ------------------------------------------------------
@pytest.fixture
def launches(monkeypatch):
    """Records what every launcher call receives (pointers, shapes, strides, stream)."""
    mod = launch_module()
    real = mod.launch_attention
    calls: list[dict] = []

    def spy(q, k, v, out, **kwargs):
        calls.append({name: (a.data.ptr, a.shape, a.strides)
                      for name, a in (("q", q), ("k", k), ("v", v), ("out", out))}
                     | {"stream": cupy.cuda.get_current_stream().ptr, **kwargs})
        return real(q, k, v, out, **kwargs)

    monkeypatch.setattr(mod, "launch_attention", spy)
    # a memoized call skips the launcher (see test_repeated_calls_take_the_memo and
    # test_torch_memo): start both memos empty
    for memo in ("_MEMO", "_TORCH_MEMO"):
        monkeypatch.setattr(importlib.import_module("cunorm.attention"), memo,
                            importlib.import_module("cunorm._cache").BoundedCache())
    return calls


@pytest.fixture
def no_launch(monkeypatch):
    """The launcher must not be called."""
    def fail(*args, **kwargs):
        raise AssertionError("the launcher was called")

    monkeypatch.setattr(launch_module(), "launch_attention", fail)


def test_transposed_views_and_broadcast_batch_are_not_copied(rng, launches):
    base = {n: cupy.asarray(randn(rng, (2, 33, 4, 64), np.float16)) for n in "qkv"}
    q, k, v = (base[n].transpose(0, 2, 1, 3) for n in "qkv")
    obuf = cupy.full((2, 33, 4, 64), np.nan, np.float16)
    out = obuf.transpose(0, 2, 1, 3)
    cunorm.attention(q, k, v, out=out)
    assert len(launches) == 1
    for name, a in (("q", q), ("k", k), ("v", v), ("out", out)):
        assert launches[0][name] == (a.data.ptr, a.shape, a.strides), name
    # one K/V for every batch element: a zero batch stride, no copy
    k1 = cupy.asarray(randn(rng, (1, 4, 33, 64), np.float16))
    kb = cupy.broadcast_to(k1, (2, 4, 33, 64))
    launches.clear()
    cunorm.attention(q, kb, kb)
    assert launches[0]["k"][0] == k1.data.ptr and launches[0]["k"][2][0] == 0
    # 3-D K/V under 4-D queries (leading dims broadcast), GQA: K/V heads passed as they are
    k3 = cupy.asarray(randn(rng, (1, 33, 64), np.float16))
    launches.clear()
    out = cunorm.attention(q, k3, k3)
    assert out.shape == (2, 4, 33, 64)
    assert launches[0]["k"][0] == k3.data.ptr and launches[0]["k"][1] == (2, 1, 33, 64)
    ref, ref_lse = reference(q, k3, k3)
    check(out, None, ref, ref_lse, float(row_errors(naive(q, k3, k3), ref).max()),
          np.dtype(np.float16), "3-D k/v")


def test_strided_last_axis_is_copied_and_loops_launch_per_slice(rng, launches):
    q = cupy.asarray(randn(rng, (2, 6, 4, 17, 128), np.float32))[:, ::2, :, :, ::2]
    k = cupy.asarray(randn(rng, (3, 2, 63, 64), np.float32))
    v = cupy.asarray(randn(rng, (3, 2, 63, 64), np.float32))
    out = cunorm.attention(q, k, v)
    assert out.shape == (2, 3, 4, 17, 64)
    assert launches and all(c["k"][0] == k.data.ptr for c in launches[:1])
    assert all(c["q"][2][-1] == 4 for c in launches)  # a unit-stride copy of q
    ref, ref_lse = reference(q, k, v)
    check(out, None, ref, ref_lse, float(row_errors(naive(q, k, v), ref).max()),
          np.dtype(np.float32), "strided")
    # leading dims that cannot collapse: one launch per outer index, K/V never copied
    qv = cupy.asarray(randn(rng, (2, 6, 4, 17, 64), np.float32))[:, ::2]
    launches.clear()
    out = cunorm.attention(qv, k, v, causal=True)
    assert len(launches) == 2
    assert {c["v"][0] for c in launches} == {v.data.ptr}
    ref, ref_lse = reference(qv, k, v, causal=True)
    check(out, None, ref, ref_lse, float(row_errors(naive(qv, k, v, causal=True), ref).max()),
          np.dtype(np.float32), "loop")


def test_out_overlapping_inputs(rng):
    buf = cupy.asarray(randn(rng, (4, 2, 40, 64), np.float32))
    q, k, v = buf[:2], buf[2:], cupy.asarray(randn(rng, (2, 2, 40, 64), np.float32))
    ref, ref_lse = reference(q, k, v)
    nerr = float(row_errors(naive(q, k, v), ref).max())
    assert cunorm.attention(q, k, v, out=q) is q  # in place
    check(q, None, ref, ref_lse, nerr, np.dtype(np.float32), "out=q")
    q, k = buf[:2], buf[2:]
    q[...] = cupy.asarray(randn(rng, (2, 2, 40, 64), np.float32))
    ref, ref_lse = reference(q, k, v)
    nerr = float(row_errors(naive(q, k, v), ref).max())
    out = buf[1:3]  # overlaps q and k
    assert cunorm.attention(q, k, v, out=out) is out
    check(out, None, ref, ref_lse, nerr, np.dtype(np.float32), "overlap")


# --- the hot-path memo ------------------------------------------------------------------------
@pytest.mark.parametrize("return_lse", [False, True])
def test_repeated_calls_take_the_memo(rng, launches, return_lse):
    """A second call of the same geometry skips validation and planning (no launcher call)
    and is still right on new data, on a misaligned start (no 16-byte packs) and under a
    forced split or warpgroup count (other keys)."""
    buf = {n: cupy.asarray(randn(rng, (1, 8, 300, 72), np.float16)) for n in "qkv"}
    q, k, v = (buf[n][:, :, :, :64] for n in "qkv")  # (1, 8, 300, 64), row stride 72
    q = q[:, :, :1]  # decoding: Lq = 1 over 300 keys, 8 query heads on 2 KV heads
    k, v = k[:, :2], v[:, :2]
    results = []
    for start in (0, 0, 1, 1):  # aligned twice, then an odd start (same shapes and strides)
        qs, ks, vs = (buf[n][:, :, :, start:start + 64] for n in "qkv")
        qs, ks, vs = qs[:, :, :1], ks[:, :2], vs[:, :2]
        res = cunorm.attention(qs, ks, vs, return_lse=return_lse)
        out, lse = res if return_lse else (res, None)
        ref, ref_lse = reference(qs, ks, vs)
        check(out, lse, ref, ref_lse, float(row_errors(naive(qs, ks, vs), ref).max()),
              np.dtype(np.float16), f"start={start}")
        results.append(out)
    assert len(launches) == 1, "later calls of one geometry must take the memo"
    assert bool((results[0] == results[1]).all())
    with force_split(3):  # a forced split is part of the key
        out = cunorm.attention(q, k, v, return_lse=return_lse)
    assert len(launches) == 2
    with force_choices(None, 2):  # so is a forced warpgroup count
        cunorm.attention(q, k, v, return_lse=return_lse)
    assert len(launches) == 3
    res = out[0] if return_lse else out
    assert bool((cupy.abs(res.astype(np.float32) - results[0].astype(np.float32)) < 1e-2).all())


def test_masked_calls_take_the_memo(rng, launches):
    """A masked decoding call of a seen geometry takes the memo and reads the new mask's
    values (the pointer of this call's mask); NaN keys behind its False entries never reach
    the output. A mask of another layout is another key, and one the launcher gets as a cast
    copy (float32 for float16 q) is memoized with its cast, made anew on every call."""
    q = cupy.asarray(randn(rng, (3, 8, 1, 64), np.float16))  # decoding: 8 query on 2 KV heads
    k, v = (cupy.asarray(randn(rng, (3, 2, 700, 64), np.float16)) for _ in "kv")
    finite = k.copy()
    k[1, :, 333:] = np.nan  # past batch 1's every length below

    def run(keys, mask, where: str) -> None:
        out = cunorm.attention(q, keys, v, mask=mask)
        ref, ref_lse = reference(q, keys, v, mask=mask)  # (NaN scores it masks are dropped)
        nerr = float(row_errors(naive(q, keys, v, mask=mask), ref).max())
        check(out, None, ref, ref_lse, nerr, np.dtype(np.float16), where)

    for lens in ((700, 333, 64), (500, 100, 700), (1, 333, 650)):  # one geometry
        keep = np.arange(700)[None, :] < np.array(lens)[:, None]
        mask = cupy.asarray(keep.reshape(3, 1, 1, 700))
        run(k, mask, f"lengths {lens}")
    assert len(launches) == 1, "later masked calls of one geometry must take the memo"
    run(k, cupy.asfortranarray(mask[:, 0, 0])[:, None, None], "key stride 3")
    assert len(launches) == 2, "a mask of other strides is another geometry"
    for lens in ((650, 100, 700), (30, 333, 400)):  # new values: cast anew on each call
        keep = np.arange(700)[None, :] < np.array(lens)[:, None]
        add = np.where(keep, 0.5 * rng.standard_normal(keep.shape), -np.inf)
        run(finite, cupy.asarray(add.astype(np.float32).reshape(3, 1, 1, 700)),
            f"float32 additive mask, lengths {lens}")
    assert len(launches) == 3, "a float mask cast to q's dtype takes the memo too"
    for lens in ((700, 1, 64), (333, 650, 2)):  # torch's expand: stride 0 over the heads
        keep = np.arange(700)[None, :] < np.array(lens)[:, None]
        add = np.where(keep, 0.5 * rng.standard_normal(keep.shape), -np.inf)
        held = cupy.asarray(add.astype(np.float32).reshape(3, 1, 1, 700))
        run(finite, cupy.broadcast_to(held, (3, 8, 1, 700)), f"expanded float32 mask {lens}")
    assert len(launches) == 4, "an expanded float mask: one more geometry, then the memo"


def test_memo_keeps_every_check(rng):
    """After a memoized call, arguments that differ in kind, dtype or type still fail."""
    q = cupy.asarray(randn(rng, (1, 4, 1, 64), np.float16))
    k = cupy.asarray(randn(rng, (1, 2, 40, 64), np.float16))
    cunorm.attention(q, k, k)
    cunorm.attention(q, k, k)
    with pytest.raises(TypeError, match="causal must be a bool"):
        cunorm.attention(q, k, k, causal=0)
    with pytest.raises(TypeError, match="scale must be a real number"):
        cunorm.attention(q, k, k, scale=True)
    with pytest.raises(TypeError, match="k is a numpy array but q is a cupy"):
        cunorm.attention(q, cupy.asnumpy(k), k)
    with pytest.raises(TypeError, match="dtype"):
        cunorm.attention(q, k.astype(np.float32), k)


# --- empty problems and bad input: no launch -------------------------------------------------
@pytest.mark.parametrize(("qs", "ks", "vs"), [
    ((0, 2, 3, 64), (0, 2, 4, 64), (0, 2, 4, 64)),
    ((2, 0, 3, 64), (2, 0, 4, 64), (2, 0, 4, 64)),
    ((2, 2, 0, 64), (2, 2, 4, 64), (2, 2, 4, 64)),
    ((2, 2, 3, 64), (2, 2, 0, 64), (2, 2, 0, 64)),
], ids=str)
def test_empty_without_launch(no_launch, qs, ks, vs):
    q, k, v = (cupy.zeros(s, np.float16) for s in (qs, ks, vs))
    out, lse = cunorm.attention(q, k, v, return_lse=True)
    assert out.shape == (*qs[:-1], vs[-1]) and lse.shape == qs[:-1]
    assert isinstance(out, cupy.ndarray) and lse.dtype == np.float32
    if ks[-2] == 0 and out.size:  # no keys: fully masked rows
        assert float(cupy.abs(out).max()) == 0.0
        assert bool((lse == -np.inf).all())


def test_dv_zero_still_gives_lse(rng):
    q = cupy.asarray(randn(rng, (2, 4, 9, 64), np.float16))
    k = cupy.asarray(randn(rng, (2, 2, 30, 64), np.float16))
    out, lse = cunorm.attention(q, k, cupy.zeros((2, 2, 30, 0), np.float16), return_lse=True,
                                causal=True)
    assert out.shape == (2, 4, 9, 0)
    _, lse1 = cunorm.attention(q, k, k[..., :1], return_lse=True, causal=True)
    assert bool((lse == lse1).all())


def test_bad_input_never_launches_and_leaves_out_untouched(rng, no_launch, monkeypatch):
    q = cupy.asarray(randn(rng, (2, 4, 16, 64), np.float32))
    k = cupy.asarray(randn(rng, (2, 2, 32, 64), np.float32))
    v = cupy.asarray(randn(rng, (2, 2, 32, 64), np.float32))
    out = cupy.full((2, 4, 16, 64), 7.0, np.float32)
    bad = [
        (TypeError, "k has dtype float16; expected float32 (the dtype of q)",
         {"k": k.astype(np.float16)}),
        (TypeError, "q has dtype int32", {"q": q.astype(np.int32)}),
        (ValueError, "k has head dim 32 (k.shape[-1]); expected 64", {"k": k[..., :32]}),
        (ValueError, "v has 31 keys (v.shape[-2]); expected 32", {"v": v[:, :, :31]}),
        (ValueError, "q has 4 heads, not a multiple of the 3 heads",
         {"k": cupy.zeros((2, 3, 32, 64), np.float32), "v": cupy.zeros((2, 3, 32, 64),
                                                                         np.float32)}),
        (ValueError, "q and k have head dim 300", {"q": cupy.zeros((2, 4, 16, 300), np.float32),
                                                   "k": cupy.zeros((2, 2, 32, 300), np.float32)}),
        (ValueError, "mask has shape (16, 31)", {"mask": cupy.ones((16, 31), bool)}),
        (TypeError, "mask has dtype int32", {"mask": cupy.ones((16, 32), np.int32)}),
        (TypeError, "mask is a numpy array but q is a cupy array",
         {"mask": np.ones((16, 32), bool)}),
        (TypeError, "k is a numpy array but q is a cupy array", {"k": cupy.asnumpy(k)}),
        (ValueError, "scale must be finite", {"scale": float("nan")}),
        (TypeError, "causal must be a bool", {"causal": 1}),
        (ValueError, "out has shape (2, 4, 16, 32); expected (2, 4, 16, 64)",
         {"out": out[..., :32]}),
        (TypeError, "out has dtype float16; expected float32", {"out": out.astype(np.float16)}),
        (TypeError, "out is a numpy array but q is a cupy array",
         {"out": np.zeros((2, 4, 16, 64), np.float32)}),
    ]
    for exc, msg, kwargs in bad:
        args = {"q": q, "k": k, "v": v, "out": out, **kwargs}
        with pytest.raises(exc) as info:
            cunorm.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
        assert str(info.value).startswith("attention()") and msg in str(info.value), info.value
        assert float(out.min()) == 7.0 == float(out.max()), f"{kwargs} wrote into out"
    if N_GPUS > 1:
        with cupy.cuda.Device(1):
            k1 = cupy.asarray(cupy.asnumpy(k))
        with pytest.raises(ValueError, match="k is on device 1 but q is on device 0"):
            cunorm.attention(q, k1, v, out=out)
    monkeypatch.undo()
    assert cunorm.attention(q, k, v, out=out) is out  # the context is still usable
    cupy.cuda.Device().synchronize()
    assert bool(cupy.isfinite(out).all())


# --- PyTorch ---------------------------------------------------------------------------------
def _torch_cuda():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


def _torch_err(y, ref) -> float:
    """Largest relative max-norm row error of torch tensor ``y`` against float64 ``ref``."""
    num = (y.double() - ref).abs().amax(dim=-1)
    den = ref.abs().amax(dim=-1).clamp_min(1e-300)
    return float((num / den).max())


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_large_vs_torch_sdpa(dtype, d, causal):
    """B = 2, H = 8, L = 1024 ((B, L, H, D) tensors as transposed views): as accurate as
    torch's own SDPA (flash backend where available) against a float64 SDPA."""
    torch = _torch_cuda()
    F = torch.nn.functional
    tdt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(d + causal)
    q, k, v = (torch.randn(2, 1024, 8, d, device="cuda", generator=gen).to(tdt).transpose(1, 2)
               for _ in range(3))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    ours = _torch_err(cunorm.attention(q, k, v, causal=causal), ref)
    theirs = _torch_err(F.scaled_dot_product_attention(q, k, v, is_causal=causal), ref)
    assert ours <= TOL[dtype], ours
    assert ours <= 1.1 * theirs + UNIT[dtype] / 8, f"cunorm {ours:.3g} vs torch {theirs:.3g}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decoding_vs_torch_sdpa(dtype):
    """Lq = 1 over an 8k KV cache, 32 query heads on 8 key/value heads (split-KV territory)."""
    torch = _torch_cuda()
    F = torch.nn.functional
    tdt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(2, 32, 1, 128, device="cuda", generator=gen).to(tdt)
    k, v = (torch.randn(2, 8, 8192, 128, device="cuda", generator=gen).to(tdt) for _ in range(2))
    kr, vr = (t.repeat_interleave(4, dim=1) for t in (k, v))  # query head h -> kv head h // 4
    ref = F.scaled_dot_product_attention(q.double(), kr.double(), vr.double())
    out, lse = cunorm.attention(q, k, v, return_lse=True)
    ours = _torch_err(out, ref)
    theirs = _torch_err(F.scaled_dot_product_attention(q, kr, vr), ref)
    assert ours <= TOL[dtype] and ours <= 1.1 * theirs + UNIT[dtype] / 8, (ours, theirs)
    s = (q.double() @ kr.double().transpose(-1, -2)) / math.sqrt(128)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_torch_round_trip(dtype, launches):
    torch = _torch_cuda()
    tdt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, n, h, 64, device="cuda", generator=gen).to(tdt).transpose(1, 2)
               for n, h in ((17, 4), (40, 2), (40, 2)))
    mask = torch.rand(17, 40, device="cuda", generator=gen) > 0.2
    out, lse = cunorm.attention(q, k, v, mask=mask, causal=True, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == tdt
    assert out.shape == (2, 4, 17, 64)
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32 and lse.shape == (2, 4, 17)
    c = launches[-1]
    assert c["q"][0] == q.data_ptr() and c["k"][0] == k.data_ptr()  # zero-copy views
    hq = [t.detach().cpu().double().numpy() for t in (q, k, v)]
    ref, ref_lse = reference(*hq, causal=True, mask=mask.cpu().numpy())
    assert row_errors(out.double().cpu().numpy(), ref).max() <= TOL[dtype]
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, rtol=1e-5, atol=1e-5)
    # out= a torch tensor: written in place and returned as itself
    buf = torch.empty(2, 17, 4, 64, device="cuda", dtype=tdt)
    o = buf.transpose(1, 2)
    assert cunorm.attention(q, k, v, mask=mask, causal=True, out=o) is o
    assert torch.equal(o, out)
    with pytest.raises(TypeError, match="k is a numpy array but q is a torch array"):
        cunorm.attention(q, np.zeros((2, 2, 40, 64)), v)
    with pytest.raises(TypeError, match="v is a CPU torch.Tensor but q is a CUDA tensor"):
        cunorm.attention(q, k, v.cpu())
    with pytest.raises(TypeError, match="q is a CPU torch.Tensor"):
        cunorm.attention(q.cpu(), k.cpu(), v.cpu())


def test_torch_stream(launches):
    torch = _torch_cuda()
    F = torch.nn.functional
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        out = cunorm.attention(q, k, v, causal=True)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    s.synchronize()
    assert launches and all(c["stream"] == s.cuda_stream for c in launches)
    torch.testing.assert_close(out.float(), ref, atol=4e-3, rtol=2e-3)


@pytest.mark.parametrize("case", ["prefill", "split decode", "split decode, ordinary merge",
                                  "bool mask", "lse"])
def test_torch_memo(case, monkeypatch):
    """A repeated call on CUDA tensors of one layout takes the tensor memo: no CuPy view,
    results that torch allocates, every launch (a split decode's merge too, dependent or
    ordinary) on torch's current stream, the full path's bits on the same inputs and on fresh
    ones. Tensors that require grad still raise; a float mask of another dtype (cast each
    call) is not memoized."""
    torch = _torch_cuda()
    from _gpu import spy_launches

    attention_module = importlib.import_module("cunorm.attention")
    monkeypatch.setattr(attention_module, "_TORCH_MEMO", {})
    split = case.startswith("split decode")
    if case == "split decode, ordinary merge":  # a launch prepared afresh without the PDL
        monkeypatch.setattr(launch_module(), "DEPENDENT_COMBINE", False)
        monkeypatch.setattr(attention_module, "_MEMO", {})
    launched = spy_launches(monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(11)

    def make():
        if split:  # Lk 20000, one query: key splits and their merge
            return (torch.randn(1, 32, 1, 128, device="cuda", generator=gen, dtype=torch.bfloat16),
                    *(torch.randn(1, 8, 20000, 128, device="cuda", generator=gen,
                                  dtype=torch.bfloat16) for _ in range(2)), None)
        q, k, v = (torch.randn(2, n, h, 64, device="cuda", generator=gen,
                               dtype=torch.float16).transpose(1, 2)
                   for n, h in ((33, 8), (90, 2), (90, 2)))
        mask = (torch.rand(2, 1, 1, 90, device="cuda", generator=gen) > 0.3
                if case == "bool mask" else None)
        return q, k, v, mask

    def call(q, k, v, mask):
        return cunorm.attention(q, k, v, mask=mask, return_lse=case == "lse")

    def parts(res):
        return res if isinstance(res, tuple) else (res,)

    first_in = make()
    first = parts(call(*first_in))  # the full path: registers the layouts
    assert len(attention_module._TORCH_MEMO) == 1
    if split:
        (fast,) = attention_module._TORCH_MEMO.values()
        arch = importlib.import_module("cunorm._device").device_props(
            torch.cuda.current_device()).arch
        pdl = importlib.import_module("cunorm._driver_launch").available(arch)
        assert fast.launch.merge.dependent == (case == "split decode" and pdl)
    fresh_in = make()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # the inputs, made on the current stream
    with monkeypatch.context() as m, torch.cuda.stream(s):
        m.setattr(cunorm._array, "to_cupy", None)  # a CuPy view would fail the call
        launched.clear()
        again = parts(call(*first_in))
        fresh = parts(call(*fresh_in))
    s.synchronize()
    per_call = 2 if split else 1
    assert [stream for *_, stream in launched] == [s.cuda_stream] * (2 * per_call)
    monkeypatch.setattr(attention_module, "_TORCH_MEMO", {})
    full = parts(call(*fresh_in))  # the full path on the fresh inputs
    for got, want in ((again, first), (fresh, full)):
        assert len(got) == len(want) == (2 if case == "lse" else 1)
        for a, b in zip(got, want, strict=True):
            assert a.is_contiguous() and a.dtype == b.dtype and a.device == b.device
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    q, k, v, mask = first_in
    with pytest.raises((RuntimeError, BufferError), match="grad"):
        call(q.detach().clone().requires_grad_(), k, v, mask)
    if case == "prefill":  # a float32 mask for float16 q: cast on every call, never memoized
        monkeypatch.setattr(attention_module, "_TORCH_MEMO", {})
        call(q, k, v, torch.zeros(2, 1, 1, 90, device="cuda"))
        assert not attention_module._TORCH_MEMO


# --- JAX -------------------------------------------------------------------------------------
def test_jax_round_trip(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with CuPy
    jax = pytest.importorskip("jax", reason="jax is not installed")
    jnp = pytest.importorskip("jax.numpy")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    rng = np.random.default_rng(3)
    qh = randn(rng, (2, 4, 33, 64), BF16)
    kh, vh = randn(rng, (2, 2, 70, 64), BF16), randn(rng, (2, 2, 70, 64), BF16)
    mh = rng.random((33, 70)) > 0.3
    qj, kj, vj, mj = (jax.device_put(jnp.asarray(a), gpu) for a in (qh, kh, vh, mh))
    out, lse = cunorm.attention(qj, kj, vj, mask=mj, causal=True, return_lse=True)
    assert isinstance(out, jax.Array) and np.dtype(out.dtype) == BF16
    assert out.shape == (2, 4, 33, 64)
    assert isinstance(lse, jax.Array) and np.dtype(lse.dtype) == np.float32
    assert lse.shape == (2, 4, 33)
    ref, ref_lse = reference(qh, kh, vh, causal=True, mask=mh)
    assert row_errors(np.asarray(out), ref).max() <= TOL["bfloat16"]
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="immutable"):
        cunorm.attention(qj, kj, vj, out=qj)
    with pytest.raises(TypeError, match="k is a numpy array but q is a jax array"):
        cunorm.attention(qj, kh, vj)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize(("d", "lq", "lk", "causal", "masked"), [
    (128, 1, 4096, False, False),  # the decoding benchmark's shortest cache
    (64, 1, 4003, False, True),    # ragged last key tile, a boolean mask with dead keys
    (96, 3, 3001, True, False),    # 3 query positions a head: 12 rows, causal bottom-right
    (32, 1, 2048, False, False),   # 32 tiles: 2 a split
])
def test_clustered_key_splits(rng, dtype, d, lq, lk, causal, masked):
    """Decoding rows whose key splits run as one cluster merging them in distributed shared
    memory (attn_tc_cluster) write what the workspace merge (the same split count forced,
    attn_combine) writes, within rounding, and are within the float64 reference's bounds;
    lse as well. Also a fully masked row (every key dropped) gives 0 and -inf."""
    dispatch = importlib.import_module("cunorm._attn_dispatch")
    hkv, group = 2, 4
    q = cupy.asarray(rng.standard_normal((1, hkv * group, lq, d))).astype(dtype)
    k, v = (cupy.asarray(rng.standard_normal((1, hkv, lk, d))).astype(dtype) for _ in range(2))
    mask = None
    if masked:
        keep = rng.random((1, hkv * group, lq, lk)) > 0.3
        keep[0, 1] = False  # query head 1 sees no key
        mask = cupy.asarray(keep)
    out = cupy.full(q.shape, np.nan, dtype)  # poisoned
    lse = cupy.full(q.shape[:-1], np.nan, np.float32)
    launch = launch_module().prepare(q, k, v, out, causal=causal, scale=1 / math.sqrt(d),
                                     mask=mask, lse=lse)
    props = importlib.import_module("cunorm._device").device_props(q.data.device_id)
    if not props.has_clusters or props.max_cluster < dispatch.TC_CLUSTER:
        pytest.skip(f"this GPU runs no clusters of {dispatch.TC_CLUSTER} blocks")
    assert launch.plan.splits == dispatch.TC_CLUSTER and "attn_tc_cluster<" in launch.plan.kernel
    got, got_lse = cunorm.attention(q, k, v, causal=causal, mask=mask, return_lse=True,
                                    out=out)
    with force_split(dispatch.TC_CLUSTER):
        ws, ws_lse = cunorm.attention(q, k, v, causal=causal, mask=mask, return_lse=True)
    ref, ref_lse = reference(q, k, v, causal=causal, mask=mask)
    assert not cupy.isnan(got).any() and not cupy.isnan(got_lse).any()
    err = row_errors(got, ref)
    assert err.max() <= TOL[dtype.name], err.max()
    assert err.max() <= 1.01 * row_errors(ws, ref).max() + 2 * UNIT[dtype.name]
    np.testing.assert_allclose(to_host(got_lse), ref_lse, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_host(got_lse), to_host(ws_lse), rtol=1e-6, atol=1e-6)
    if masked:
        assert (to_host(got)[0, 1] == 0).all() and np.isneginf(to_host(got_lse)[0, 1]).all()


@pytest.mark.parametrize(("d", "lq", "lk", "planned", "eligible"), [
    (128, 1, 4096, True, True),     # cluster decoding on sm_90
    (128, 1, 16384, True, True),    # key splits merged by attn_combine
    (128, 1, 65536, False, True),   # past the L2 limit
    (128, 8, 8192, True, True),     # 32 rows a KV head: one 64-row tile, KS = 1
    (256, 1, 8192, False, False),   # 32-key tiles: never, even forced
])
def test_kv_stream_reads_change_no_bit(rng, d, lq, lk, planned, eligible):
    """Decoding's K/V reads under L2 evict_first (_attn_dispatch.kv_stream) give the same
    bits as plain reads, output and lse; the planner takes them where planned, and
    force_kv_stream wherever the plan is eligible."""
    dispatch = importlib.import_module("cunorm._attn_dispatch")
    q = cupy.asarray(rng.standard_normal((1, 32, lq, d))).astype(BF16)
    k, v = (cupy.asarray(rng.standard_normal((1, 8, lk, d))).astype(BF16) for _ in range(2))
    out = cupy.empty_like(q)
    launch = launch_module().prepare(q, k, v, out, causal=False, scale=1 / math.sqrt(d))
    assert launch.plan.kv_stream == planned and launch.plan.row_tiles == 1
    results = {}
    for forced in (None, True, False):
        with dispatch.force_kv_stream(forced):
            assert launch_module().prepare(q, k, v, out, causal=False,
                                           scale=0.5).plan.kv_stream == (
                planned if forced is None else forced and eligible)
            for _ in range(2):  # the first call plans, the second takes the memo
                with poisoned_allocations():  # unwritten results (and partials) read NaN
                    got, lse = cunorm.attention(q, k, v, return_lse=True)
            results[forced] = (to_host(got).view(np.uint16), to_host(lse))
    for forced in (True, False):
        np.testing.assert_array_equal(results[forced][0], results[None][0])
        np.testing.assert_array_equal(results[forced][1], results[None][1])
    ref, ref_lse = reference(q, k, v)
    assert row_errors(results[None][0].view(BF16), ref).max() <= TOL["bfloat16"]
    np.testing.assert_allclose(results[None][1], ref_lse, rtol=1e-5, atol=1e-5)


# (B, Hq, Hkv, Lq, Lk, causal, mask): rows that fill an H100 / H200 with 128-row tiles (so
# the planner's own persistent attn_ws grid runs several rounds a block), query tiles that
# span heads (grouped queries, Lq not a multiple of the tile), ragged key tiles, a boolean
# mask with a fully masked head, causal rows longer and shorter than the keys
WS_CASES = [(8, 16, 16, 1024, 1024, False, False), (4, 8, 8, 600, 600, True, False),
            (3, 16, 4, 333, 517, True, False), (2, 32, 8, 277, 1000, False, True),
            (2, 16, 16, 700, 129, True, False), (1, 64, 8, 300, 300, False, False)]


@pytest.mark.parametrize("case", WS_CASES, ids=lambda c: "x".join(map(str, c[:5])) + "c" * c[5]
                         + "m" * c[6])
@pytest.mark.parametrize("d", [16, 20, 32, 40, 64, 80, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_warp_specialized_kernel(rng, dtype, d, case):
    """attn_ws (sm_90a; elsewhere the forced choice runs the planner's kernel) against the
    float64 reference and, bit for bit, attn_wg on the same inputs where both take the same
    key tiles (128 keys: all but causal rows of at most 512 keys at head dims 65-128, which
    attn_wg runs on 64-key tiles; at head dims up to 32, padded to 64, those rows run attn_tc
    either way); outputs poisoned."""
    b, hq, hkv, lq, lk, causal, masked = case
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    q = cupy.asarray(randn(rng, (b, hq, lq, d), dt))
    k, v = (cupy.asarray(randn(rng, (b, hkv, lk, d), dt)) for _ in range(2))
    mask = None
    if masked:
        keep = rng.random((b, hq, lq, lk)) > 0.3
        keep[0, 1] = False  # a fully masked head
        mask = cupy.asarray(keep)
    ref, ref_lse = reference(q, k, v, causal=causal, mask=mask)
    live = ~np.isneginf(ref_lse).reshape(-1)
    nerr = float(row_errors(naive(q, k, v, causal=causal, mask=mask), ref)[live].max(initial=0.0))
    outs = {}
    for ws in (True, False):
        out = cupy.full((b, hq, lq, d), np.nan, dt)
        with force_choices(None, None, None, ws):
            res, lse = cunorm.attention(q, k, v, causal=causal, mask=mask, out=out,
                                        return_lse=True)
        check(res, lse, ref, ref_lse, nerr, dt, f"ws={ws}")
        outs[ws] = (cupy.asnumpy(res), cupy.asnumpy(lse))
    if not (causal and lk <= 512 and d > 64):
        assert np.array_equal(outs[True][0], outs[False][0], equal_nan=True)
        assert np.array_equal(outs[True][1], outs[False][1])


@pytest.mark.parametrize("scale", [-0.3, 0.0, 0.05])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_any_sign_of_scale(rng, dtype, masked, scale):
    """Zero and negative scales are right on every 16-bit path: the warpgroup kernels take
    the row max of the unscaled scores and fold the scale into the exponent, which holds for
    a positive scale only, so the planner sends the others to attn_tc; a positive one runs
    them (attn_ws and attn_wg forced on sm_90a), causal and not, with and without a mask."""
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    b, hq, hkv, lq, lk, d = 2, 8, 4, 200, 333, 64
    q = cupy.asarray(randn(rng, (b, hq, lq, d), dt))
    k, v = (cupy.asarray(randn(rng, (b, hkv, lk, d), dt)) for _ in range(2))
    mask = cupy.asarray(rng.random((lq, lk)) > 0.3) if masked else None
    for causal in (False, True):
        ref, ref_lse = reference(q, k, v, causal=causal, scale=scale, mask=mask)
        live = ~np.isneginf(ref_lse).reshape(-1)
        nerr = float(row_errors(naive(q, k, v, causal=causal, scale=scale, mask=mask),
                                ref)[live].max(initial=0.0))
        for ws in (None, True, False):
            out = cupy.full((b, hq, lq, d), np.nan, dt)
            with force_choices(None, None, None, ws):
                res, lse = cunorm.attention(q, k, v, causal=causal, scale=scale, mask=mask,
                                            out=out, return_lse=True)
            check(res, lse, ref, ref_lse, nerr, dt, f"scale={scale} causal={causal} ws={ws}")


def check_forced_paths(q, k, v, mask, causal: bool, extra_choices, where: str) -> None:
    """cunorm.attention on q, k, v (float64 reference, lse included, output poisoned) with the
    planner's choice, two warpgroups a block, attn_ws on and off, and ``extra_choices``
    ((split, groups, ws) tuples) forced."""
    ref, ref_lse = reference(q, k, v, causal=causal, mask=mask)
    live = ~np.isneginf(ref_lse).reshape(-1)
    nerr = float(row_errors(naive(q, k, v, causal=causal, mask=mask), ref)[live].max(initial=0.0))
    for split, groups, ws in ((None, None, None), (None, 2, None), (None, None, True),
                              (None, None, False), *extra_choices):
        out = cupy.full((*q.shape[:-1], v.shape[-1]), np.nan, q.dtype)
        with force_choices(split, groups, None, ws):
            res, lse = cunorm.attention(q, k, v, causal=causal, mask=mask, out=out,
                                        return_lse=True)
        check(res, lse, ref, ref_lse, nerr, q.dtype,
              f"{where} causal={causal} split={split} groups={groups} ws={ws}")


@pytest.mark.parametrize("climb", [25.0, 60.0])
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_row_max_growing_along_the_keys(rng, dtype, d, climb):
    """Scores that climb along every row (by ``climb`` natural-log units over the keys, at a
    rate that differs from row to row), so the row maximum grows tile after tile: at head dims
    of 128 and up the warpgroup kernels keep a lazy reference maximum, which then moves in the
    middle of rows on some tiles and stays on others, with some lanes of a warp moving and
    others not. Every forced path (key splits, warpgroups, attn_ws on and off), causal and
    not, with and without a mask (one fully masked query row), against the float64 reference,
    lse included; outputs poisoned."""
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    b, hq, hkv, lq, lk = 1, 4, 2, 200, 700
    q = rng.standard_normal((b, hq, lq, d))
    k = rng.standard_normal((b, hkv, lk, d))
    # column 0 carries the climb: q_i . k_j / sqrt(d) gains rate_i * climb * j / lk
    q[..., 0] = math.sqrt(d) * rng.uniform(0.3, 1.0, (b, hq, lq))
    k[..., 0] = climb * np.arange(lk) / lk
    q, k = cupy.asarray(q.astype(dt)), cupy.asarray(k.astype(dt))
    v = cupy.asarray(randn(rng, (b, hkv, lk, d), dt))
    keep = rng.random((lq, lk)) > 0.2
    keep[7] = False
    for mask in (None, cupy.asarray(keep)):
        for causal in (False, True):
            check_forced_paths(q, k, v, mask, causal, ((2, None, None), (7, None, None)),
                               f"climb={climb} mask={mask is not None}")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mask_layouts_on_long_rows(rng, dtype, d):
    """Explicit masks in every layout the kernels read differently, over rows of several key
    tiles: contiguous along the keys (bool and additive; the kernels find a row's mask offset
    once a tile and read its values at constant offsets), a transposed view (key stride Lq)
    and a mask broadcast along the keys (key stride 0), both through the general per-score
    form. Every forced path, causal and not, a fully masked query row, lse included, against
    the float64 reference; outputs poisoned."""
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    b, hq, hkv, lq, lk = 2, 4, 2, 150, 700
    q, k, v = (cupy.asarray(randn(rng, shape, dt))
               for shape in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))
    keep = rng.random((b, 1, lq, lk)) > 0.3
    keep[:, :, 9] = False
    additive = np.where(keep, 0.5 * rng.standard_normal(keep.shape), -np.inf).astype(dt)
    masks = {
        "bool": cupy.asarray(keep),
        "additive": cupy.asarray(additive),
        "bool transposed": cupy.asarray(keep.swapaxes(-1, -2).copy()).swapaxes(-1, -2),
        "additive over queries": cupy.asarray(additive[0, 0, :, :1]),  # (Lq, 1)
    }
    for name, mask in masks.items():
        for causal in (False, True):
            check_forced_paths(q, k, v, mask, causal, ((3, None, None), (None, 1, None)),
                               f"mask={name}")


@pytest.mark.parametrize("lq", [1, 150])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_nan_score_gives_nan_row(rng, dtype, lq):
    """A NaN key that no mask removes makes every row that sees it NaN, out and lse, on every
    path: unsplit, key splits merged by attn_combine, clusters (decoding); every other row as
    the reference. (A split merge returned such rows as 0 with lse -inf, and the unsplit
    kernels an lse of -inf beside a NaN output.)"""
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    b, hq, hkv, lk, d = 2, 4, 2, 700, 64
    q, k, v = (cupy.asarray(randn(rng, shape, dt))
               for shape in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))
    k[0, 1, 600, 7] = np.nan  # batch 0, KV head 1: query heads 2, 3 (causal: rows from 50 on)
    for causal in (False, True):
        ref, ref_lse = reference(q, k, v, causal=causal)
        bad = np.isnan(ref_lse)
        assert bad.any() and not bad.all()
        for choice in CHOICES + [(3, None, None, None), (16, None, None, None)]:
            out = cupy.full((b, hq, lq, d), 1.0, dt)  # poisoned with a finite value
            with force_choices(*choice):
                res, lse = cunorm.attention(q, k, v, causal=causal, out=out, return_lse=True)
            got, got_lse = to_host(res).astype(np.float64), to_host(lse)
            where = f"causal={causal} choice={choice}"
            assert np.isnan(got[bad]).all() and np.isnan(got_lse[bad]).all(), where
            assert not np.isnan(got[~bad]).any() and not np.isnan(got_lse[~bad]).any(), where
            err = float(row_errors(got[~bad], ref[~bad]).max())
            assert err <= TOL[dt.name], (where, err)


@pytest.mark.parametrize("lq", [1, 150])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_bool_mask_drops_nonfinite_keys(rng, d, lq):
    """A bool mask selects: K rows of NaN and +-inf at keys that every query masks out leave
    every output as the reference without them, with a contiguous padding mask (B, 1, 1, Lk)
    and a (B, 1, Lq, Lk) view of key stride 2 (the general per-score form, decoding
    included), decoding (Lq = 1: key splits, clusters) and prefill, every forced path, causal
    and not. An additive -inf would give NaN there, as it does in torch."""
    b, hq, hkv, lk = 2, 4, 2, 700
    q, k, v = (cupy.asarray(randn(rng, shape, BF16))
               for shape in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))
    lens = np.array([650, 420])
    k[0, :, 650:653] = cupy.asarray(np.array([[np.nan], [np.inf], [-np.inf]]).astype(BF16))
    k[1, :, 600:] = np.nan
    keep = np.arange(lk)[None, :] < lens[:, None]
    wide = np.repeat(np.broadcast_to(keep[:, None, None, :], (b, 1, lq, lk)), 2, axis=-1)
    masks = {"padding": cupy.asarray(keep.reshape(b, 1, 1, lk)),
             "key stride 2": cupy.asarray(wide)[..., ::2]}
    for name, mask in masks.items():
        for causal in (False, True):
            check_forced_paths(q, k, v, mask, causal, ((3, None, None), (16, None, None)),
                               f"mask={name}")


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
@pytest.mark.parametrize("d", [64, 128])
def test_causal_mask_drops_nonfinite_future_keys(rng, d, mask_kind):
    """Under causal=True with an explicit mask, a key past a query's causal bound is out of
    its row whatever its scores: K rows of NaN and inf at keys 381-383 (the end of the third
    128-key tile, which only the causal bound cuts) leave every query that cannot see them
    exactly as without them (the warpgroup kernels read a contiguous additive mask without a
    select only on key tiles that no row's causal bound cuts). Every forced path, against the
    float64 reference of the clean K."""
    dt = BF16
    b, hq, hkv, n = 1, 4, 2, 700
    q, k, v = (randn(rng, (b, h, n, d), dt) for h in (hq, hkv, hkv))
    keep = rng.random((n, n)) > 0.2
    mask = keep if mask_kind == "bool" else np.where(keep, 0.5 * rng.standard_normal((n, n)),
                                                     -np.inf).astype(dt)
    ref, _ = reference(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), causal=True,
                       mask=cupy.asarray(mask))
    bad_k = k.copy()
    seen = 381  # queries 0 .. 380 see none of keys 381 .. 383
    bad_k[..., seen:seen + 3, :] = np.array([[np.nan], [np.inf], [-np.inf]]).astype(dt)
    q, bad_k, v, mask = (cupy.asarray(a) for a in (q, bad_k, v, mask))
    for split, groups, ws in ((None, None, None), (None, 2, None), (None, None, True),
                              (None, None, False), (3, None, None)):
        with force_choices(split, groups, None, ws):
            out = to_host(cunorm.attention(q, bad_k, v, causal=True, mask=mask))
        got = np.asarray(out, np.float64)[..., :seen, :]
        where = f"{mask_kind} split={split} groups={groups} ws={ws}"
        assert np.isfinite(got).all(), where
        err = float(row_errors(got, ref[..., :seen, :]).max())
        assert err <= TOL["bfloat16"], f"{where}: error {err:.3g}"
