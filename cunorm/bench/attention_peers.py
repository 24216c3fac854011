"""Attention inputs shared by cunorm, PyTorch and JAX, the peers, and the correctness guard.

q, k and v are created once per cell with CuPy in the ``(B, H, L, D)`` layout cunorm and torch
SDPA take (contiguous, random normal) and handed to torch through DLPack (zero-copy). JAX's
``dot_product_attention`` takes ``(B, L, H, D)``: it gets a contiguous transposed copy made
once, untimed, holding the same values.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .attention import (
    JAX_IMPLEMENTATIONS,
    SDPA_BACKENDS,
    AttnShape,
    causal_last_key,
    reference_attention,
    row_errors,
)
from .cases import (
    Check,
    _err_rows_torch,
    _f64,
    random_normal,
    synchronize,
    to_cupy,
    to_jax,
    to_torch,
)
from .ops import TOLERANCE
from .peers import PeerUnavailable, first_line, import_jax_gpu, import_torch_cuda

# Rows the float64 reference is evaluated on (the worst against torch, or a sample).
_REF_ROWS = 16


@dataclass
class AttnCase:
    """q, k, v of one cell (CuPy) and their lazily made torch / JAX forms."""

    shape: AttnShape
    q: Any
    k: Any
    v: Any
    _torch: tuple[Any, Any, Any] | None = field(default=None, repr=False)
    _repeated: tuple[Any, Any] | None = field(default=None, repr=False)
    _jax: tuple[Any, ...] | None = field(default=None, repr=False)

    def torch(self) -> tuple[Any, Any, Any]:
        """``(q, k, v)`` as torch tensors sharing the CuPy buffers."""
        if self._torch is None:
            self._torch = (to_torch(self.q), to_torch(self.k), to_torch(self.v))
        return self._torch

    def torch_repeated_kv(self) -> tuple[Any, Any]:
        """K and V with each KV head repeated Hq / Hkv times (a copy, made once, untimed),
        for a torch without ``enable_gqa``."""
        if self._repeated is None:
            g = self.shape.hq // self.shape.hkv
            _, k, v = self.torch()
            self._repeated = (k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1))
        return self._repeated

    def jax_blhd(self) -> tuple[Any, ...]:
        """``(q, k, v)`` as JAX arrays in ``(B, L, H, D)`` (contiguous copies, made once)."""
        if self._jax is None:
            import cupy

            blhd = [
                cupy.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (self.q, self.k, self.v)
            ]
            synchronize()
            # Keep the CuPy buffers alive next to the zero-copy JAX views of them.
            self._jax = (*(to_jax(a) for a in blhd), *blhd)
        return self._jax[:3]


def make_attn_case(shape: AttnShape, seed: int = 0) -> AttnCase:
    """Random normal q, k, v for ``shape`` (drawn in float32, cast to its dtype)."""
    import cupy

    rs = cupy.random.RandomState(seed)
    q = random_normal(shape.q_shape, shape.dtype, rs)
    k = random_normal(shape.kv_shape, shape.dtype, rs)
    v = random_normal(shape.kv_shape, shape.dtype, rs)
    synchronize()  # torch and JAX read through DLPack: the data must exist first
    return AttnCase(shape, q, k, v)


# -- peers ------------------------------------------------------------------------------------
class AttnPeer:
    """One attention implementation to compare with.

    Attributes
    ----------
    name : str
        Column header.
    wall_clock : bool
        Timed with wall clock around a blocking call (JAX runs on its own streams).
    layout : {"bhld", "blhd"}
        Layout of the output the callable returns.
    torch_backend : bool
        A torch SDPA backend (also run in the decoding sweep and the memory table).
    """

    name = ""
    wall_clock = False
    layout = "bhld"
    torch_backend = False

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """Context the calls (first call and timing) run in."""
        return contextlib.nullcontext()

    def build(self, case: AttnCase) -> Callable[[], Any]:
        """A zero-argument callable computing ``case`` and returning the output."""
        raise NotImplementedError


def torch_has_enable_gqa(version: str) -> bool:
    """Whether ``F.scaled_dot_product_attention`` takes ``enable_gqa`` (torch >= 2.5).

    Examples
    --------
    >>> torch_has_enable_gqa("2.11.0+cu130"), torch_has_enable_gqa("2.4.1")
    (True, False)
    """
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    return (major, minor) >= (2, 5)


class SdpaPeer(AttnPeer):
    """``F.scaled_dot_product_attention(q, k, v, is_causal=...)`` inside
    ``torch.nn.attention.sdpa_kernel([SDPBackend.<backend>])`` (no context for the default).

    Grouped-query cells pass ``enable_gqa=True`` (torch >= 2.5); an older torch gets K/V with
    the heads repeated (a copy made once, untimed; that peer then reads Hq/Hkv times the K/V
    bytes).
    """

    wall_clock = False
    torch_backend = True

    def __init__(self, name: str, backend: str | None) -> None:
        self.torch = import_torch_cuda()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.name = name
        self._sdpa_kernel = sdpa_kernel
        self.backend = None
        if backend is not None:
            self.backend = getattr(SDPBackend, backend, None)
            if self.backend is None:
                raise RuntimeError(f"torch {self.torch.__version__} has no SDPBackend.{backend}")
        self.enable_gqa = torch_has_enable_gqa(self.torch.__version__)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        if self.backend is None:
            return contextlib.nullcontext()
        return self._sdpa_kernel([self.backend])

    def build(self, case: AttnCase) -> Callable[[], Any]:
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        q, k, v = case.torch()
        kw: dict[str, Any] = {"is_causal": case.shape.causal}
        if case.shape.gqa:
            if self.enable_gqa:
                kw["enable_gqa"] = True
            else:
                k, v = case.torch_repeated_kv()
        return lambda: sdpa(q, k, v, **kw)


class JaxPeer(AttnPeer):
    """``jax.jit`` of ``jax.nn.dot_product_attention(q, k, v, is_causal=...,
    implementation=...)`` on ``(B, L, H, D)`` arrays; wall clock around
    ``block_until_ready()``."""

    wall_clock = True
    layout = "blhd"

    def __init__(self, name: str, implementation: str | None) -> None:
        self.jax = import_jax_gpu()
        self.name, self.implementation = name, implementation
        self._jitted: dict[bool, Callable[..., Any]] = {}

    def build(self, case: AttnCase) -> Callable[[], Any]:
        jax, causal = self.jax, case.shape.causal
        if causal not in self._jitted:
            impl = self.implementation

            def f(q: Any, k: Any, v: Any) -> Any:
                return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)

            self._jitted[causal] = jax.jit(f)
        f_jit = self._jitted[causal]
        q, k, v = case.jax_blhd()
        return lambda: f_jit(q, k, v).block_until_ready()


def make_attention_peers(names: list[str], log: Callable[[str], None]) -> list[AttnPeer]:
    """Construct the requested peers; one that cannot start is dropped with a logged reason."""
    peers: list[AttnPeer] = []
    for name in names:
        try:
            if name in SDPA_BACKENDS:
                peers.append(SdpaPeer(name, SDPA_BACKENDS[name]))
            else:
                peers.append(JaxPeer(name, JAX_IMPLEMENTATIONS[name]))
        except Exception as exc:  # ImportError, no GPU backend, old torch: all the same here
            log(f"peer {name} unavailable: {type(exc).__name__}: {first_line(exc)}")
    return peers


def first_call(peer: AttnPeer, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` once inside the peer's context; a refusal raises :class:`PeerUnavailable`
    with torch's reasons (the warnings SDPA emits for each backend it could not use)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with peer.context():
                out = fn()
            synchronize()
            return out
        except Exception as exc:
            reasons = [_reason(str(w.message)) for w in caught]
            why = "; ".join(r for r in dict.fromkeys(reasons) if r)
            raise PeerUnavailable(why[:400] or f"{type(exc).__name__}: {first_line(exc)}") from exc


def _reason(message: str) -> str:
    """One line of a torch SDPA warning, without its "(Triggered internally at ...)" tail;
    empty for the "... not used because:" headers and for the backends ``sdpa_kernel`` itself
    turned off ("... has been runtime disabled."), which say nothing about the shape."""
    line = (message.strip().splitlines() or [""])[0]
    line = re.sub(r"\s*\(Triggered internally at .*$", "", line).strip()
    return "" if line.endswith("because:") or "runtime disabled" in line else line


# -- correctness guard ------------------------------------------------------------------------
def torch_reference(case: AttnCase, peers: list[AttnPeer]) -> tuple[Any, str]:
    """(output, name) of the first torch SDPA backend that runs the case, flash first, or
    (None, "") without torch: the guard's reference for every other output."""
    order = {"flash": 0, "efficient": 1, "cudnn": 2, "default": 3}
    for peer in sorted((p for p in peers if p.torch_backend), key=lambda p: order.get(p.name, 9)):
        try:
            return first_call(peer, peer.build(case)), peer.name
        except Exception:  # the next backend, then the float64 sample
            continue
    return None, ""


def bhld(out: Any, layout: str) -> Any:
    """A torch view of ``out`` in ``(B, H, L, D)``."""
    t = to_torch(out)
    return t.transpose(1, 2) if layout == "blhd" else t


def _out_row_f64(out: Any, layout: str, b: int, h: int, i: int) -> Any:
    """Row ``(b, h, i)`` of an output as a ``(1, D)`` float64 CuPy array: converted by torch
    where it is installed (any dtype crosses DLPack as float64), else by CuPy."""
    try:
        import torch  # noqa: F401
    except ImportError:
        o = to_cupy(out)
        return _f64(o[b, i, h][None] if layout == "blhd" else o[b, h, i : i + 1])
    return to_cupy(bhld(out, layout)[b, h, i : i + 1].double().contiguous())


def _f64_rows_error(case: AttnCase, out: Any, layout: str, rows: Any) -> float:
    """Max relative error of the given flat rows of ``(B, Hq, Lq)`` against float64 (CuPy)."""
    import cupy

    s = case.shape
    group = s.hq // s.hkv
    worst = 0.0
    for b, h, i in zip(*np.unravel_index(np.asarray(rows), (s.batch, s.hq, s.lq)), strict=True):
        b, h, i = int(b), int(h), int(i)
        ref = reference_attention(
            cupy,
            _f64(case.q[b, h, i : i + 1]),
            _f64(case.k[b, h // group]),
            _f64(case.v[b, h // group]),
            last_key=causal_last_key(s.lq, s.lk, [i]) if s.causal else None,
        )
        err = row_errors(cupy, _out_row_f64(out, layout, b, h, i), ref)
        worst = max(worst, float(err.max()))
    return worst


def check_attention(case: AttnCase, out: Any, ref: Any | None, layout: str = "bhld") -> Check:
    """Compare an attention output with the reference, as the row-wise guard does.

    With a torch SDPA output ``ref``: every row (one query of one head, over D) is compared;
    if the error passes the dtype tolerance, the worst rows are re-checked against float64, so
    the reference's own rounding is not blamed on ``out``. Without ``ref``: a sample of rows
    against float64.
    """
    s = case.shape
    tol = TOLERANCE[s.dtype]
    shape = tuple(int(n) for n in out.shape)
    if layout == "blhd" and len(shape) == 4:
        shape = (shape[0], shape[2], shape[1], shape[3])
    if shape != s.q_shape:
        return Check(False, float("inf"), f"output shape {shape}, expected {s.q_shape}")
    n_rows = s.batch * s.hq * s.lq
    if ref is not None:
        got = bhld(out, layout)
        err_rows = _err_rows_torch(got.reshape(n_rows, s.d), ref.reshape(n_rows, s.d))
        err = float(err_rows.max())
        if err <= tol:
            return Check(True, err)
        worst = err_rows.topk(min(_REF_ROWS, n_rows)).indices.cpu().numpy()
        err64 = _f64_rows_error(case, out, layout, worst)
        if err64 <= tol:
            return Check(
                True,
                err64,
                f"differs from torch by {err:.2e}, but is within {tol:g} "
                f"of float64 ({err64:.2e}) on the worst rows",
            )
        return Check(
            False,
            err64,
            f"error {err64:.2e} vs float64 (tolerance {tol:g}); {err:.2e} vs torch SDPA",
        )
    rows = np.unique(np.linspace(0, n_rows - 1, min(n_rows, 4 * _REF_ROWS)).astype(np.int64))
    err64 = _f64_rows_error(case, out, layout, rows)
    if err64 <= tol:
        return Check(True, err64, "checked on sampled rows against float64")
    return Check(False, err64, f"error {err64:.2e} vs float64 on sampled rows (tolerance {tol:g})")
