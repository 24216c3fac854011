"""attention: validate, then run the CUDA kernels (CuPy, PyTorch, JAX) or the NumPy reference.

Data flows one way: arrays in -> validation (here) -> the (B, H, L, D) views the launcher takes
(:mod:`cunorm._attention_layout`) -> launch (``cunorm._attn_launch``, ``cuda_src/attention.cu``)
-> arrays out. NumPy inputs run :mod:`cunorm._attention_ref` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _array, _attention_layout, _attention_ref
from ._attn_dispatch import forced_choices
from ._cache import BoundedCache

FNAME = "attention"
#: the largest head dim (of q and k, and of v) the kernels take; every kind is held to it, so
#: code tried on NumPy runs unchanged on the GPU
MAX_HEAD_DIM = 256
_SHAPES = {"q": "(..., Hq, Lq, D)", "k": "(..., Hkv, Lk, D)", "v": "(..., Hkv, Lk, Dv)"}


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, mask=None,
              return_lse: bool = False, out=None):
    """Scaled dot-product attention, ``softmax(q @ k^T * scale + mask) @ v``, fused.

    Memory is O(L): the ``Lq x Lk`` score matrix is never stored on the GPU (FlashAttention's
    online softmax, see :doc:`/numerics`).

    Parameters
    ----------
    q : cupy.ndarray, numpy.ndarray, torch.Tensor or jax.Array
        Queries, shape ``(..., Hq, Lq, D)``: at least 3 dimensions (heads, query positions,
        head dim). dtype float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64.
        GPU inputs run the CUDA kernels; NumPy inputs run the NumPy reference path (float64
        arithmetic, which stores the scores: meant for checks, not long sequences).
    k : array
        Keys, shape ``(..., Hkv, Lk, D)``, of ``q``'s dtype and array kind. ``Hq`` must be a
        multiple of ``Hkv`` (grouped-query attention: query head ``h`` attends with key/value
        head ``h // (Hq // Hkv)``; K and V are not copied).
    v : array
        Values, shape ``(..., Hkv, Lk, Dv)``, of ``q``'s dtype and array kind. ``1 <= D <= 256``
        and ``Dv <= 256``.
    causal : bool, default False
        Query ``i`` sees key ``j`` only if ``j <= i + Lk - Lq``: the causal mask aligned to the
        bottom-right corner (as FlashAttention 2.1+), so a query block that continues a KV cache
        sees the whole cache. With ``Lq > Lk`` the first ``Lq - Lk`` queries see no key.
    scale : float, optional
        Multiplies ``q @ k^T``; finite. Default ``1 / sqrt(D)``. Zero and negative scales are
        supported but run on the ``mma.sync`` kernel even on an H100 / H200 (the warpgroup
        kernels fold a positive scale into the exponent; ``docs/dispatch.rst``).
    mask : array, optional
        Broadcastable to ``(..., Hq, Lq, Lk)`` (it does not enlarge the result), of ``q``'s
        kind. Boolean: ``True`` keeps a score, ``False`` removes it. Floating: added to the
        scaled scores (``-inf`` removes one); a float mask of another dtype than ``q`` is first
        cast to ``q``'s dtype, on its own shape. Integer masks are refused.
    return_lse : bool, default False
        Also return the natural-log log-sum-exp of each row of scaled, masked scores, float32
        of shape ``(..., Hq, Lq)`` (what a backward pass or a split-KV merge needs).
    out : array, optional
        Preallocated result of shape ``(..., Hq, Lq, Dv)``, ``q``'s dtype and kind (not for
        JAX arrays, which are immutable). Any strides; written only by a valid call.

    Returns
    -------
    out : array
        Shape ``(..., Hq, Lq, Dv)`` where ``...`` is the broadcast of the leading dims of
        ``q``, ``k`` and ``v``; ``q``'s dtype and array type. A query row whose keys are all
        masked is 0.
    lse : array
        Only if ``return_lse``: float32, ``(..., Hq, Lq)``; ``-inf`` for a fully masked row.

    Notes
    -----
    Inputs are used in place whatever their strides, as long as the last axis is unit-stride:
    a ``(B, L, H, D)`` tensor passed as ``x.transpose(0, 2, 1, 3)`` is not copied, nor is a
    batch broadcast with a zero stride. Only an operand whose last axis is strided is copied
    first. ``Lk == 0`` gives zeros (and ``lse = -inf``) without a launch; other empty results
    are empty.

    Examples
    --------
    >>> import numpy as np
    >>> import cunorm
    >>> q = np.array([[[1.0, 0.0]]])               # (Hq, Lq, D) = (1, 1, 2)
    >>> k = np.array([[[1.0, 0.0], [0.0, 1.0]]])   # (Hkv, Lk, D) = (1, 2, 2)
    >>> v = np.array([[[1.0, 2.0], [3.0, 4.0]]])   # (Hkv, Lk, Dv) = (1, 2, 2)
    >>> cunorm.attention(q, k, v, scale=1.0).round(4)
    array([[[1.5379, 2.5379]]])
    >>> out, lse = cunorm.attention(q, k, v, mask=np.array([False, False]), return_lse=True)
    >>> out, lse
    (array([[[0., 0.]]]), array([[-inf]], dtype=float32))
    """
    kind = _array.array_kind(q, FNAME, "q")
    if kind == "cupy":
        dev = _array.other_device(q)
        if dev is not None:
            return _array.on_device(dev, attention, q, k, v, causal=causal, scale=scale,
                                    mask=mask, return_lse=return_lse, out=out)
    key = None
    if kind == "cupy" and out is None:
        key = _memo_key(q, k, v, mask, causal, scale, return_lse, _cupy_layout)
        fast = None if key is None else _MEMO.get(key)
        if fast is not None:
            return fast(q, k, v, mask)
    if kind in ("numpy", "cupy"):
        call = _validate(kind, q, k, v, causal, scale, mask, return_lse, out)
        if kind == "numpy":
            res, lse = _attention_ref.attention_numpy(call, q, k, v, mask, out)
        else:
            for name, arr in (("k", k), ("v", v), ("mask", mask), ("out", out)):
                if arr is not None:
                    _array.same_device(q, arr, FNAME, name, "q")
            res, lse = _attention_cupy(call, q, k, v, mask, out, key)
        return (res, lse) if call.return_lse else res
    return _attention_framework(kind, q, k, v, causal, scale, mask, return_lse, out)


# --- validation shared by every array kind ----------------------------------------------
@dataclass(frozen=True)
class AttentionCall:
    """A validated call: the problem's sizes and options, whatever the array kind."""

    dtype: str
    lead: tuple[int, ...]  # broadcast leading dims of q, k, v
    hq: int
    hkv: int
    lq: int
    lk: int
    d: int
    dv: int
    causal: bool
    scale: float
    mask: str | None  # None, "bool" or "additive"
    return_lse: bool

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.lead, self.hq, self.lq, self.dv)

    @property
    def lse_shape(self) -> tuple[int, ...]:
        return (*self.lead, self.hq, self.lq)

    @property
    def mask_shape(self) -> tuple[int, ...]:
        return (*self.lead, self.hq, self.lq, self.lk)


def _check_flag(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{FNAME}(): {name} must be a bool, got {value!r}")
    return bool(value)


def _check_scale(scale: object, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(
            scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"{FNAME}(): scale must be a real number or None, got {scale!r}")
    try:
        value = float(scale)
    except OverflowError:  # an int beyond float range
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{FNAME}(): scale must be finite, got {scale!r}")
    return value


def _check_shapes(q, k, v) -> tuple[tuple[int, ...], int, int, int, int, int, int]:
    """(lead, Hq, Hkv, Lq, Lk, D, Dv) of valid q, k, v shapes."""
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim < 3:
            raise ValueError(f"{FNAME}(): {name} must have at least 3 dimensions "
                             f"{_SHAPES[name]}; got shape {tuple(arr.shape)}")
    hq, lq, d = (int(n) for n in q.shape[-3:])
    hkv, lk, dk = (int(n) for n in k.shape[-3:])
    hv, lv, dv = (int(n) for n in v.shape[-3:])
    if dk != d:
        raise ValueError(f"{FNAME}(): k has head dim {dk} (k.shape[-1]); expected {d}, the "
                         "head dim of q (q.shape[-1])")
    if lv != lk:
        raise ValueError(f"{FNAME}(): v has {lv} keys (v.shape[-2]); expected {lk}, the keys "
                         "of k (k.shape[-2])")
    if hv != hkv:
        raise ValueError(f"{FNAME}(): v has {hv} heads (v.shape[-3]); expected {hkv}, the "
                         "heads of k (k.shape[-3])")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{FNAME}(): q and k have head dim {d} (shape[-1]); expected 1 to "
                         f"{MAX_HEAD_DIM}")
    if dv > MAX_HEAD_DIM:
        raise ValueError(f"{FNAME}(): v has head dim {dv} (v.shape[-1]); expected at most "
                         f"{MAX_HEAD_DIM}")
    if (hq and not hkv) or (hkv and hq % hkv):
        raise ValueError(f"{FNAME}(): q has {hq} heads, not a multiple of the {hkv} heads of "
                         "k and v (grouped-query attention needs Hq % Hkv == 0)")
    shapes = [tuple(int(n) for n in a.shape[:-3]) for a in (q, k, v)]
    try:
        lead = tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{FNAME}(): the leading dimensions of q {shapes[0]}, k {shapes[1]} "
                         f"and v {shapes[2]} do not broadcast together") from None
    return lead, hq, hkv, lq, lk, d, dv


def _check_mask(mask, kind: str, target: tuple[int, ...]) -> str:
    """``"bool"`` or ``"additive"`` for a valid mask."""
    name = _array.kind_dtype_name(mask, kind)
    if name != "bool" and name not in _array.FLOAT_DTYPES:
        raise TypeError(f"{FNAME}(): mask has dtype {name}; expected bool (True keeps a score) "
                        "or float16, bfloat16, float32 or float64 (added to the scores)")
    shape = tuple(int(n) for n in mask.shape)
    try:
        fits = np.broadcast_shapes(shape, target) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{FNAME}(): mask has shape {shape}; expected a shape that broadcasts "
                         f"to {target} (..., Hq, Lq, Lk)")
    return "bool" if name == "bool" else "additive"


def _validate(kind: str, q, k, v, causal, scale, mask, return_lse, out) -> AttentionCall:
    """Check every argument against ``q`` (a NumPy or CuPy array of kind ``kind``); nothing
    is computed or written."""
    for name, arr in (("k", k), ("v", v), ("mask", mask)):
        if arr is not None:
            _array.check_kind(arr, kind, FNAME, name, "q")
    dtype = _array.check_float(q.dtype, FNAME, "q")
    for name, arr in (("k", k), ("v", v)):
        _array.check_same_dtype(arr, kind, dtype, FNAME, name, "q")
    lead, hq, hkv, lq, lk, d, dv = _check_shapes(q, k, v)
    mask_kind = None
    if mask is not None:
        mask_kind = _check_mask(mask, kind, (*lead, hq, lq, lk))
    call = AttentionCall(dtype, lead, hq, hkv, lq, lk, d, dv, _check_flag(causal, "causal"),
                         _check_scale(scale, d), mask_kind, _check_flag(return_lse, "return_lse"))
    if out is not None:
        _array.check_out(out, kind, call.out_shape, dtype, FNAME, "q")
    return call


# --- CuPy -------------------------------------------------------------------------------
# Hot-path memo (decoding calls the same geometry every step): the key of a call without out
# that ran as one launch on its operands (and mask, or its cast to q's dtype) -> _FastCall.
# A hit skips every check the first call made (array kinds, dtypes, shapes, devices, flags:
# all in the key); only the pointers are new. Masked calls took 316 us of host time a call
# without it, against 44 for a memoized one (H200, bf16 decoding, B = 8, 32 / 8 heads,
# Lk = 16384, a (B, 1, 1, Lk) padding mask): 2.5x the GPU's 130 us, so masked decoding ran at
# the host's pace.
_MEMO: dict[tuple, _FastCall] = BoundedCache()


def _cupy_layout(a) -> tuple:
    return (a.shape, a.strides, a.dtype, a.data.device_id)


def _torch_layout(a) -> tuple:
    return (a.shape, a.stride(), a.dtype, _array.cuda_index(a))


def _memo_key(q, k, v, mask, causal, scale, return_lse, layout) -> tuple | None:
    """The memo key of a call (each operand's ``layout``: :func:`_cupy_layout` or
    :func:`_torch_layout`), or None where the arguments' types alone could make two
    different calls hash alike (``True`` and ``1``, a NumPy ``k``, ...)."""
    if (type(k) is not type(q) or type(v) is not type(q) or type(causal) is not bool
            or type(return_lse) is not bool or not (scale is None or type(scale) is float)
            or not (mask is None or type(mask) is type(q))):
        return None
    masked = () if mask is None else layout(mask)
    return (*layout(q), *layout(k), *layout(v), causal, scale, return_lse, forced_choices(),
            masked)


class _FastCall:
    """A memoized call: allocate the result (and lse), cast a float mask of another dtype
    than q's (``cast_mask``), fire the prepared launch."""

    __slots__ = ("launch", "out_shape", "lse_shape", "dtype", "cast_mask")

    def __init__(self, call: AttentionCall, launch, dtype, cast_mask: bool) -> None:
        self.launch, self.dtype, self.out_shape = launch, dtype, call.out_shape
        self.lse_shape = call.lse_shape if call.return_lse else None
        self.cast_mask = cast_mask

    def __call__(self, q, k, v, mask):
        import cupy

        if self.cast_mask:  # (the layout of the cast follows the mask's: same as the first's)
            mask = _attention_ref.mask_in_dtype(mask, self.dtype)
        out = cupy.ndarray(self.out_shape, self.dtype)  # cupy.empty without its Python frame
        if self.lse_shape is None:
            self.launch.fire(q, k, v, out, mask)
            return out
        lse = cupy.ndarray(self.lse_shape, np.float32)
        self.launch.fire(q, k, v, out, mask, lse)
        return out, lse

    def torch(self, q, k, v, mask, dev: int, stream: int):
        """The same on CUDA torch tensors of the memoized layouts, on torch's stream handle
        ``stream`` of device ``dev`` (the current one); torch allocates the results and the
        split-KV workspace. Not for a mask that needs a cast."""
        import torch

        out = torch.empty(self.out_shape, dtype=q.dtype, device=dev)
        lse = (None if self.lse_shape is None
               else torch.empty(self.lse_shape, dtype=torch.float32, device=dev))

        def workspace(count: int, dtype) -> tuple[object, int]:
            buf = torch.empty(count, dtype=torch.float64 if dtype is np.float64
                              else torch.float32, device=dev)
            return buf, buf.data_ptr()

        self.launch.fire_at(stream, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                            0 if mask is None else mask.data_ptr(),
                            0 if lse is None else lse.data_ptr(), workspace)
        return out if lse is None else (out, lse)


def _attention_cupy(call: AttentionCall, q, k, v, mask, out, memo_key: tuple | None):
    """Run a validated call; memoize it under ``memo_key`` (given for calls without out) if it
    ran as one launch on its operands and mask in place."""
    import cupy

    from . import _attn_launch  # the kernels' launcher; imported on the first GPU call

    fired = []

    def launch(*args, **kwargs) -> None:
        fired.append(_attn_launch.launch_attention(*args, **kwargs))

    res = _attention_layout.run(call, q, k, v, mask, out, cupy, launch)
    # a float mask of another dtype goes to the kernel as a cast copy (a fresh array whose
    # layout follows the mask's), which a memoized call makes again
    cast = _attention_ref.mask_needs_cast(mask, q.dtype)
    if (memo_key is not None and len(fired) == 1 and call.dv > 0
            and _attention_layout.in_place(q, k, v)
            and (mask is None or cast or _attention_layout.mask_in_place(mask, q.dtype))):
        _MEMO[memo_key] = _FastCall(call, fired[0], q.dtype, cast)
    return res


# --- PyTorch / JAX ----------------------------------------------------------------------
# The same for CUDA torch tensors: the key holds each tensor's shape, element strides, torch
# dtype and CUDA index; the _FastCall is their CuPy views'. A hit builds no CuPy view and no
# DLPack capsule (a mask that needs a cast takes the full path).
_TORCH_MEMO: dict[tuple, _FastCall] = BoundedCache()


def _attention_torch_memo(key: tuple, q, k, v, mask):
    """The result for CUDA tensors of layouts a call has met before, computed with their
    device current, or None on a miss (or a tensor that requires grad: the full path then
    raises)."""
    fast = _TORCH_MEMO.get(key)
    if (fast is None or q.requires_grad or k.requires_grad or v.requires_grad
            or (mask is not None and mask.requires_grad)):
        return None
    dev = key[3]  # q's CUDA index
    stream = _array.torch_launch_stream(dev)
    if stream is None:  # the tensors are on another device than the current one
        return _array.torch_on_device(dev, _attention_torch_memo, key, q, k, v, mask)
    return fast.torch(q, k, v, mask, dev, stream)


def _attention_framework(kind: str, q, k, v, causal, scale, mask, return_lse, out):
    """Every array of q's kind and device, viewed zero-copy as CuPy arrays, validated and
    computed on the framework's stream; the results come back as the framework's arrays."""
    torch_key = None
    if kind == "torch" and out is None:
        torch_key = _memo_key(q, k, v, mask, causal, scale, return_lse, _torch_layout)
        res = None if torch_key is None else _attention_torch_memo(torch_key, q, k, v, mask)
        if res is not None:
            return res
    named = (("k", k), ("v", v), ("mask", mask), ("out", out))
    for name, arr in named:
        if arr is not None:
            _array.check_kind(arr, kind, FNAME, name, "q")
    if out is not None and kind == "jax":
        _array.check_out(out, kind, (), "", FNAME, "q")  # raises: JAX arrays are immutable
    with _array.framework_stream(q, kind, FNAME, "q"):
        if kind == "torch":
            _array.check_torch_on_cuda(named, FNAME, "q")
        conv = {name: None if arr is None else _array.to_cupy(arr, kind, FNAME, name)
                for name, arr in (("q", q), *named)}
        res = attention(conv["q"], conv["k"], conv["v"], causal=causal, scale=scale,
                        mask=conv["mask"], return_lse=return_lse, out=conv["out"])
        if torch_key is not None:
            fast = _MEMO.get(_memo_key(conv["q"], conv["k"], conv["v"], conv["mask"], causal,
                                       scale, return_lse, _cupy_layout))
            if fast is not None and not fast.cast_mask:  # the views went straight to a kernel
                _TORCH_MEMO[torch_key] = fast
        y, lse = res if isinstance(res, tuple) else (res, None)
        y = out if out is not None else _array.from_cupy(y, kind)
        return y if lse is None else (y, _array.from_cupy(lse, kind))
