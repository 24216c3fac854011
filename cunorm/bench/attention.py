"""``python -m cunorm.bench attention``: the attention benchmark.

Three parts, one report (``{device}-{date}-attention.{md,json,png}``):

* **forward**, FlashAttention's convention (DESIGN.md section 6): batch x seqlen = 16k tokens,
  hidden 2048 (so ``H = 2048 / D``), D = 64 and 128, L = 512 ... 16384, causal and not,
  bfloat16 and float16; TFLOP/s = 4·B·H·Lq·Lk·D / time, halved for causal;
* **decoding**: Lq = 1 over a KV cache of Lk = 4k ... 128k, grouped-query attention with 32
  query and 8 KV heads, D = 128; GB/s of K/V read, 2·B·Hkv·Lk·D·itemsize / time, next to the
  device-to-device copy bandwidth of the same run;
* **peak extra memory** of one cunorm call at L = 65536 (B = 1, H = 16, D = 128, bfloat16).

Peers: every torch SDPA backend (flash, cuDNN, memory-efficient, and the default choice) and
``jax.nn.dot_product_attention`` under ``jax.jit`` (XLA and cuDNN). This module holds what
needs no GPU (shapes, formulas, the float64 reference, the command line, the NumPy run);
:mod:`cunorm.bench.attention_run` measures and :mod:`cunorm.bench.attention_report` writes.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# -- the sweeps -------------------------------------------------------------------------------
TOKENS = 16384  # batch x seqlen of the FlashAttention convention
HIDDEN = 2048  # heads x head dim
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQLENS = (1024, 4096, 16384)
HEAD_DIMS = (64, 128)
DEFAULT_DTYPES = ("bfloat16", "float16")
QUICK_DTYPES = ("bfloat16",)
# --float32 adds these (the float32 path is SIMT, full precision: long L would take minutes).
FLOAT32_SEQLENS = (512, 1024, 2048)
DECODE_LKS = (4096, 8192, 16384, 32768, 65536, 131072)
QUICK_DECODE_LKS = (8192, 32768, 131072)
DECODE_HQ, DECODE_HKV, DECODE_D = 32, 8, 128
DECODE_BATCHES = (1,)
MEMORY_L, MEMORY_H, MEMORY_D, MEMORY_DTYPE = 65536, 16, 128, "bfloat16"
# Timer budgets: long-L cells run ~10-20 ms per call, so a few timed calls suffice.
WARMUP_MS, REP_MS = 10.0, 50.0
# No GPU: cunorm's NumPy path on small float32 shapes.
NUMPY_SEQLENS = (128, 256, 512)
NUMPY_HEADS, NUMPY_D = 4, 64

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}

# Peers, by column name: torch SDPA under torch.nn.attention.sdpa_kernel(SDPBackend.<attr>)
# (None: no context, torch's own choice), and jax.nn.dot_product_attention(implementation=...).
SDPA_BACKENDS: dict[str, str | None] = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "default": None,
}
JAX_IMPLEMENTATIONS: dict[str, str | None] = {"jax": None, "jax-cudnn": "cudnn"}
ATTN_PEER_NAMES = (*SDPA_BACKENDS, *JAX_IMPLEMENTATIONS)
ATTN_PEER_ALIASES = {
    "fa2": "flash",
    "flash_attention": "flash",
    "cudnn_attention": "cudnn",
    "mem_efficient": "efficient",
    "efficient_attention": "efficient",
    "torch": "default",
    "sdpa": "default",
    "jax-xla": "jax",
    "xla": "jax",
}


def canonical_attention_peer(name: str) -> str:
    """Canonical attention peer name (``"fa2"`` -> ``"flash"``); ValueError if unknown."""
    key = name.strip().lower()
    key = ATTN_PEER_ALIASES.get(key, key)
    if key not in ATTN_PEER_NAMES:
        raise ValueError(
            f"unknown attention peer {name!r}; expected some of {', '.join(ATTN_PEER_NAMES)}"
        )
    return key


# -- shapes and formulas ----------------------------------------------------------------------
def attention_flops(batch: int, heads: int, lq: int, lk: int, d: int, causal: bool) -> int:
    """FLOPs of one forward pass by FlashAttention's convention: 4·B·H·Lq·Lk·D (two matmuls of
    2·Lq·Lk·D each per head), halved for causal (about half the score matrix is masked).

    Examples
    --------
    >>> attention_flops(1, 1, 2, 3, 4, causal=False)
    96
    >>> attention_flops(1, 1, 2, 3, 4, causal=True)
    48
    """
    flops = 4 * batch * heads * lq * lk * d
    return flops // 2 if causal else flops


def kv_read_bytes(batch: int, hkv: int, lk: int, d: int, itemsize: int) -> int:
    """Bytes of K and V a decoding step must read once: 2·B·Hkv·Lk·D·itemsize.

    Examples
    --------
    >>> kv_read_bytes(1, 8, 4096, 128, 2)
    16777216
    """
    return 2 * batch * hkv * lk * d * itemsize


def tflops(flops: int, ms: float) -> float:
    """TFLOP/s (1e12 per second) for ``flops`` done in ``ms`` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


@dataclass(frozen=True)
class AttnShape:
    """One attention problem: q ``(batch, hq, lq, d)``, k and v ``(batch, hkv, lk, d)``."""

    batch: int
    hq: int
    hkv: int
    lq: int
    lk: int
    d: int
    causal: bool
    dtype: str

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.hq, self.lq, self.d)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.hkv, self.lk, self.d)

    @property
    def gqa(self) -> bool:
        return self.hq != self.hkv

    @property
    def flops(self) -> int:
        return attention_flops(self.batch, self.hq, self.lq, self.lk, self.d, self.causal)

    @property
    def kv_bytes(self) -> int:
        return kv_read_bytes(self.batch, self.hkv, self.lk, self.d, self.itemsize)

    @property
    def io_bytes(self) -> int:
        """Bytes of q, k, v and the output (what the call cannot avoid holding)."""
        return 2 * math.prod(self.q_shape) * self.itemsize + self.kv_bytes

    @property
    def label(self) -> str:
        """Short text for progress and notes, e.g. ``bf16 B=8 H=32 L=2048 D=64 causal``."""
        heads = f"H={self.hq}" if not self.gqa else f"Hq={self.hq} Hkv={self.hkv}"
        length = f"L={self.lq}" if self.lq == self.lk else f"Lq={self.lq} Lk={self.lk}"
        causal = " causal" if self.causal else ""
        dt = SHORT_DTYPE.get(self.dtype, self.dtype)
        return f"{dt} B={self.batch} {heads} {length} D={self.d}{causal}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def main_shapes(
    seqlens: tuple[int, ...] | list[int],
    head_dims: tuple[int, ...] | list[int],
    dtypes: tuple[str, ...] | list[str],
    tokens: int = TOKENS,
    hidden: int = HIDDEN,
) -> list[AttnShape]:
    """The forward sweep: for each dtype, D, L and causal, B = tokens // L (at least 1) and
    H = hidden // D; ordered dtype, D, L, then non-causal before causal (as the anchors)."""
    shapes = []
    for dtype in dtypes:
        for d in head_dims:
            if hidden % d:
                raise ValueError(f"head dim {d} does not divide hidden {hidden}")
            for length in seqlens:
                for causal in (False, True):
                    b = max(1, tokens // length)
                    h = hidden // d
                    shapes.append(AttnShape(b, h, h, length, length, d, causal, dtype))
    return shapes


def decode_shapes(
    lks: tuple[int, ...] | list[int],
    batches: tuple[int, ...] | list[int],
    dtypes: tuple[str, ...] | list[str],
) -> list[AttnShape]:
    """The decoding sweep: Lq = 1, GQA 32/8 heads, D = 128. Not causal: with the mask aligned
    bottom-right, the one query sees every key anyway."""
    return [
        AttnShape(b, DECODE_HQ, DECODE_HKV, 1, lk, DECODE_D, False, dtype)
        for dtype in dtypes
        for b in batches
        for lk in lks
    ]


def memory_shapes() -> list[AttnShape]:
    """The peak-memory cases: L = 65536, B = 1, H = 16, D = 128, bfloat16, causal and not."""
    return [
        AttnShape(1, MEMORY_H, MEMORY_H, MEMORY_L, MEMORY_L, MEMORY_D, c, MEMORY_DTYPE)
        for c in (False, True)
    ]


def causal_last_key(lq: int, lk: int, rows: Any) -> Any:
    """Index of the last key each query row in ``rows`` sees under a causal mask aligned to
    the bottom-right corner (FlashAttention 2.1+, DESIGN.md section 1): ``row + lk - lq``.
    Negative for rows that see no key."""
    return np.asarray(rows) + (lk - lq)


def reference_attention(
    xp: Any, q: Any, k: Any, v: Any, *, scale: float | None = None, last_key: Any = None
) -> Any:
    """float64 ``softmax(q kᵀ · scale) v`` over the last two axes, with NumPy or CuPy ``xp``.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    q : array, shape (..., Lq, D)
    k, v : arrays, shape (..., Lk, D)
        Leading dims broadcast (for GQA, index K/V by ``head // (Hq // Hkv)`` first).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    last_key : array of int, shape (Lq,), optional
        Per query row, the last key index it may see (:func:`causal_last_key`); None: all.
        A row that sees no key gives 0 (DESIGN.md section 1).

    Returns
    -------
    array, float64, shape (..., Lq, Dv)
    """
    q64, k64, v64 = (a.astype(xp.float64) for a in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q64 @ xp.swapaxes(k64, -1, -2)) * scale
    if last_key is not None:
        keep = xp.arange(k.shape[-2])[None, :] <= xp.asarray(last_key)[:, None]
        s = xp.where(keep, s, -xp.inf)
    m = s.max(axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)  # fully masked rows: exp(-inf) = 0, no NaN
    p = xp.exp(s - m)
    den = p.sum(axis=-1, keepdims=True)
    return (p @ v64) / xp.where(den > 0, den, 1.0)


def row_errors(xp: Any, out: Any, ref: Any) -> Any:
    """Per-row relative error: max |out - ref| over a row / max |ref| over it (DESIGN.md
    section 3), NaN counted as infinite."""
    num = xp.abs(out.astype(xp.float64) - ref).max(axis=-1)
    den = xp.maximum(xp.abs(ref).max(axis=-1), 1e-300)
    return xp.nan_to_num(num / den, nan=np.inf)


# -- command line -----------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The attention options of ``python -m cunorm.bench`` (ignored by the row-wise ops)."""
    g = p.add_argument_group(
        "attention",
        "options of 'python -m cunorm.bench attention' (--dtypes, --peers, --quick, --out, "
        "--timer also apply; peers: " + ", ".join(ATTN_PEER_NAMES) + ")",
    )
    g.add_argument("--seqlens", nargs="+", metavar="L", help="forward sweep L (default 512..16384)")
    g.add_argument("--head-dims", nargs="+", metavar="D", help="forward sweep D (default 64 128)")
    g.add_argument(
        "--float32", action="store_true", help="add float32 cells at L = 512, 1024, 2048"
    )
    g.add_argument(
        "--decode-lks", nargs="+", metavar="LK", help="decoding Lk (default 4096..131072)"
    )
    g.add_argument(
        "--decode-batch", nargs="+", metavar="B", help="decoding batch sizes (default 1)"
    )
    g.add_argument("--no-main", action="store_true", help="skip the forward sweep")
    g.add_argument("--no-decode", action="store_true", help="skip the decoding sweep")
    g.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")


def _ints(items: list[str] | None) -> list[int]:
    return [int(part) for item in items or [] for part in item.split(",") if part.strip()]


def normalize_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill in the attention defaults; argument errors exit with status 2 (``p.error``)."""
    from .ops import canonical_dtype

    if args.cols or args.rows is not None:
        p.error("--cols/--rows do not apply to attention; use --seqlens, --head-dims")
    try:
        dtypes = [canonical_dtype(d) for item in args.dtypes or [] for d in item.split(",") if d]
        seqlens, head_dims = _ints(args.seqlens), _ints(args.head_dims)
        lks, batches = _ints(args.decode_lks), _ints(args.decode_batch)
        peers = [canonical_attention_peer(n) for item in args.peers or [] for n in item.split(",")]
    except ValueError as exc:
        p.error(str(exc))
    if any(n < 1 for n in [*seqlens, *head_dims, *lks, *batches]):
        p.error("--seqlens, --head-dims, --decode-lks and --decode-batch must be positive")
    bad = [d for d in head_dims if HIDDEN % d or d > 256]
    if bad:
        p.error(f"--head-dims {bad}: D must divide {HIDDEN} and be at most 256")
    args.dtypes = list(dict.fromkeys(dtypes or (QUICK_DTYPES if args.quick else DEFAULT_DTYPES)))
    args.seqlens = seqlens or list(QUICK_SEQLENS if args.quick else SEQLENS)
    args.head_dims = head_dims or list(HEAD_DIMS)
    args.decode_lks = lks or list(QUICK_DECODE_LKS if args.quick else DECODE_LKS)
    args.decode_batch = batches or list(DECODE_BATCHES)
    args.decode_dtypes = [d for d in args.dtypes if d in ("bfloat16", "float16")] or ["bfloat16"]
    args.peers = [] if args.no_peers else list(dict.fromkeys(peers or ATTN_PEER_NAMES))


def sweep_shapes(args: argparse.Namespace) -> tuple[list[AttnShape], list[AttnShape]]:
    """(forward shapes, decoding shapes) the normalized ``args`` ask for."""
    fwd: list[AttnShape] = []
    if not args.no_main:
        fwd = main_shapes(args.seqlens, args.head_dims, args.dtypes)
        if args.float32 and "float32" not in args.dtypes:
            lengths = [n for n in FLOAT32_SEQLENS if n in args.seqlens] or list(FLOAT32_SEQLENS)
            fwd += main_shapes(lengths, args.head_dims, ["float32"])
    dec = (
        []
        if args.no_decode
        else decode_shapes(args.decode_lks, args.decode_batch, args.decode_dtypes)
    )
    return fwd, dec


# -- entry point ------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """Run the attention benchmark on the GPU, or cunorm's NumPy path without one."""
    from .env import NO_GPU_MESSAGE, probe_gpu

    ok, why = probe_gpu()
    if not ok:
        print(NO_GPU_MESSAGE, flush=True)
        print(f"(reason: {why})", file=sys.stderr, flush=True)
        return run_numpy(args)
    from .attention_run import run_gpu

    return run_gpu(args)


def numpy_cases(seed: int = 0) -> list[tuple[AttnShape, Any, Any, Any]]:
    """Small float32 problems for the no-GPU run: (shape, q, k, v) NumPy arrays."""
    rng = np.random.default_rng(seed)
    cases = []
    for length in NUMPY_SEQLENS:
        for causal in (False, True):
            shape = AttnShape(
                1, NUMPY_HEADS, NUMPY_HEADS, length, length, NUMPY_D, causal, "float32"
            )
            q, k, v = (
                rng.standard_normal(s, dtype=np.float32)
                for s in (shape.q_shape, shape.kv_shape, shape.kv_shape)
            )
            cases.append((shape, q, k, v))
    return cases


def run_numpy(args: argparse.Namespace) -> int:
    """Time ``cunorm.attention``'s NumPy path on small float32 shapes, checked in float64."""
    from .ops import OPS, TOLERANCE
    from .peers import first_line
    from .report import MISSING, text_table
    from .timing import host_ms

    fn, why = OPS["attention"].resolve()
    if fn is None:
        print(why)
        return 2
    headers = ["L", "H", "D", "causal", "ms", "GFLOP/s", "max err", "status"]
    rows = []
    for shape, q, k, v in numpy_cases():
        ms, err, status = None, None, "ok"
        try:
            out = fn(q, k, v, causal=shape.causal)
            if not isinstance(out, np.ndarray) or out.shape != shape.q_shape:
                raise TypeError(
                    f"returned {type(out).__name__}, expected a {shape.q_shape} ndarray"
                )
            last = (
                causal_last_key(shape.lq, shape.lk, np.arange(shape.lq)) if shape.causal else None
            )
            err = float(row_errors(np, out, reference_attention(np, q, k, v, last_key=last)).max())
            if err > TOLERANCE["float32"]:
                status = f"MISMATCH (error {err:.1e})"
            ms = host_ms(lambda q=q, k=k, v=v, c=shape.causal: fn(q, k, v, causal=c))
        except Exception as exc:  # report and go on, as the row-wise NumPy run does
            status = f"ERROR ({type(exc).__name__}: {first_line(exc)})"
        rows.append(
            [
                str(shape.lq),
                str(shape.hq),
                str(shape.d),
                str(shape.causal),
                MISSING if ms is None else f"{ms:.3f}",
                MISSING if ms is None else f"{shape.flops / (ms * 1e-3) / 1e9:.2f}",
                MISSING if err is None else f"{err:.1e}",
                status,
            ]
        )
    print(text_table(headers, rows, right={0, 1, 2, 4, 5, 6}))
    return 0
