"""Minimal hand-written Triton peers: one row per program, the whole row in registers.

These are the kernels of Triton's fused-softmax and layer-norm tutorials in their simplest form
(no persistent grid, no autotuning): what a competent user writes in an afternoon. ``BLOCK`` is
the next power of two of ``cols``; rows longer than :data:`MAX_COLS` do not fit in registers
and are not covered. Imported only when Triton is available.

No ``from __future__ import annotations`` here: ``@triton.jit`` reads the ``tl.constexpr``
annotations, and keeping them as objects avoids depending on how a Triton version parses strings.
"""

from typing import Any

import torch
import triton
import triton.language as tl

# Longest row kept in registers: 16384 float32 values over 16 warps is 32 registers per thread
# per value array; beyond this the compiler spills and a one-row-per-program kernel is no
# longer a fair peer.
MAX_COLS = 16384
DTYPES = ("float16", "bfloat16", "float32")


def num_warps(block: int) -> int:
    """Warps per program by row length, as in Triton's fused-softmax tutorial."""
    if block >= 4096:
        return 16
    if block >= 2048:
        return 8
    return 4


@triton.jit
def _softmax_kernel(
    out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr, LOG: tl.constexpr
):
    # int64 row offset: rows * stride can pass 2**31 elements.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_row_stride + offs, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    if LOG:
        y = x - tl.log(den)
    else:
        y = num / den
    tl.store(out_ptr + row * out_row_stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_kernel(
    out_ptr,
    in_ptr,
    w_ptr,
    b_ptr,
    in_row_stride,
    out_row_stride,
    n_cols,
    eps,
    BLOCK: tl.constexpr,
    RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    if RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=0) / n_cols
        # Padding lanes must not contribute (x - mean) to the variance.
        xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    y = xc * tl.rsqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = y * w
    if HAS_BIAS:
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = y + b
    tl.store(out_ptr + row * out_row_stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor, log: bool = False) -> torch.Tensor:
    """Softmax (or log_softmax) over the last axis of a 2-D tensor with unit column stride."""
    rows, cols = x.shape
    y = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    _softmax_kernel[(rows,)](
        y, x, x.stride(0), y.stride(0), cols, BLOCK=block, LOG=log, num_warps=num_warps(block)
    )
    return y


def norm(
    x: torch.Tensor, weight: torch.Tensor, bias: Any, eps: float, rms: bool = False
) -> torch.Tensor:
    """Layer norm (or RMS norm when ``rms``) over the last axis of a 2-D tensor."""
    rows, cols = x.shape
    y = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    has_bias = bias is not None
    _norm_kernel[(rows,)](
        y,
        x,
        weight,
        bias if has_bias else weight,
        x.stride(0),
        y.stride(0),
        cols,
        eps,
        BLOCK=block,
        RMS=rms,
        HAS_BIAS=has_bias,
        num_warps=num_warps(block),
    )
    return y
