"""Launch fused attention on normalized CuPy operands (the plan step of
:mod:`cunorm._attn_dispatch`, then ``cuda_src/attention.cu``). :mod:`cunorm.attention`
validates and normalizes user arrays before calling :func:`launch_attention`."""

from __future__ import annotations

import functools
import operator

import numpy as np

from . import _array, _attn_dispatch, _driver_launch
from ._cache import BoundedCache
from ._device import device_props
from ._kernels import get_kernel, occupancy

#: Launch the split-KV merge (attn_combine) as a programmatic dependent of the attention
#: kernel where the device and driver allow it (:mod:`cunorm._driver_launch`). False: an
#: ordinary launch after it (for measurements; prepared launches keep the setting they were
#: made with).
DEPENDENT_COMBINE = True

# (device, dtype, d, dv, lq, lk, batch, hkv, group, causal, masked, scale > 0, forced choices)
# -> (plan, the forward kernel's KernelLaunch, the merge kernel or None)
_PLANS: dict[tuple, tuple] = BoundedCache()
# (device, merge kernel name, part rows, dependent) -> the merge's _driver_launch.KernelLaunch,
# shared by the plans of every Lk (each fire fills its arguments)
_MERGES: dict[tuple, _driver_launch.KernelLaunch] = BoundedCache()

_MASK_KIND = {None: 0, "bool": 1, "additive": 2}


def _struct(i64_fields: str, f64_fields: str, i32_fields: str) -> np.dtype:
    """A C struct of int64, then double, then int fields as a NumPy dtype: no padding
    between fields, and C's tail padding to a multiple of 8 bytes where there are 8-byte
    fields (the size the kernel's parameter has)."""
    names = [*i64_fields.split(), *f64_fields.split(), *i32_fields.split()]
    wide = len(i64_fields.split()) + len(f64_fields.split())
    formats = ([np.int64] * len(i64_fields.split()) + [np.float64] * len(f64_fields.split())
               + [np.int32] * len(i32_fields.split()))
    packed = np.dtype({"names": names, "formats": formats})
    size = -(-packed.itemsize // 8) * 8 if wide else packed.itemsize
    return np.dtype({"names": names, "formats": formats, "itemsize": size})


#: ``struct AttnArgs`` of attention.cu (the forward kernels' scalar arguments)
ATTN_ARGS = _struct("lq lk q_sb q_sh q_sl k_sb k_sh k_sl v_sb v_sh v_sl o_sb o_sh o_sl lse_sb "
                    "lse_sh lse_sl m_sb m_sh m_sq m_sk row_tiles", "scale",
                    "mask_kind hkv group d dv causal vec items kv_stream")

#: ``struct CombineArgs`` of attention.cu (attn_combine's scalar arguments)
COMBINE_ARGS = _struct("part_rows lq o_sb o_sh o_sl lse_sb lse_sh lse_sl", "",
                       "splits hkv group dv")


@functools.cache
def _fields_of(dtype: np.dtype) -> operator.itemgetter:
    """A dict's values in the order of ``dtype``'s fields, in one call."""
    return operator.itemgetter(*dtype.names)


def _records(dtype: np.dtype, *values: dict) -> list[np.void]:
    """Values of a structured dtype (kernel arguments passed by value), one per dict of
    every field's value, built in one array."""
    get = _fields_of(dtype)
    return list(np.array([get(v) for v in values], dtype))


def _record(dtype: np.dtype, **values) -> np.void:
    """One value of a structured dtype (a kernel argument passed by value); fields not
    given are 0."""
    unknown = values.keys() - set(dtype.names)
    if unknown:
        raise ValueError(f"no field {sorted(unknown)} in {dtype}")
    return _records(dtype, dict.fromkeys(dtype.names, 0) | values)[0]


def _strides(a, name: str) -> tuple[int, ...]:
    """Element strides of a CuPy array (byte strides must be whole elements)."""
    out = []
    for s in a.strides:
        if s % a.itemsize:
            raise ValueError(f"{name}: stride {s} bytes is not a whole number of elements")
        out.append(s // a.itemsize)
    return tuple(out)


class Launch:
    """A planned attention launch with every scalar argument bound: what one geometry
    (shapes, element strides, dtype, causal, scale, mask and lse presence) needs, so that a
    repeated call only supplies pointers (:meth:`fire`). Built by :func:`prepare`."""

    __slots__ = ("plan", "kernel", "merge", "values", "work", "work_bytes", "part_rows", "dv",
                 "strides_aligned", "combine_bytes")

    def __init__(self, plan, kernel: _driver_launch.KernelLaunch,
                 merge: _driver_launch.KernelLaunch | None, args: dict, combine_args: np.void,
                 work, part_rows: int, dv: int, strides_aligned: bool) -> None:
        # the split-KV merge's launch (dependent or ordinary), None without key splits
        self.plan, self.kernel, self.merge = plan, kernel, merge
        self.combine_bytes = (combine_args.tobytes(),)
        # vec flag (0 / 1) -> the bytes of the arguments after the 8 pointers: the AttnArgs
        # record alone, or its fields as plain parameters (_attn_dispatch.packed_args)
        self.values = {vec: tuple(a.tobytes() for a in values) for vec, values in args.items()}
        self.work, self.part_rows, self.dv = work, part_rows, dv
        self.work_bytes = np.dtype(work).itemsize
        self.strides_aligned = strides_aligned

    def fire(self, q, k, v, out, mask=None, lse=None) -> None:
        """Launch on CuPy arrays whose data pointers start the operands this launch was
        prepared for (the same shapes and strides), on CuPy's current stream."""
        import cupy

        self.fire_at(cupy.cuda.get_current_stream().ptr, q.data.ptr, k.data.ptr, v.data.ptr,
                     out.data.ptr, 0 if mask is None else mask.data.ptr,
                     0 if lse is None else lse.data.ptr, _cupy_workspace)

    def fire_at(self, stream: int, pq: int, pk: int, pv: int, po: int, pmask: int, plse: int,
                workspace) -> None:
        """Launch on stream handle ``stream`` of the current device with the operands at
        these addresses (0: no mask, no lse). ``workspace(count, dtype)`` allocates the
        split-KV merge's workspace on the stream's allocator (freed in stream order) and
        returns (the array, its address)."""
        vec = int(self.strides_aligned and (pq | pk | pv | po) % 16 == 0)
        plan = self.plan
        combine = plan.needs_combine
        if combine:
            # one workspace: the unnormalized partial rows, then their (row max, row sum)
            rows = plan.splits * self.part_rows
            held, o_part = workspace(rows * (self.dv + 2), self.work)  # held past the launches
            stat_part = o_part + rows * self.dv * self.work_bytes
        else:
            o_part = stat_part = 0
        self.kernel.fire(stream, (pq, pk, pv, po, plse, o_part, stat_part, pmask),
                         self.values[vec])
        if combine:
            self.merge.fire(stream, (o_part, stat_part, po, plse), self.combine_bytes)


def _cupy_workspace(count: int, dtype) -> tuple[object, int]:
    """``count`` elements of ``dtype`` from CuPy's pool, on its current stream."""
    import cupy

    buf = cupy.ndarray(count, dtype)
    return buf, buf.data.ptr


def prepare(q, k, v, out, *, causal: bool, scale: float, mask=None, lse=None) -> Launch:
    """Plan :func:`launch_attention` on these operands and bind its scalar arguments."""
    bsz, hq, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    dtype = _array.dtype_name(q.dtype)

    def strides(a, name: str) -> tuple[int, ...]:
        # a batch of one is never stepped: stride 0, whatever view the caller built (as the
        # layout's collapsed views give it), so it never turns the 16-byte path off
        es = _strides(a, name)
        return (0, *es[1:]) if bsz == 1 else es

    qs, ks, vs, os_ = (strides(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out")))
    isz = q.itemsize
    strides_aligned = d % 8 == 0 and dv % 8 == 0 and all(
        (s * isz) % 16 == 0 for st in (qs, ks, vs, os_) for s in st[:3])
    dev = q.data.device_id
    forced = _attn_dispatch.forced_choices()
    causal = bool(causal)
    masked, scale_positive = mask is not None, scale > 0
    key = (dev, dtype, d, dv, lq, lk, bsz, hkv, group, causal, masked, scale_positive, forced)
    entry = _PLANS.get(key)
    if entry is None:
        entry = _PLANS[key] = _make_plan(dev, dtype, d, dv, lq, lk, bsz, hkv, group, causal,
                                         masked, scale_positive)
    plan, kernel, merge_kernel = entry

    kind = _MASK_KIND[None if mask is None else ("bool" if mask.dtype == np.bool_ else "additive")]
    ms = (0, 0, 0, 0) if mask is None else strides(mask, "mask")
    ls = (0, 0, 0) if lse is None else strides(lse, "lse")
    out_strides = dict(o_sb=os_[0], o_sh=os_[1], o_sl=os_[2], lse_sb=ls[0], lse_sh=ls[1],
                       lse_sl=ls[2])
    fields = dict(lq=lq, lk=lk, q_sb=qs[0], q_sh=qs[1], q_sl=qs[2], k_sb=ks[0], k_sh=ks[1],
                  k_sl=ks[2], v_sb=vs[0], v_sh=vs[1], v_sl=vs[2], **out_strides, m_sb=ms[0],
                  m_sh=ms[1], m_sq=ms[2], m_sk=ms[3], row_tiles=plan.row_tiles, scale=scale,
                  mask_kind=kind, hkv=hkv, group=group, d=d, dv=dv, causal=int(causal),
                  items=plan.items, kv_stream=int(plan.kv_stream))
    records = dict(enumerate(_records(ATTN_ARGS, {**fields, "vec": 0}, {**fields, "vec": 1})))
    if _attn_dispatch.packed_args(plan.kernel):
        args = {vec: (rec,) for vec, rec in records.items()}
    else:  # the same values as plain parameters, in the struct's order
        args = {vec: tuple(rec[name] for name in ATTN_ARGS.names) for vec, rec in records.items()}
    part_rows = bsz * hkv * group * lq
    combine_args = _record(COMBINE_ARGS, part_rows=part_rows, lq=lq, **out_strides,
                           splits=plan.splits, hkv=hkv, group=group, dv=dv)
    # AttnWork<T> of attention.cu: float on tensor cores, double on the SIMT path
    work = np.float64 if dtype in _attn_dispatch.SIMT_DTYPES else np.float32
    merge = None
    if plan.needs_combine:
        dependent = DEPENDENT_COMBINE and _driver_launch.available(device_props(dev).arch)
        merge_key = (dev, plan.combine, part_rows, dependent)
        merge = _MERGES.get(merge_key)
        if merge is None:
            # the part rows' and statistics' workspace, out, lse; then CombineArgs
            merge = _MERGES[merge_key] = _driver_launch.KernelLaunch(
                merge_kernel, dev, part_rows, _attn_dispatch.COMBINE_THREADS,
                (*(_driver_launch.POINTER,) * 4, COMBINE_ARGS.itemsize), dependent=dependent)
    return Launch(plan, kernel, merge, args, combine_args, work, part_rows, dv,
                  strides_aligned)


def launch_attention(q, k, v, out, *, causal: bool, scale: float, mask=None,
                     lse=None) -> Launch:
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

    Returns
    -------
    Launch
        The prepared launch, to fire again on operands of the same geometry.
    """
    launch = prepare(q, k, v, out, causal=causal, scale=scale, mask=mask, lse=lse)
    launch.fire(q, k, v, out, mask, lse)
    return launch


def _make_plan(dev: int, dtype: str, d: int, dv: int, lq: int, lk: int, bsz: int, hkv: int,
               group: int, causal: bool, masked: bool, scale_positive: bool):
    props = device_props(dev)

    def kernel_for(name: str):
        return get_kernel(dev, props.arch, "attention.cu", name,
                          smem_optin=props.smem_per_block_optin)

    def occ(name: str, block: int, smem: int) -> int:
        return occupancy(kernel_for(name), block, smem)

    plan = _attn_dispatch.plan_attention(dtype, d, dv, lq, lk, bsz, hkv, group, props, occ,
                                         causal=causal, masked=masked,
                                         scale_positive=scale_positive)
    merge_kernel = kernel_for(plan.combine) if plan.needs_combine else None
    # q, k, v, out, lse, the partial rows and their statistics, mask; then the scalars
    scalars = ((ATTN_ARGS.itemsize,) if _attn_dispatch.packed_args(plan.kernel)
               else tuple(ATTN_ARGS.fields[name][0].itemsize for name in ATTN_ARGS.names))
    kernel = _driver_launch.KernelLaunch(kernel_for(plan.kernel), dev, plan.grid, plan.block,
                                         (*(_driver_launch.POINTER,) * 8, *scalars),
                                         shared_mem=plan.smem)
    return plan, kernel, merge_kernel
