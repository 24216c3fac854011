"""GPU tests of the attention launcher (:func:`cunorm._attn_launch.launch_attention`) on
normalized (B, H, L, D) operands: every kernel, split count, alignment case, mask kind and
causal layout against a float64 reference. The public API is tested in test_gpu_attention.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu import DTYPES, GPU_MARKS, TOL, cupy  # the shared GPU preamble

from cunorm import _attn_dispatch

pytestmark = GPU_MARKS


def reference(q, k, v, causal, scale, mask=None):
    """float64 (out, lse) from host arrays (B, H, L, D); mask (B, Hq, Lq, Lk) bool or float."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    lq, lk = q.shape[2], k.shape[2]
    keep = np.ones(s.shape, bool)
    if causal:
        keep &= np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq
    if mask is not None:
        if mask.dtype == np.bool_:
            keep &= mask
        else:
            s = s + mask.astype(np.float64)
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    denom = p.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(denom > 0, np.einsum("bhqk,bhkd->bhqd", p, v) / denom, 0.0)
        lse = np.where(denom[..., 0] > 0, np.log(denom[..., 0]) + m_safe[..., 0], -np.inf)
    return out, lse


def rel_err(y, ref):
    y = np.asarray(y, np.float64).reshape(-1, ref.shape[-1])
    ref = ref.reshape(-1, ref.shape[-1])
    num = np.abs(y - ref).max(axis=-1)
    den = np.maximum(np.abs(ref).max(axis=-1), 1e-30)
    return float((num / den).max())


def run(dtype, b, hq, hkv, lq, lk, d, dv, causal=False, mask=None, split=None, layout="bhld",
        rng=None, poison=True):
    rng = rng or np.random.default_rng(0)

    def make(h, length, dim):
        host = rng.standard_normal((b, h, length, dim)).astype(dtype)
        if layout == "blhd":  # (B, L, H, D) memory seen as (B, H, L, D): strided, no copy
            blhd = cupy.asarray(np.ascontiguousarray(host.transpose(0, 2, 1, 3)))
            dev = blhd.transpose(0, 2, 1, 3)
        else:
            dev = cupy.asarray(host)
        return host, dev

    (qh, q), (kh, k), (vh, v) = make(hq, lq, d), make(hkv, lk, d), make(hkv, lk, dv)
    out = cupy.full((b, hq, lq, dv), np.nan if poison else 0, dtype)
    lse = cupy.full((b, hq, lq), np.nan, np.float32)
    scale = 1.0 / np.sqrt(d)
    from cunorm._attn_launch import launch_attention

    mdev = None if mask is None else cupy.asarray(mask)
    if mdev is not None and mdev.dtype != np.bool_:
        mdev = mdev.astype(dtype)
    with _attn_dispatch.force_split(split):
        launch_attention(q, k, v, out, causal=causal, scale=scale, mask=mdev, lse=lse)
    hmask = mask if mask is None or mask.dtype == np.bool_ else mask.astype(dtype)
    ref_out, ref_lse = reference(qh, kh, vh, causal, scale, hmask)
    return cupy.asnumpy(out), cupy.asnumpy(lse), ref_out, ref_lse


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize(("d", "dv"), [(64, 64), (128, 128), (32, 32), (256, 256), (40, 40),
                                       (96, 64), (17, 33)])
@pytest.mark.parametrize("causal", [False, True])
def test_kernels_against_float64(dtype, d, dv, causal):
    out, lse, ref, ref_lse = run(dtype, 2, 4, 2, 77, 131, d, dv, causal)
    assert rel_err(out, ref) <= TOL[dtype.name], (d, dv, causal)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("split", [1, 2, 7])
@pytest.mark.parametrize(("lq", "lk", "causal"), [(1, 1000, False), (5, 300, True),
                                                  (300, 200, True), (1, 1, False)])
def test_splits_and_ragged(dtype, split, lq, lk, causal):
    out, lse, ref, ref_lse = run(dtype, 1, 8, 2, lq, lk, 64, 64, causal, split=split)
    masked = ~np.isfinite(ref_lse)
    assert (out[masked] == 0).all() and np.isneginf(lse[masked]).all()
    assert rel_err(out[~masked], ref[~masked]) <= TOL[dtype.name]
    np.testing.assert_allclose(lse[~masked], ref_lse[~masked], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks_and_strided_layout(dtype, kind):
    rng = np.random.default_rng(1)
    lq, lk = 70, 90
    if kind == "bool":
        mask = rng.random((2, 4, lq, lk)) < 0.7
        mask[:, :, 3, :] = False  # a fully masked row
    else:
        mask = rng.standard_normal((2, 4, lq, lk))
    for layout in ("bhld", "blhd"):
        out, lse, ref, ref_lse = run(dtype, 2, 4, 4, lq, lk, 64, 64, False, mask, None, layout,
                                     rng)
        finite = np.isfinite(ref_lse)
        assert rel_err(out[finite], ref[finite]) <= TOL[dtype.name], layout
        assert (out[~finite] == 0).all() and np.isneginf(lse[~finite]).all()


def test_every_kernel_name_is_planned():
    names = set(_attn_dispatch.all_kernel_names(90))
    assert any("attn_tc" in n for n in names) and any("attn_simt" in n for n in names)


@pytest.mark.parametrize("dependent", [False, True], ids=["ordinary", "dependent"])
def test_split_merge_launch_forms(dependent, monkeypatch):
    """The split-KV merge launched as a programmatic dependent of the attention kernel (on
    sm_90: resident while the kernel runs, waiting in griddep_wait for its partial rows) and as
    an ordinary launch after it. Fresh inputs every call: a merge that read before the partial
    rows were complete would meet the previous call's."""
    from cunorm import _attn_launch, _driver_launch
    from cunorm._device import device_props

    monkeypatch.setattr(_attn_launch, "DEPENDENT_COMBINE", dependent)
    dtype = np.dtype(np.float16)
    q = cupy.zeros((1, 32, 1, 128), dtype)
    kv = cupy.zeros((1, 8, 20000, 128), dtype)
    with _attn_dispatch.force_split(43):
        launch = _attn_launch.prepare(q, kv, kv, cupy.empty_like(q), causal=False, scale=1.0)
    assert launch.plan.splits == 43
    arch = device_props(q.data.device_id).arch
    assert launch.merge.dependent == (dependent and _driver_launch.available(arch))
    rng = np.random.default_rng(5)
    for _ in range(3):
        out, lse, ref, ref_lse = run(dtype, 1, 32, 8, 1, 20000, 128, 128, split=43, rng=rng)
        assert rel_err(out, ref) <= TOL[dtype.name]
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_split_merge_from_threads():
    """Two threads decoding on their own streams through one memoized launch (so one shared
    dependent-launch argument buffer on sm_90): each thread gets its own inputs' results."""
    import threading

    import cunorm

    dtype = np.dtype(np.float16)
    rng = np.random.default_rng(9)
    inputs, refs = [], []
    for _ in range(2):
        qh = rng.standard_normal((1, 32, 1, 128)).astype(dtype)
        kh, vh = (rng.standard_normal((1, 8, 20000, 128)).astype(dtype) for _ in range(2))
        inputs.append(tuple(cupy.asarray(a) for a in (qh, kh, vh)))
        refs.append(reference(qh, kh, vh, False, 1.0 / np.sqrt(128))[0])
    cunorm.attention(*inputs[0])  # plan, compile and memoize once
    cupy.cuda.Device().synchronize()
    errs: list[float | BaseException] = [np.inf, np.inf]  # inf: the thread never finished

    def work(i: int) -> None:
        try:
            worst = 0.0
            with cupy.cuda.Stream(non_blocking=True) as stream:
                for _ in range(20):
                    out = cunorm.attention(*inputs[i])
                    stream.synchronize()
                    worst = max(worst, rel_err(cupy.asnumpy(out), refs[i]))
            errs[i] = worst
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errs[i] = err

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(e, float) and e <= TOL[dtype.name] for e in errs), errs
