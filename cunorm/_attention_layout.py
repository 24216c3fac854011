"""From a validated :func:`cunorm.attention` call to launcher calls on ``(B, H, L, D)`` views.

The launcher (``cunorm._attn_launch.launch_attention``) takes 4-D views with any element
strides (0 on the batch and head axes for broadcasting) and a unit-stride last axis. Here:

- an operand is copied only if its last axis is not unit-stride (or a stride is not a whole
  number of elements); every other layout, e.g. a ``(B, L, H, D)`` tensor passed as its
  ``(B, H, L, D)`` transpose, or a batch broadcast with a zero stride, goes through as it is;
- the broadcast leading dims collapse to one batch axis with one stride per tensor where every
  tensor's strides allow it (:func:`batch_layout`); otherwise the outer leading dims are looped
  over in Python, one launch per slice, still without copies;
- ``out`` is written directly unless it overlaps an input or itself (then a temporary is
  written and copied in);
- empty problems never launch.

Nothing here is CuPy-specific: ``xp`` is the array module (``cupy``; ``numpy`` in the CPU
tests, with a stand-in launcher) and ``launch`` the launcher.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from . import _array
from ._attention_ref import mask_in_dtype, mask_needs_cast

if TYPE_CHECKING:
    from .attention import AttentionCall


@functools.lru_cache(maxsize=1024)
def batch_layout(lead: tuple[int, ...],
                 strides: tuple[tuple[int, ...], ...]) -> tuple[int, tuple[int, ...]]:
    """How to walk the broadcast leading dims ``lead`` of several tensors.

    ``strides[t]`` are tensor ``t``'s element strides over ``lead`` (0 on broadcast dims).
    Returns ``(j, batch_strides)``: dims ``lead[:j]`` are looped over, one launch per index,
    and dims ``lead[j:]`` collapse into one batch axis of ``prod(lead[j:])`` elements on
    which tensor ``t`` has the stride ``batch_strides[t]``. ``j`` is the smallest that works
    for every tensor (0: a single launch); size-1 dims never get in the way.

    Examples
    --------
    >>> batch_layout((2, 3), ((3 * 64, 64), (0, 0)))  # contiguous q, k broadcast over both
    (0, (64, 0))
    >>> batch_layout((2, 3), ((3 * 64, 64), (64, 0)))  # k broadcast over the second dim only
    (1, (64, 0))
    """
    for j in range(len(lead) + 1):
        collapsed = [_array._collapse(lead[j:], s[j:]) for s in strides]
        if all(c is not None for c in collapsed):
            return j, tuple(collapsed)
    raise AssertionError("unreachable: an empty block always collapses")


def _unit_last(a, strict: bool = False) -> bool:
    """Whether ``a``'s strides are whole elements with a unit-stride last axis (one of size
    1 counts as unit-stride, as it is never stepped, unless ``strict``)."""
    es = _array.element_strides(a)
    return es is not None and ((a.shape[-1] <= 1 and not strict) or es[-1] == 1)


def in_place(*operands) -> bool:
    """Whether :func:`run` passes every one of ``operands`` to the launcher without a copy."""
    return all(_unit_last(a) for a in operands)


def mask_in_place(mask, dtype) -> bool:
    """Whether :func:`run` passes ``mask`` (with q of ``dtype``) to the launcher as it is: no
    cast (bool, or already ``dtype``: what :func:`mask_in_dtype` keeps) and whole-element
    strides (else a contiguous copy)."""
    return not mask_needs_cast(mask, dtype) and _array.element_strides(mask) is not None


def _operand(a, xp):
    """``a`` itself, or a contiguous copy if the launcher cannot read it in place."""
    return a if _unit_last(a) else xp.ascontiguousarray(a)


def _broadcast(a, lead: tuple[int, ...], xp):
    """``a`` (``(..., H, L, D)``) viewed with the leading dims ``lead``: ``a`` itself where it
    has them already (a new view costs a few microseconds of host time a call)."""
    shape = (*lead, *a.shape[-3:])
    return a if a.shape == shape else xp.broadcast_to(a, shape)


def _direct_out(out, sources, xp) -> bool:
    """Whether the launcher may write ``out`` itself: launchable strides, no element twice
    (no zero stride on an axis longer than 1) and no memory shared with an input."""
    if not _unit_last(out):
        return False
    es = _array.element_strides(out)
    if any(s == 0 and n > 1 for n, s in zip(out.shape, es, strict=True)):
        return False
    return not any(xp.may_share_memory(out, s) for s in sources if s is not None)


def _slices(a, lead: tuple[int, ...], j: int, bstride: int, xp) -> Iterator:
    """The ``(B, *tail)`` views of ``a`` (shaped ``lead + tail``, broadcast, any strides) for
    each index of ``lead[:j]``, in C order; ``B = prod(lead[j:])`` with stride ``bstride``."""
    n = len(lead)
    es = _array.element_strides(a)
    tail, tail_es = tuple(a.shape[n:]), list(es[n:])
    if tail and tail[-1] == 1:
        tail_es[-1] = 1  # never stepped; the launcher wants a unit-stride last axis
    shape = (math.prod(lead[j:]), *tail)
    strides = tuple(s * a.itemsize for s in (bstride, *tail_es))
    for idx in np.ndindex(*lead[:j]):
        yield xp.lib.stride_tricks.as_strided(a[idx] if idx else a, shape=shape, strides=strides)


def run(call: AttentionCall, q, k, v, mask, out, xp, launch: Callable) -> tuple:
    """``(out, lse or None)`` of a validated call on ``xp`` arrays, through ``launch``."""
    lead, dt = call.lead, q.dtype
    lse = xp.empty(call.lse_shape, np.float32) if call.return_lse else None
    if call.lk == 0:  # no keys: every row is fully masked
        if out is None:
            out = xp.zeros(call.out_shape, dt)
        else:
            out[...] = 0
        if lse is not None:
            lse[...] = -np.inf
        return out, lse
    need_lse = lse is not None and lse.size > 0
    if math.prod(call.out_shape) == 0 and not need_lse:
        return (xp.empty(call.out_shape, dt) if out is None else out), lse

    sources = (q, k, v, mask)
    qo, ko, vo = _operand(q, xp), _operand(k, xp), _operand(v, xp)
    mo = mask_in_dtype(mask, dt)
    if mo is not None and _array.element_strides(mo) is None:
        mo = xp.ascontiguousarray(mo)
    if call.dv == 0:
        # Nothing to write but the log-sum-exp: run the kernel on one column of k as values.
        vo, dst = ko[..., :1], xp.empty((*lead, call.hq, call.lq, 1), dt)
    elif out is not None and _direct_out(out, sources, xp):
        dst = out
    else:
        dst = xp.empty(call.out_shape, dt)

    full = [_broadcast(qo, lead, xp), _broadcast(ko, lead, xp), _broadcast(vo, lead, xp), dst]
    if lse is not None:
        full.append(lse)
    if mo is not None:
        full.append(xp.broadcast_to(mo, call.mask_shape))
    if len(lead) == 1 and all(_unit_last(a, strict=True) for a in full):
        # (B, H, L, D) already with unit-stride last axes: the launcher's views are the arrays
        # themselves (it takes a batch of one's stride as 0, as the views below give it)
        views = [full]
    else:
        n = len(lead)
        j, bstrides = batch_layout(lead, tuple(_array.element_strides(a)[:n] for a in full))
        views = zip(*(_slices(a, lead, j, s, xp) for a, s in zip(full, bstrides, strict=True)),
                    strict=True)
    for qs, ks, vs, os_, *extra in views:
        ls = extra.pop(0) if lse is not None else None
        ms = extra.pop(0) if mo is not None else None
        launch(qs, ks, vs, os_, causal=call.causal, scale=call.scale, mask=ms, lse=ls)
    if call.dv == 0:
        return (xp.empty(call.out_shape, dt) if out is None else out), lse
    if out is not None and dst is not out:
        out[...] = dst
        return out, lse
    return dst, lse
