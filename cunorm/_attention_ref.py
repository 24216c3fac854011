"""The NumPy reference path of :func:`cunorm.attention`: float64 arithmetic on the whole score
matrix, rounded once to the result dtypes.

It stores the ``Lq x Lk`` scores of every head (O(L^2) memory): it is the reference the GPU
kernels are checked against and the path of NumPy inputs, not a fast CPU implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .attention import AttentionCall


def mask_needs_cast(mask, dtype) -> bool:
    """Whether :func:`mask_in_dtype` casts ``mask`` (a float mask of another dtype than
    ``dtype``, the dtype of q) rather than returning it as it is."""
    return mask is not None and mask.dtype != np.bool_ and mask.dtype != dtype


def mask_in_dtype(mask, dtype):
    """A float ``mask`` cast to ``dtype`` (the dtype of q) on its own shape, before any
    broadcast, its own broadcast axes (stride 0, from ``expand`` or ``broadcast_to``) cut to
    size 1 first, so the cast never materialises more elements than the mask holds (the
    caller broadcasts the result); bool masks as they are. Works on NumPy and CuPy arrays."""
    if not mask_needs_cast(mask, dtype):
        return mask
    once = tuple(slice(0, 1) if s == 0 and n > 1 else slice(None)
                 for n, s in zip(mask.shape, mask.strides, strict=True))
    with np.errstate(over="ignore"):  # -1e30 in float16 is -inf, as meant
        return mask[once].astype(dtype)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool, scale: float,
              mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``(out, lse)`` of attention on valid NumPy inputs (any float dtypes; ``mask``
    bool, or additive already in the dtype it is meant to have).

    Shapes as :func:`cunorm.attention`; query head ``h`` uses key/value head
    ``h // (Hq // Hkv)``. Rows whose scores are all ``-inf`` give 0 and ``lse = -inf``.
    """
    hq, lq, d = q.shape[-3:]
    hkv, lk, dv = v.shape[-3:]
    lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    g = hq // hkv if hkv else 1
    qf = np.broadcast_to(q, (*lead, hq, lq, d)).astype(np.float64)
    kf = np.broadcast_to(k, (*lead, hkv, lk, d)).astype(np.float64)
    vf = np.broadcast_to(v, (*lead, hkv, lk, dv)).astype(np.float64)
    # group the query heads by the key/value head they share: (..., Hkv, G, Lq, D)
    qg = qf.reshape(*lead, hkv, g, lq, d)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = (qg @ np.swapaxes(kf, -1, -2)[..., :, None, :, :]) * scale
        if mask is not None:
            mg = np.broadcast_to(mask, (*lead, hq, lq, lk)).reshape(*lead, hkv, g, lq, lk)
            if mask.dtype == np.bool_:
                s = np.where(mg, s, -np.inf)
            else:
                s = s + mg.astype(np.float64)
        if causal:
            keep = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)
            s = np.where(keep, s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
        masked = m == -np.inf  # every key masked (or no key at all)
        p = np.exp(s - np.where(masked, 0.0, m))
        total = p.sum(axis=-1, keepdims=True)
        o = (p @ vf[..., :, None, :, :]) / np.where(masked, 1.0, total)
        lse = np.where(masked, -np.inf, m + np.log(total))
    return o.reshape(*lead, hq, lq, dv), lse.reshape(*lead, hq, lq)


def attention_numpy(call: AttentionCall, q, k, v, mask, out):
    """The NumPy path of a validated call: ``(out, lse or None)``; ``out`` is written once,
    after everything is computed (it may be q itself)."""
    o, lse = reference(q, k, v, causal=call.causal, scale=call.scale,
                       mask=mask_in_dtype(mask, q.dtype))
    if out is None:
        out = o.astype(q.dtype)
    else:
        out[...] = o
    return out, (lse.astype(np.float32) if call.return_lse else None)
