"""Measuring attention on the GPU: the forward and decoding sweeps and the peak-memory table.

Each cell: inputs made once, the guard's reference (a torch SDPA backend), then cunorm and each
peer: first call (a peer refusing the shape is 'n/a' with its reason), check, timing. Results
are plain dataclasses; :mod:`cunorm.bench.attention_report` turns them into tables and files.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .attention import REP_MS, WARMUP_MS, AttnShape, memory_shapes, sweep_shapes, tflops
from .attention_peers import (
    AttnCase,
    AttnPeer,
    check_attention,
    first_call,
    make_attention_peers,
    make_attn_case,
    torch_reference,
)
from .cases import free_memory, synchronize
from .peers import PeerUnavailable, first_line
from .sweep import Notes, Progress, Result
from .timing import L2_FLUSH_BYTES, Timer, gbps, wall_clock_ms

MB = 1e6  # reports give MB = 10**6 bytes, as GB/s is 10**9 bytes per second


@dataclass
class AttnResult(Result):
    """One implementation in one cell: :class:`~cunorm.bench.sweep.Result` plus TFLOP/s.

    Forward cells fill ``tflops``; decoding cells fill ``gbps`` (of K/V read).
    """

    tflops: float | None = None

    @property
    def usable(self) -> bool:
        return self.status == "ok" and (self.tflops is not None or self.gbps is not None)


@dataclass
class AttnCell:
    """All implementations on one attention problem."""

    kind: str  # "forward" (TFLOP/s) or "decode" (GB/s of K/V read)
    shape: AttnShape
    cunorm: AttnResult = field(default_factory=AttnResult)
    peers: dict[str, AttnResult] = field(default_factory=dict)
    reference: str = ""  # torch backend the guard compared with ("": float64 sample)

    def value(self, r: AttnResult | None) -> float | None:
        """The cell's metric for ``r`` if it is usable (TFLOP/s or GB/s), else None."""
        if r is None or not r.usable:
            return None
        return r.tflops if self.kind == "forward" else r.gbps

    def best_peer(self) -> tuple[str, float] | None:
        """(name, value) of the fastest peer that passed the guard, or None."""
        ok = [(n, v) for n, r in self.peers.items() if (v := self.value(r)) is not None]
        return max(ok, key=lambda p: p[1]) if ok else None

    def ratio(self, peer: str | None = None) -> float | None:
        """cunorm / ``peer`` (default: the best peer), None where either is missing."""
        mine = self.value(self.cunorm)
        if peer is None:
            best = self.best_peer()
            theirs = best[1] if best else None
        else:
            theirs = self.value(self.peers.get(peer))
        return mine / theirs if mine is not None and theirs else None

    def set_metrics(self) -> None:
        """TFLOP/s or GB/s of every timed result, from its ms."""
        for r in (self.cunorm, *self.peers.values()):
            if r.ms is None:
                continue
            if self.kind == "forward":
                r.tflops = tflops(self.shape.flops, r.ms)
            else:
                r.gbps = gbps(self.shape.kv_bytes, r.ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "shape": self.shape.to_dict(),
            "flops": self.shape.flops,
            "kv_bytes": self.shape.kv_bytes,
            "reference": self.reference,
            "cunorm": asdict(self.cunorm),
            "peers": {n: asdict(r) for n, r in self.peers.items()},
        }


@dataclass
class AttnRun:
    """The whole attention benchmark: the peers, three tables, run notes."""

    peers: list[str]
    forward: list[AttnCell] = field(default_factory=list)
    decode: list[AttnCell] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class AttentionBench:
    """Times cunorm and the peers cell by cell with one timer."""

    def __init__(self, timer: Timer, notes: Notes, fn: Callable[..., Any]) -> None:
        import cupy

        self.timer, self.notes, self.fn = timer, notes, fn
        self._flush_buf = cupy.empty(L2_FLUSH_BYTES, dtype=cupy.int8)
        self._refused: set[tuple[str, str, str, bool]] = set()

    def _note_refusal(self, peer: str, part: str, shape: AttnShape, reason: str) -> None:
        """Note why ``peer`` refused, once per (peer, part, dtype, GQA or not): torch's messages
        carry the tensor sizes, so the same refusal would otherwise be noted for every cell."""
        key = (peer, part, shape.dtype, shape.gqa)
        if key not in self._refused:
            self._refused.add(key)
            gqa = ", grouped-query" if shape.gqa else ""
            self.notes(
                f"{peer}: n/a in {part} cells ({shape.dtype}{gqa}), e.g. {shape.label}: {reason}"
            )

    def _flush_and_sync(self) -> None:
        self._flush_buf.fill(0)
        synchronize()

    def _cunorm(self, case: AttnCase) -> Callable[[], Any]:
        fn, q, k, v, causal = self.fn, case.q, case.k, case.v, case.shape.causal
        return lambda: fn(q, k, v, causal=causal)

    # -- sweeps -------------------------------------------------------------------------------
    def sweep(
        self, shapes: list[AttnShape], kind: str, peers: list[AttnPeer], progress: Progress
    ) -> list[AttnCell]:
        return [self._cell(s, kind, peers, progress) for s in shapes]

    def _cell(
        self, shape: AttnShape, kind: str, peers: list[AttnPeer], progress: Progress
    ) -> AttnCell:
        cell = AttnCell(kind, shape)
        case: AttnCase | None = None
        ref = None
        steps = 0
        try:
            case = make_attn_case(shape)
            ref, cell.reference = torch_reference(case, peers)
            cell.cunorm = self._measure(case, "cunorm", self._cunorm(case), None, ref, True)
            progress.step(f"{shape.label} cunorm")
            steps += 1
            for peer in peers:
                cell.peers[peer.name] = self._run_peer(case, peer, ref, cell.reference)
                progress.step(f"{shape.label} {peer.name}")
                steps += 1
        except Exception as exc:  # input creation failed (out of memory, say): skip the cell
            self.notes(
                f"attention {shape.label}: cell skipped ({type(exc).__name__}: {first_line(exc)})"
            )
            if steps == 0:
                cell.cunorm = AttnResult(status="ERROR", note=first_line(exc))
            for _ in range(steps, 1 + len(peers)):
                progress.step(f"{shape.label} skipped")
        finally:
            case = ref = None
            free_memory()
        cell.set_metrics()
        return cell

    def _run_peer(self, case: AttnCase, peer: AttnPeer, ref: Any, ref_name: str) -> AttnResult:
        s = case.shape
        try:
            fn = peer.build(case)
            out = first_call(peer, fn)
        except PeerUnavailable as exc:
            self._note_refusal(peer.name, "forward" if s.lq > 1 else "decoding", s, str(exc))
            return AttnResult(status="n/a", note=str(exc))
        except Exception as exc:
            self.notes(f"{peer.name} {s.label}: {type(exc).__name__}: {first_line(exc)}")
            return AttnResult(status="ERROR", note=first_line(exc))
        # The reference backend is not checked against itself.
        return self._measure(case, peer.name, fn, peer, ref, peer.name != ref_name, out)

    def _measure(
        self,
        case: AttnCase,
        name: str,
        fn: Callable[[], Any],
        peer: AttnPeer | None,
        ref: Any,
        check: bool,
        out: Any = None,
    ) -> AttnResult:
        """First call unless given (compiles, allocates), guard, then the timing."""
        res = AttnResult()
        ctx = peer.context() if peer is not None else contextlib.nullcontext()
        try:
            with ctx:
                if out is None:
                    out = fn()
                    synchronize()
                if check:
                    c = check_attention(case, out, ref, peer.layout if peer else "bhld")
                    res.err, res.note = c.err, c.note
                    if not c.ok:
                        res.status = "MISMATCH"
                        self.notes(f"MISMATCH {name} attention {case.shape.label}: {c.note}")
                out = None
                if peer is not None and peer.wall_clock:
                    res.ms = wall_clock_ms(
                        fn, self._flush_and_sync, warmup=2, rep_ms=REP_MS, min_reps=5
                    )
                else:
                    res.ms = self.timer(fn)
        except Exception as exc:  # an implementation failing must not end the sweep
            res.status = "ERROR"
            res.note = f"{type(exc).__name__}: {first_line(exc)}"
            self.notes(f"{name} attention {case.shape.label}: {res.note}")
        free_memory()
        return res

    # -- peak memory --------------------------------------------------------------------------
    def memory(
        self, shapes: list[AttnShape], peers: list[AttnPeer], progress: Progress
    ) -> list[dict[str, Any]]:
        """Peak extra memory of one call, cunorm and each torch backend, per shape."""
        rows = []
        for shape in shapes:
            try:
                case: AttnCase | None = make_attn_case(shape)
            except Exception as exc:  # out of memory, say: report it and go on
                why = f"{type(exc).__name__}: {first_line(exc)}"
                self.notes(f"memory {shape.label}: inputs not created ({why})")
                for name in ["cunorm", *(p.name for p in peers)]:
                    rows.append({**_memory_row(name, shape), "status": "ERROR", "note": why})
                    progress.step(f"memory {shape.label} skipped")
                case = None
                free_memory()
                continue
            rows.append(self._cunorm_memory(case))
            progress.step(f"memory {shape.label} cunorm")
            for peer in peers:
                row = _torch_memory(peer, case)
                if row["status"] == "n/a":
                    self._note_refusal(peer.name, "memory", shape, row["note"])
                elif row["status"] != "ok":
                    self.notes(f"memory {peer.name} {shape.label}: {row['note']}")
                rows.append(row)
                progress.step(f"memory {shape.label} {peer.name}")
            case = None
            free_memory()
        return rows

    def _cunorm_memory(self, case: AttnCase) -> dict[str, Any]:
        """cunorm's peak: a CuPy memory hook (pool bytes in use, peak over the call), the
        pool's growth, and the drop in the device's free memory, each less the output."""
        import cupy

        row = _memory_row("cunorm", case.shape)
        call = self._cunorm(case)
        try:
            out = call()  # warm-up: kernels compiled and loaded outside the measurement
            synchronize()
            out = None
            free_memory()
            pool = cupy.get_default_memory_pool()
            total0, free0 = pool.total_bytes(), cupy.cuda.runtime.memGetInfo()[0]
            hook = _peak_hook()
            with hook:
                out = call()
                synchronize()
            total1, free1 = pool.total_bytes(), cupy.cuda.runtime.memGetInfo()[0]
            out_bytes = int(out.nbytes)
            row.update(
                extra_mb=(hook.peak - out_bytes) / MB,
                pool_growth_mb=(total1 - total0 - out_bytes) / MB,
                device_mb=(free0 - free1 - out_bytes) / MB,
            )
        except Exception as exc:
            row.update(status="ERROR", note=f"{type(exc).__name__}: {first_line(exc)}")
            self.notes(f"memory cunorm {case.shape.label}: {row['note']}")
        out = None
        free_memory()
        return row


def _memory_row(impl: str, shape: AttnShape) -> dict[str, Any]:
    return {
        "impl": impl,
        "shape": shape.to_dict(),
        "causal": shape.causal,
        "io_mb": shape.io_bytes / MB,
        "extra_mb": None,
        "pool_growth_mb": None,
        "device_mb": None,
        "status": "ok",
        "note": "",
    }


def _peak_hook() -> Any:
    """A CuPy memory hook tracking the peak of pool bytes in use since it was entered."""
    from cupy.cuda import memory_hook

    class PeakHook(memory_hook.MemoryHook):  # type: ignore[misc]
        name = "cunorm_bench_peak"

        def __init__(self) -> None:
            self.current = 0
            self.peak = 0

        def malloc_postprocess(self, **kw: Any) -> None:
            self.current += int(kw["mem_size"])
            self.peak = max(self.peak, self.current)

        def free_postprocess(self, **kw: Any) -> None:
            self.current -= int(kw["mem_size"])

    return PeakHook()


def _torch_memory(peer: AttnPeer, case: AttnCase) -> dict[str, Any]:
    """A torch backend's peak: ``torch.cuda.max_memory_allocated`` over the second call, less
    what was allocated before it and less the output (q, k, v belong to CuPy's pool)."""
    row = _memory_row(peer.name, case.shape)
    torch = getattr(peer, "torch", None)
    if torch is None:
        row.update(status="n/a", note="not a torch backend")
        return row
    try:
        fn = peer.build(case)
        first_call(peer, fn)
        free_memory()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with peer.context():
            out = fn()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size()
        row.update(extra_mb=extra / MB)
    except PeerUnavailable as exc:
        row.update(status="n/a", note=str(exc))
    except Exception as exc:
        row.update(status="ERROR", note=f"{type(exc).__name__}: {first_line(exc)}")
    out = None
    free_memory()
    return row


# -- the command ------------------------------------------------------------------------------
def run_gpu(args: argparse.Namespace) -> int:
    """``python -m cunorm.bench attention`` on a GPU: measure, print, write the files."""
    from .attention_report import print_report, summarize, write_attention_files
    from .env import run_meta
    from .ops import OPS
    from .timing import copy_bandwidth, make_timer

    fn, why = OPS["attention"].resolve()
    if fn is None:
        print(why)
        return 2
    notes = Notes()
    meta: dict[str, Any] = run_meta(args.command)
    timer = make_timer(args.timer, warmup_ms=WARMUP_MS, rep_ms=REP_MS)
    copy = copy_bandwidth(timer)
    meta.update(copy_gbps=copy, timer=timer.method)
    print(
        f"{meta['device']}: device-to-device copy {copy:.0f} GB/s (read + write); "
        f"timer: {timer.method}",
        flush=True,
    )
    peers = make_attention_peers(args.peers, notes)
    torch_peers = [p for p in peers if p.torch_backend]
    fwd, dec = sweep_shapes(args)
    mem = [] if args.no_memory else memory_shapes()
    if torch_peers and dec:
        sdpa = torch_peers[0]
        how = (
            "enable_gqa=True"
            if getattr(sdpa, "enable_gqa", False)
            else "K/V heads repeated beforehand (no enable_gqa in this torch; those peers read "
            "Hq/Hkv times the K/V bytes)"
        )
        notes(f"decoding: torch SDPA gets GQA through {how}")
    total = len(fwd) * (1 + len(peers)) + (len(dec) + len(mem)) * (1 + len(torch_peers))
    progress = Progress(total, "attention")
    notes.sink = progress.write
    bench = AttentionBench(timer, notes, fn)
    run = AttnRun([p.name for p in peers])
    try:
        # Memory first, before JAX's allocator has grown its pool; forward sweep last.
        run.memory = bench.memory(mem, torch_peers, progress)
        run.decode = bench.sweep(dec, "decode", torch_peers, progress)
        run.forward = bench.sweep(fwd, "forward", peers, progress)
    finally:
        progress.close()
        notes.sink = lambda m: print(m, file=sys.stderr, flush=True)
    run.notes = list(notes.lines)
    summary = summarize(run, copy)
    print_report(meta, run, summary)
    if not args.no_save:
        paths = write_attention_files(args.out, meta, run, summary, plot=not args.no_plot)
        for path in paths:
            print(f"wrote {path}")
        if not args.no_plot and not any(p.suffix == ".png" for p in paths):
            print("no plot written: matplotlib is not installed (pip install matplotlib)")
    return 0
