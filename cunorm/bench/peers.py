"""Peer implementations timed next to cunorm, each on the same input buffer.

A peer is built once per run (its constructor imports its library and fails if that library
or a GPU backend is missing: the peer is then dropped with the reason logged) and asked for a
callable per case (:meth:`Peer.build`; a case it does not cover raises
:class:`PeerUnavailable`, shown as '—'). The callable returns its output so the correctness
guard can check it before it is timed. A callable may carry a ``note`` attribute (what it
runs, where that depends on the installed version), which the sweep adds to the run notes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .cases import Case

# Names as they appear in table headers; the CLI also accepts the aliases.
PEER_NAMES = ("torch", "torch.compile", "cupyx", "jax", "triton")
PEER_ALIASES = {
    "eager": "torch",
    "compile": "torch.compile",
    "inductor": "torch.compile",
    "cupy": "cupyx",
}
# Peers run for the extra (non-last-axis) cases.
EXTRA_CASE_PEERS = ("torch", "torch.compile")
# torch.compile compiles one graph per input shape (dynamic=False); the sweep needs ~60 of them
# per op, far above Dynamo's default limit of 8 recompilations per function.
_DYNAMO_LIMIT = 1024


class PeerUnavailable(Exception):
    """The peer does not cover this case (dtype, shape or op); the message says why."""


class Peer:
    """One implementation to compare with.

    Attributes
    ----------
    name : str
        Column header.
    wall_clock : bool
        Time with :func:`~cunorm.bench.timing.wall_clock_ms` instead of CUDA events (the
        peer launches on streams the events do not bracket).
    """

    name = ""
    wall_clock = False

    def build(self, case: Case) -> Callable[[], Any]:
        """A zero-argument callable computing ``case`` and returning the output."""
        raise NotImplementedError


def import_jax_gpu() -> Any:
    """Import JAX without preallocation; RuntimeError unless its default backend is a GPU."""
    # Must be set before JAX's first import: by default it grabs 75% of GPU memory up
    # front, which would leave too little for the largest cells of the other libraries.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    backend = jax.default_backend()
    if backend not in ("gpu", "cuda"):
        raise RuntimeError(f"JAX has no GPU backend (default backend is {backend!r})")
    return jax


def import_torch_cuda() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch is installed without a usable CUDA device")
    return torch


class TorchEager(Peer):
    """PyTorch eager: ``torch.softmax``, ``torch.log_softmax``, ``F.layer_norm``,
    ``F.rms_norm`` (with weight, and bias for layer_norm); for the residual norms
    ``h = t + r`` then the norm of ``h``, returning ``(y, h)`` (two kernels); for the softmax
    gradients ``torch.ops.aten._softmax_backward_data(dy, y, dim, y.dtype)`` (or
    ``_log_softmax_backward_data``), what autograd runs; for the norm gradients
    ``torch.ops.aten.native_layer_norm_backward`` / ``_fused_rms_norm_backward`` on the
    statistics of torch's forward, computed before timing (see
    :meth:`~cunorm.bench.ops.OpSpec.torch_grad_label`)."""

    name = "torch"

    def __init__(self) -> None:
        self.torch = import_torch_cuda()

    def build(self, case: Case) -> Callable[[], Any]:
        return _with_note(case, self.torch, case.op.torch_fn(self.torch))


class TorchCompile(Peer):
    """``torch.compile(f, dynamic=False)`` of the eager function (Inductor writes Triton).

    One compiled function per (op, dtype); Dynamo recompiles it for each new shape, which the
    first, untimed call of each case pays. For the residual norms Inductor fuses the add into
    the norm kernel (one pass writing y and h), which makes it the strongest peer there; for
    the softmax gradients it generates one fused Triton kernel from the aten op's decomposition,
    and for the norm gradients Triton code from the backward op's decomposition (on torch's
    forward statistics, shared with the eager peer).
    """

    name = "torch.compile"

    def __init__(self) -> None:
        self.torch = import_torch_cuda()
        import torch._dynamo

        cfg = torch._dynamo.config
        # The limit was renamed (cache_size_limit -> recompile_limit); set whichever exist.
        for attr in (
            "cache_size_limit",
            "recompile_limit",
            "accumulated_cache_size_limit",
            "accumulated_recompile_limit",
        ):
            if hasattr(cfg, attr):
                try:
                    setattr(cfg, attr, _DYNAMO_LIMIT)
                except Exception:  # a deprecated alias may refuse assignment
                    pass
        self._compiled: dict[tuple[str, str], Callable[..., Any]] = {}

    def build(self, case: Case) -> Callable[[], Any]:
        key = (case.op.name, case.dtype)
        if key not in self._compiled:
            self._compiled[key] = self.torch.compile(case.op.torch_fn(self.torch), dynamic=False)
        return _with_note(case, self.torch, self._compiled[key])


def _with_note(case: Case, torch: Any, f: Callable[..., Any]) -> Callable[[], Any]:
    """``f`` applied to the case's torch arguments (:meth:`Case.torch_args`: for a norm
    gradient these include torch's forward statistics, computed here, before timing); for
    rms_norm_backward the callable's ``note`` says which torch backward it runs."""
    args = case.torch_args()

    def call() -> Any:
        return f(*args)

    if case.op.family == "norm_grad" and case.op.rms:
        call.note = case.op.torch_grad_label(torch)  # type: ignore[attr-defined]
    return call


class Cupyx(Peer):
    """``cupyx.scipy.special.softmax`` / ``log_softmax`` (float16/float32/float64 only); no
    norms and no gradients."""

    name = "cupyx"

    def __init__(self) -> None:
        from cupyx.scipy import special

        self.special = special

    def build(self, case: Case) -> Callable[[], Any]:
        if case.op.family == "softmax_grad":
            raise PeerUnavailable(
                f"cupyx.scipy.special has no softmax gradient; {case.op.name} not timed"
            )
        if case.op.family == "norm_grad":
            raise PeerUnavailable(
                f"cupyx.scipy.special has no norms and no norm gradient; {case.op.name} not timed"
            )
        if case.op.family != "softmax":
            raise PeerUnavailable(f"cupyx.scipy.special has no {case.op.name}")
        if case.dtype == "bfloat16":
            raise PeerUnavailable(
                "bfloat16 skipped (cupyx.scipy.special is timed on float16/float32 only)"
            )
        f = self.special.log_softmax if case.op.log else self.special.softmax
        x, axis = case.x, case.axis
        # axis must be explicit: SciPy's default (None) normalizes over the whole array.
        return lambda: f(x, axis=axis)


class Jax(Peer):
    """``jax.jit`` of ``jax.nn.softmax`` / ``log_softmax`` and of norms and softmax gradients
    written in ``jnp`` (with the residual add in the same jitted function for the residual
    norms), and of ``jax.vjp`` of the ``jnp`` norms for the norm gradients (the forward's
    statistics recomputed inside), timed with wall clock around ``block_until_ready()``
    (includes dispatch)."""

    name = "jax"
    wall_clock = True

    def __init__(self) -> None:
        self.jax = import_jax_gpu()
        self._jitted: dict[tuple[str, int], Callable[..., Any]] = {}

    def build(self, case: Case) -> Callable[[], Any]:
        key = (case.op.name, case.axis)
        if key not in self._jitted:
            self._jitted[key] = self.jax.jit(case.op.jax_fn(self.jax, case.axis))
        f = self._jitted[key]
        x, w, b, r = case.jax()
        # Residual norms return the pair (y, h), norm gradients (dx, dweight[, dbias]): wait for
        # every array.
        block = getattr(self.jax, "block_until_ready", None) or _block_each
        return lambda: block(f(x, w, b, r))


class Triton(Peer):
    """The minimal one-row-per-program Triton kernels of :mod:`cunorm.bench.triton_kernels`
    (forward softmax and norms only)."""

    name = "triton"

    def __init__(self) -> None:
        import_torch_cuda()
        from . import triton_kernels

        self.k = triton_kernels

    def build(self, case: Case) -> Callable[[], Any]:
        k, op = self.k, case.op
        if op.grad:
            # torch.compile's column is the Triton code for these (Inductor writes it).
            raise PeerUnavailable(
                f"the minimal Triton kernels are forward only (no backward); {op.name} not timed"
            )
        if op.family not in ("softmax", "norm"):
            raise PeerUnavailable(f"no Triton kernel for {op.name}")
        if case.dtype not in k.DTYPES:
            raise PeerUnavailable(f"{case.dtype} not covered by the minimal kernel")
        if case.x.ndim != 2 or not case.last_axis:
            raise PeerUnavailable("covers the last axis of a 2-D array only")
        if op.residual:
            raise PeerUnavailable(
                f"the minimal Triton norm kernel has no fused residual add; {op.name} not timed"
            )
        if case.cols > k.MAX_COLS:
            raise PeerUnavailable(f"cols > {k.MAX_COLS}: a row does not fit in registers")
        t, w, b, _ = case.torch()
        if op.family == "softmax":
            log = op.log
            return lambda: k.softmax(t, log)
        eps, rms = op.eps, op.rms
        return lambda: k.norm(t, w, b, eps, rms)


def _block_each(out: Any) -> Any:
    """``block_until_ready()`` on a JAX array or on each array of a tuple (older JAX without
    ``jax.block_until_ready``)."""
    for a in out if isinstance(out, tuple | list) else (out,):
        a.block_until_ready()
    return out


_PEER_CLASSES: dict[str, type[Peer]] = {
    "torch": TorchEager,
    "torch.compile": TorchCompile,
    "cupyx": Cupyx,
    "jax": Jax,
    "triton": Triton,
}


def canonical_peer(name: str) -> str:
    """Canonical peer name (``"compile"`` -> ``"torch.compile"``); ValueError if unknown."""
    name = PEER_ALIASES.get(name.strip().lower(), name.strip().lower())
    if name not in _PEER_CLASSES:
        raise ValueError(f"unknown peer {name!r}; expected some of {', '.join(PEER_NAMES)}")
    return name


def make_peers(
    names: tuple[str, ...] | list[str] = PEER_NAMES, log: Callable[[str], None] = print
) -> list[Peer]:
    """Construct the requested peers; one that cannot start is dropped with a logged reason."""
    peers: list[Peer] = []
    for name in names:
        try:
            peers.append(_PEER_CLASSES[name]())
        except Exception as exc:  # ImportError, no GPU backend, broken install: all the same here
            log(f"peer {name} unavailable: {type(exc).__name__}: {first_line(exc)}")
    return peers


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
