"""Launch fused attention on normalized CuPy operands (the plan step of
:mod:`cunorm._attn_dispatch`, then ``cuda_src/attention.cu``). :mod:`cunorm.attention`
validates and normalizes user arrays before calling :func:`launch_attention`."""

from __future__ import annotations

import numpy as np

from . import _attn_dispatch
from ._device import device_props
from ._kernels import get_kernel, occupancy

# (device, dtype, d, dv, lq, lk, batch, hkv, group, forced split) -> (plan, kernel, combine)
_PLANS: dict[tuple, tuple] = {}

_MASK_KIND = {None: 0, "bool": 1, "additive": 2}


def _strides(a, name: str) -> tuple[int, ...]:
    """Element strides of a CuPy array (byte strides must be whole elements)."""
    out = []
    for s in a.strides:
        if s % a.itemsize:
            raise ValueError(f"{name}: stride {s} bytes is not a whole number of elements")
        out.append(s // a.itemsize)
    return tuple(out)


def _aligned16(a, strides: tuple[int, ...], itemsize: int) -> bool:
    """16-byte aligned start and row strides (head-dim axis excluded) of a 4-D operand."""
    return a.data.ptr % 16 == 0 and all((s * itemsize) % 16 == 0 for s in strides[:3])


def launch_attention(q, k, v, out, *, causal: bool, scale: float, mask=None, lse=None) -> None:
    """Run attention on CuPy operands, writing ``out`` (and ``lse``).

    Parameters
    ----------
    q : cupy.ndarray
        ``(B, Hq, Lq, D)``, any strides in elements (0 allowed on B and H), unit-stride last
        axis.
    k, v : cupy.ndarray
        ``(B, Hkv, Lk, D)`` and ``(B, Hkv, Lk, Dv)``, same dtype as ``q``; ``Hq % Hkv == 0``.
    out : cupy.ndarray
        ``(B, Hq, Lq, Dv)``, same dtype, unit-stride last axis.
    causal : bool
        Query ``i`` sees key ``j`` iff ``j <= i + Lk - Lq``.
    scale : float
        Multiplies the scores.
    mask : cupy.ndarray, optional
        ``(B, Hq, Lq, Lk)`` view (broadcast strides allowed), bool (True = keep) or ``q``'s
        dtype (added to the scaled scores).
    lse : cupy.ndarray, optional
        float32 ``(B, Hq, Lq)``: receives the natural-log log-sum-exp of each row's scaled,
        masked scores (``-inf`` for a fully masked row).
    """
    import cupy

    bsz, hq, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    dtype = q.dtype.name
    qs, ks, vs, os_ = (_strides(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out")))
    isz = q.itemsize
    vec = (d % 8 == 0 and dv % 8 == 0 and
           all(_aligned16(a, s, isz) for a, s in ((q, qs), (k, ks), (v, vs), (out, os_))))
    dev = q.data.device_id
    forced = _attn_dispatch.forced_split()
    key = (dev, dtype, d, dv, lq, lk, bsz, hkv, group, forced)
    entry = _PLANS.get(key)
    if entry is None:
        entry = _PLANS[key] = _make_plan(dev, dtype, d, dv, lq, lk, bsz, hkv, group)
    plan, kernel, combine = entry

    i64, null = np.int64, np.uint64(0)
    kind = _MASK_KIND[None if mask is None else ("bool" if mask.dtype == np.bool_ else "additive")]
    ms = (0, 0, 0, 0) if mask is None else _strides(mask, "mask")
    ls = (0, 0, 0) if lse is None else _strides(lse, "lse")
    rows = group * lq
    part_rows = bsz * hkv * rows
    o_part = stat_part = None
    if plan.splits > 1:
        # AttnWork<T> of attention.cu: float on tensor cores, double on the SIMT path
        work = np.float64 if dtype in _attn_dispatch.SIMT_DTYPES else np.float32
        o_part = cupy.empty((plan.splits, part_rows, dv), work)
        stat_part = cupy.empty((plan.splits, part_rows, 2), work)  # (row max, row sum)
    args = (q, k, v, out, null if lse is None else lse,
            null if o_part is None else o_part, null if stat_part is None else stat_part,
            null if mask is None else mask, np.int32(kind), np.int32(hkv), np.int32(group),
            i64(lq), i64(lk), np.int32(d), np.int32(dv),
            *(i64(s) for s in qs[:3]), *(i64(s) for s in ks[:3]), *(i64(s) for s in vs[:3]),
            *(i64(s) for s in os_[:3]), *(i64(s) for s in ls), *(i64(s) for s in ms),
            np.float64(scale), np.int32(bool(causal)), np.int32(vec), i64(plan.row_tiles))
    kernel(plan.grid, (plan.block,), args, shared_mem=plan.smem)
    if plan.splits > 1:
        combine((part_rows,), (_attn_dispatch.COMBINE_THREADS,),
                (o_part, stat_part, np.int32(plan.splits), i64(part_rows), out,
                 null if lse is None else lse, np.int32(hkv), np.int32(group), i64(lq),
                 np.int32(dv), *(i64(s) for s in os_[:3]), *(i64(s) for s in ls)))


def _make_plan(dev: int, dtype: str, d: int, dv: int, lq: int, lk: int, bsz: int, hkv: int,
               group: int):
    props = device_props(dev)

    def kernel_for(name: str):
        return get_kernel(dev, props.arch, "attention.cu", name,
                          smem_optin=props.smem_per_block_optin)

    def occ(name: str, block: int, smem: int) -> int:
        return occupancy(kernel_for(name), block, smem)

    plan = _attn_dispatch.plan_attention(dtype, d, dv, lq, lk, bsz, hkv, group, props, occ)
    return plan, kernel_for(plan.kernel), kernel_for(plan.combine)
