"""The sweep: for each (dtype, cols) cell, check then time cunorm and every peer.

Also the two small side benchmarks (per-call host overhead, and the NumPy reference path used
when there is no GPU). Results are plain dataclasses; :mod:`cunorm.bench.report` turns them
into tables, markdown, JSON and plots.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .cases import Case, check_output, free_memory, make_case, synchronize
from .ops import OpSpec
from .peers import EXTRA_CASE_PEERS, Peer, PeerUnavailable, first_line
from .timing import L2_FLUSH_BYTES, Timer, gbps, host_ms, wall_clock_ms

# OneFlow's sweep (DESIGN.md section 6): 49152 rows, powers of two plus 1000, 3000, 5120, 12288.
STANDARD_COLS = (
    32,
    64,
    128,
    256,
    512,
    1000,
    1024,
    2048,
    3000,
    4096,
    5120,
    8192,
    12288,
    16384,
    32768,
    65536,
    131072,
    262144,
)
QUICK_COLS = (128, 1024, 4096, 16384, 65536)
DEFAULT_DTYPES = ("float16", "bfloat16", "float32")
STANDARD_ROWS = 49152
# Above 32768 cols the row count drops so the tensor stays at about 49152 * 4096 elements
# (805 MB of float32): 65536 -> 3072 rows, 131072 -> 1536, 262144 -> 768. 49152 full rows of
# 262144 float32 would be 51 GB per array, more than inputs plus outputs of every peer can share.
LONG_ROW_COLS = 32768
LONG_ROW_ELEMS = STANDARD_ROWS * 4096

# The NumPy fallback: small enough to take seconds on a laptop.
NUMPY_COLS = (32, 128, 1024, 4096, 16384)
NUMPY_MAX_ROWS = 4096
NUMPY_MAX_ELEMS = 2**24


def rows_for(cols: int, rows: int | None = None) -> int:
    """Rows of the standard sweep for ``cols`` (or ``rows`` when given)."""
    if rows:
        return rows
    if cols <= LONG_ROW_COLS:
        return STANDARD_ROWS
    return min(STANDARD_ROWS, max(1, LONG_ROW_ELEMS // cols))


# -- results ----------------------------------------------------------------------------------
@dataclass
class Result:
    """One implementation in one cell.

    ``status`` is ``"ok"``, ``"MISMATCH"`` (output failed the guard; the time is kept in the
    JSON but not shown), ``"ERROR"`` (raised) or ``"n/a"`` (peer does not cover the case).
    """

    ms: float | None = None
    gbps: float | None = None
    status: str = "ok"
    err: float | None = None
    note: str = ""

    @property
    def usable(self) -> bool:
        return self.status == "ok" and self.gbps is not None


@dataclass
class Cell:
    """All implementations on one input."""

    op: str
    dtype: str
    shape: tuple[int, ...]
    axis: int
    rows: int
    cols: int
    nbytes: int
    cunorm: Result = field(default_factory=Result)
    peers: dict[str, Result] = field(default_factory=dict)

    def best_peer(self) -> tuple[str, float] | None:
        """(name, GB/s) of the fastest peer that passed the guard, or None."""
        ok = [
            (name, float(r.gbps))
            for name, r in self.peers.items()
            if r.usable and r.gbps is not None
        ]
        return max(ok, key=lambda p: p[1]) if ok else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OpRun:
    """One op's sweep: standard cells, extra layouts, peer columns and run notes."""

    op: str
    peers: list[str]
    cells: list[Cell] = field(default_factory=list)
    extras: list[Cell] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# -- progress and notes -----------------------------------------------------------------------
class Progress:
    """tqdm bar when tqdm imports, else a ``[i/n] label`` counter on stderr every ~2 s."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.done, self.desc = total, 0, desc
        self._last = 0.0
        try:
            from tqdm import tqdm

            self._bar: Any = tqdm(
                total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True
            )
        except ImportError:
            self._bar = None

    def step(self, label: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
        elif time.monotonic() - self._last > 2.0 or self.done == self.total:
            self._last = time.monotonic()
            print(f"[{self.done}/{self.total}] {self.desc} {label}", file=sys.stderr, flush=True)

    def write(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class Notes:
    """Run notes: printed as they happen (once each) and kept for the report."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._seen: set[str] = set()
        self.sink: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)

    def fork(self) -> Notes:
        """A copy holding the notes so far (run-wide ones), for one op's report."""
        new = Notes()
        new.lines, new._seen, new.sink = list(self.lines), set(self._seen), self.sink
        return new

    def __call__(self, msg: str) -> None:
        if msg not in self._seen:
            self._seen.add(msg)
            self.lines.append(msg)
            self.sink(msg)


# -- the sweep --------------------------------------------------------------------------------
class Runner:
    """Times cunorm and the peers cell by cell with one timer and one copy ceiling."""

    def __init__(self, timer: Timer, peers: list[Peer], notes: Notes) -> None:
        import cupy

        self.timer, self.peers = timer, peers
        self._run_notes = notes  # run-wide notes (timer, peers); each op gets a fork of them
        self.notes = notes
        self._flush_buf = cupy.empty(L2_FLUSH_BYTES, dtype=cupy.int8)
        try:
            import torch

            self._torch = torch if torch.cuda.is_available() else None
        except Exception:
            self._torch = None
        if self._torch is None:
            self._run_notes(
                "torch unavailable: outputs are checked against a float64 reference on "
                "sampled rows instead of torch eager on every row"
            )

    def _flush_and_sync(self) -> None:
        # For wall-clock timing: start each repetition with a cold L2 and an idle GPU.
        self._flush_buf.fill(0)
        synchronize()

    def run_op(
        self,
        op: OpSpec,
        cunorm_fn: Callable[..., Any],
        dtypes: Iterable[str],
        cols_list: Iterable[int],
        rows: int | None = None,
        extras: bool = True,
    ) -> OpRun:
        """Sweep ``op`` over ``dtypes`` x ``cols_list`` (then its extra cases)."""
        dtypes, cols_list = list(dtypes), list(cols_list)
        extra_peers = [p for p in self.peers if p.name in EXTRA_CASE_PEERS]
        extra_cases = list(op.extra_cases) if extras else []
        run = OpRun(op.name, [p.name for p in self.peers])
        self.notes = self._run_notes.fork()
        total = len(dtypes) * len(cols_list) * (1 + len(self.peers)) + len(extra_cases) * (
            1 + len(extra_peers)
        )
        progress = Progress(total, op.name)
        self.notes.sink = progress.write
        try:
            for dtype in dtypes:
                for cols in cols_list:
                    shape = (rows_for(cols, rows), cols)
                    run.cells.append(
                        self._run_cell(op, cunorm_fn, shape, dtype, -1, self.peers, progress)
                    )
            for ex in extra_cases:
                run.extras.append(
                    self._run_cell(
                        op, cunorm_fn, ex.shape, ex.dtype, ex.axis, extra_peers, progress
                    )
                )
        finally:
            progress.close()
            self.notes.sink = lambda m: print(m, file=sys.stderr, flush=True)
        run.notes = list(self.notes.lines)
        return run

    def _run_cell(
        self,
        op: OpSpec,
        cunorm_fn: Callable[..., Any],
        shape: tuple[int, ...],
        dtype: str,
        axis: int,
        peers: list[Peer],
        progress: Progress,
    ) -> Cell:
        label = f"{dtype} {'x'.join(map(str, shape))}" + (f" axis={axis}" if axis != -1 else "")
        cols = shape[axis]
        size = int(np.prod(shape))
        cell = Cell(op.name, dtype, tuple(shape), axis, size // cols, cols, 0)
        case: Case | None = None
        ref = None
        steps = 0  # progress steps taken, so a skipped cell still advances the bar fully
        try:
            case = make_case(op, tuple(shape), dtype, axis)
            cell.nbytes = case.nbytes
            ref = self._reference(case, label)
            cell.cunorm = self._measure(
                case,
                "cunorm",
                lambda: case.cunorm(cunorm_fn),
                ref,
                label,
                wall_clock=False,
                check=True,
            )
            progress.step(f"{label} cunorm")
            steps += 1
            for peer in peers:
                cell.peers[peer.name] = self._run_peer(case, peer, ref, label)
                progress.step(f"{label} {peer.name}")
                steps += 1
        except Exception as exc:  # input creation failed (e.g. out of memory): skip the cell
            self.notes(f"{op.name} {label}: cell skipped ({type(exc).__name__}: {first_line(exc)})")
            if steps == 0:
                cell.cunorm = Result(status="ERROR", note=first_line(exc))
            for _ in range(steps, 1 + len(peers)):
                progress.step(f"{label} skipped")
        finally:
            case = ref = None  # drop the arrays before freeing the pools
            free_memory()
        return cell

    def _reference(self, case: Case, label: str) -> Any:
        """torch eager's output on the case (the guard's reference), or None."""
        if self._torch is None:
            return None
        try:
            out = case.op.torch_fn(self._torch)(*case.torch_args())
            synchronize()
            return out
        except Exception as exc:
            self.notes(
                f"{case.op.name} {label}: torch eager reference failed "
                f"({type(exc).__name__}: {first_line(exc)}); checking against float64"
            )
            return None

    def _run_peer(self, case: Case, peer: Peer, ref: Any, label: str) -> Result:
        try:
            fn = peer.build(case)
        except PeerUnavailable as exc:
            self.notes(f"{peer.name}: {exc}")
            return Result(status="n/a", note=str(exc))
        except Exception as exc:
            self.notes(
                f"{peer.name} {case.op.name} {label}: {type(exc).__name__}: {first_line(exc)}"
            )
            return Result(status="ERROR", note=first_line(exc))
        note = getattr(fn, "note", "")
        if note:  # what the peer runs, where it depends on the installed version
            self.notes(f"{peer.name}: {note}")
        # torch eager *is* the reference: comparing it with itself proves nothing.
        return self._measure(
            case,
            peer.name,
            fn,
            ref,
            label,
            wall_clock=peer.wall_clock,
            check=peer.name != "torch" or ref is None,
        )

    def _measure(
        self,
        case: Case,
        name: str,
        fn: Callable[[], Any],
        ref: Any,
        label: str,
        wall_clock: bool,
        check: bool,
    ) -> Result:
        """First call (compiles, allocates) and guard, then the timing."""
        res = Result()
        try:
            out = fn()
            synchronize()
            if check:
                c = check_output(case, out, ref)
                res.err, res.note = c.err, c.note
                if not c.ok:
                    res.status = "MISMATCH"
                    self.notes(f"MISMATCH {name} {case.op.name} {label}: {c.note}")
            del out
            ms = wall_clock_ms(fn, self._flush_and_sync) if wall_clock else self.timer(fn)
            res.ms, res.gbps = ms, gbps(case.nbytes, ms)
        except Exception as exc:  # an implementation failing must not end the sweep
            res.status = "ERROR"
            res.note = f"{type(exc).__name__}: {first_line(exc)}"
            self.notes(f"{name} {case.op.name} {label}: {res.note}")
        # Hand this implementation's cached output blocks back before the next library
        # allocates its own: at 49152 x 32768 float32 every output is 6.4 GB.
        free_memory()
        return res


# -- per-call host overhead -------------------------------------------------------------------
OVERHEAD_SHAPE = (8, 128)


def per_call_us(
    fn: Callable[[], Any], calls: int, trials: int = 5, sync: Callable[[], None] | None = None
) -> tuple[float, float]:
    """Host time per call in µs: ``calls`` back-to-back calls, one synchronize at the end.

    Returns (median, min) over ``trials``. Nothing synchronizes inside the loop: what is
    measured is how fast the host can issue calls, which is what a tiny op costs in a model.
    """
    for _ in range(min(calls, 1000)):  # warm-up: compilation, plan caches, allocator pools
        fn()
    if sync is not None:
        sync()
    per: list[float] = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync is not None:
            sync()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per), min(per)


def run_overhead(cunorm_fn: Callable[..., Any], calls: int, notes: Notes) -> list[dict[str, Any]]:
    """µs per call of ``cunorm.softmax`` on a small float32 CuPy array, and of the peers that
    are cheap to call the same way (torch eager, cupyx)."""
    import cupy

    x = cupy.random.RandomState(0).standard_normal(OVERHEAD_SHAPE, dtype=cupy.float32)
    synchronize()
    impls: list[tuple[str, Callable[[], Any]]] = [("cunorm.softmax(x)", lambda: cunorm_fn(x))]
    try:
        import torch

        if torch.cuda.is_available():
            t = torch.from_dlpack(x)
            impls.append(("torch.softmax(t, -1)", lambda: torch.softmax(t, -1)))
    except Exception as exc:
        notes(f"overhead: torch unavailable ({type(exc).__name__}: {first_line(exc)})")
    try:
        from cupyx.scipy import special

        impls.append(
            ("cupyx.scipy.special.softmax(x, axis=-1)", lambda: special.softmax(x, axis=-1))
        )
    except Exception as exc:
        notes(f"overhead: cupyx unavailable ({type(exc).__name__}: {first_line(exc)})")
    rows = []
    for name, fn in impls:
        try:
            med, best = per_call_us(fn, calls, sync=synchronize)
            rows.append(
                {
                    "impl": name,
                    "us_per_call": med,
                    "us_per_call_min": best,
                    "calls": calls,
                    "shape": list(OVERHEAD_SHAPE),
                    "dtype": "float32",
                }
            )
        except Exception as exc:
            notes(f"overhead: {name} failed ({type(exc).__name__}: {first_line(exc)})")
            rows.append(
                {
                    "impl": name,
                    "us_per_call": None,
                    "us_per_call_min": None,
                    "calls": calls,
                    "shape": list(OVERHEAD_SHAPE),
                    "dtype": "float32",
                    "error": first_line(exc),
                }
            )
    return rows


# -- no GPU: the NumPy reference path ---------------------------------------------------------
def numpy_rows_for(cols: int) -> int:
    """Rows of the NumPy sweep: at most 4096, and at most 2**24 elements per array."""
    return min(NUMPY_MAX_ROWS, max(1, NUMPY_MAX_ELEMS // cols))


def run_numpy(
    op: OpSpec, fn: Callable[..., Any], cols_list: Iterable[int], notes: Notes
) -> list[dict[str, Any]]:
    """Time ``op``'s NumPy path (float32) and check it against the float64 formula.

    For a residual op the output must be ``(y, h)``: ``h`` equal to ``x + r`` rounded to
    float32 in every element, ``y`` within tolerance of the norm of that ``h``. For a softmax
    gradient the inputs are ``y`` (the float64 forward of random normal data, rounded to
    float32) and a random normal ``dy``, and ``dx`` is checked against the float64 formula on
    those same float32 arrays. For a norm gradient the inputs are ``x``, the weight (and bias),
    a random normal ``dy`` and the statistics of cunorm's forward (NumPy path, computed before
    timing); the output must be ``(dx, dweight[, dbias])`` and ``dx`` is checked against the
    float64 formula (statistics in float64 from ``x``).
    """
    from .ops import TOLERANCE, residual_sum

    rng = np.random.default_rng(0)
    out_rows = []
    for cols in cols_list:
        rows = numpy_rows_for(cols)
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        if op.family == "softmax_grad":  # y: a real forward output, as on the GPU
            x = op.forward_reference(np, x).astype(np.float32)
        w = rng.standard_normal(cols, dtype=np.float32) if "weight" in op.params else None
        b = rng.standard_normal(cols, dtype=np.float32) if "bias" in op.params else None
        r = rng.standard_normal((rows, cols), dtype=np.float32) if op.second_input else None
        row: dict[str, Any] = {
            "op": op.name,
            "dtype": "float32",
            "rows": rows,
            "cols": cols,
            "ms": None,
            "gbps": None,
            "err": None,
            "status": "ok",
            "note": "",
        }
        try:
            stats = op.cunorm_stats(x, w, b, -1) if op.family == "norm_grad" else ()
            out = op.call(fn, x, w, b, -1, r, stats)
            h_bad = 0
            if op.family == "norm_grad":
                names = op.grad_outputs
                if not isinstance(out, tuple) or len(out) != len(names):
                    got = f"a {len(out)}-tuple" if isinstance(out, tuple) else type(out).__name__
                    raise TypeError(f"returned {got}, expected ({', '.join(names)})")
                y = out[0]
            elif not op.residual:
                y = out
            else:
                if not isinstance(out, tuple) or len(out) != 2:
                    raise TypeError(f"residual= returned {type(out).__name__}, expected (y, h)")
                y, h = out
                h_ref = residual_sum(x, r)
                if not isinstance(h, np.ndarray) or h.shape != h_ref.shape:
                    raise TypeError(f"h is {type(h).__name__}, expected a {h_ref.shape} ndarray")
                h_bad = int(np.count_nonzero(h != h_ref))
            if not isinstance(y, np.ndarray):
                raise TypeError(f"NumPy input returned {type(y).__name__}, expected ndarray")
            ref = op.reference(np, residual_sum(x, r) if op.residual else x, w, b, r)
            err = np.abs(y.astype(np.float64) - ref).max(axis=-1)
            err = np.nan_to_num(err / np.maximum(np.abs(ref).max(axis=-1), 1e-300), nan=np.inf)
            row["err"] = float(err.max())
            if row["err"] > TOLERANCE["float32"] or h_bad:
                row["status"] = "MISMATCH"
                h_note = f", h != x + r in {h_bad} elements" if h_bad else ""
                row["note"] = f"error {row['err']:.2e}{h_note}"
                notes(f"MISMATCH numpy {op.name} float32 {rows}x{cols}: {row['note']}")
            row["ms"] = host_ms(lambda x=x, w=w, b=b, r=r, s=stats: op.call(fn, x, w, b, -1, r, s))
            row["gbps"] = gbps(op.moved_bytes(x.size, x.itemsize), row["ms"])
        except Exception as exc:
            row["status"] = "ERROR"
            row["note"] = f"{type(exc).__name__}: {first_line(exc)}"
            notes(f"numpy {op.name} {rows}x{cols}: {row['note']}")
        out_rows.append(row)
    return out_rows
