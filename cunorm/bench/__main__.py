"""Command line: ``python -m cunorm.bench OP [options]`` (also installed as ``cunorm-bench``).

Nothing heavy is imported before the arguments are parsed, so ``--help`` and argument errors
work on any machine.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from .env import NO_GPU_MESSAGE
from .ops import OPS, canonical_dtype, rowwise_ops

__all__ = ["NO_GPU_MESSAGE", "build_parser", "main"]

_EPILOG = """\
examples:
  python -m cunorm.bench softmax                 full sweep, all peers, files under --out
  python -m cunorm.bench all --quick             every row-wise op on ~5 cols
  python -m cunorm.bench layer_norm --dtypes bf16 --cols 1024,4096 --peers torch,compile
  python -m cunorm.bench rms_norm_residual --quick  y, h = rms_norm(x + r), x + r in one pass
  python -m cunorm.bench softmax_backward --quick   dx from y = softmax(x) and dy (3 arrays move)
  python -m cunorm.bench layer_norm_backward --quick  dx, dw, db from x, w, dy and the stats
  python -m cunorm.bench overhead                host µs per call on a (8, 128) float32 array
  python -m cunorm.bench attention               forward (TFLOP/s), decoding (GB/s), peak memory
  python -m cunorm.bench attention --quick       bf16, L 1024/4096/16384, 3 decoding lengths
  python -m cunorm.bench attention --seqlens 4096 --head-dims 128 --peers flash,cudnn --no-decode
"""


def _csv(items: list[str] | None) -> list[str]:
    """Flatten ``["a,b", "c"]`` -> ``["a", "b", "c"]`` (both spellings are accepted)."""
    return [part for item in items or [] for part in item.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    from .attention import add_arguments as add_attention_arguments
    from .peers import PEER_NAMES

    p = argparse.ArgumentParser(
        prog="python -m cunorm.bench",
        description="Benchmark cunorm's row-wise ops against PyTorch, torch.compile, cupyx, JAX "
        "and Triton on the standard (49152, cols) sweep; report GB/s, ratio to the "
        "best peer and to copy bandwidth, and write markdown, JSON and a plot. 'attention' "
        "has its own sweeps and peers (torch SDPA backends, JAX): see its options below.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "op",
        choices=[*OPS, "overhead", "all"],
        help="op to benchmark; *_residual: the norm fused with a residual add (cunorm's "
        "residual=r, returning y and h = x + r); softmax_backward, log_softmax_backward: the "
        "gradient from the forward's output y and dy; layer_norm_backward, rms_norm_backward: "
        "dx and the weight's (and bias's) gradients from x, the weight, dy and the forward's "
        "statistics; 'all' runs every available row-wise op, "
        "'overhead' measures host time per call, 'attention' the attention forward "
        "(FlashAttention convention), decoding and peak-memory benchmark",
    )
    p.add_argument(
        "--dtypes",
        nargs="+",
        metavar="DTYPE",
        help="dtypes, space- or comma-separated (default: float16 bfloat16 float32; "
        "aliases fp16, bf16, fp32, float64 also accepted)",
    )
    p.add_argument(
        "--cols",
        nargs="+",
        metavar="N",
        help="cols to sweep, space- or comma-separated (default: the standard sweep, "
        "32 ... 262144)",
    )
    p.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows for every cols (default: 49152, fewer above 32768 cols so the "
        "tensor stays near 49152*4096 elements)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="reduced sweep: cols 128, 1024, 4096, 16384, 65536 (attention: bfloat16, "
        "L 1024, 4096, 16384, decoding Lk 8192, 32768, 131072)",
    )
    p.add_argument(
        "--peers",
        nargs="+",
        metavar="PEER",
        help=f"peers to run (default: all of {', '.join(PEER_NAMES)}; 'compile' "
        "is accepted for torch.compile)",
    )
    p.add_argument("--no-peers", action="store_true", help="time cunorm only")
    p.add_argument(
        "--no-extras",
        action="store_true",
        help="skip the non-last-axis cases of softmax/log_softmax",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results"),
        help="directory for the .md/.json/.png files (default: benchmarks/results)",
    )
    p.add_argument("--no-save", action="store_true", help="print only, write no files")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument(
        "--timer",
        choices=["auto", "padded", "triton", "cupy"],
        default="auto",
        help="GPU timer: CuPy events with a GPU spin before each start event (auto, padded), "
        "triton.testing.do_bench (triton) or CuPy events without the spin (cupy)",
    )
    p.add_argument(
        "--calls", type=int, default=10_000, help="calls per trial for 'overhead' (default: 10000)"
    )
    add_attention_arguments(p)
    return p


def _parse_lists(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Normalize --dtypes/--cols/--peers in place; argument errors exit with status 2."""
    from .peers import PEER_NAMES, canonical_peer
    from .sweep import DEFAULT_DTYPES, QUICK_COLS, STANDARD_COLS

    if args.op == "attention":  # its own dtypes, shapes and peers
        from .attention import normalize_args

        normalize_args(p, args)
        return

    try:
        args.dtypes = [canonical_dtype(d) for d in _csv(args.dtypes)] or list(DEFAULT_DTYPES)
        cols = [int(c) for c in _csv(args.cols)]
        args.peers = (
            []
            if args.no_peers
            else ([canonical_peer(n) for n in _csv(args.peers)] or list(PEER_NAMES))
        )
    except ValueError as exc:
        p.error(str(exc))
    if any(c < 1 for c in cols) or (args.rows is not None and args.rows < 1):
        p.error("--cols and --rows must be positive integers")
    if args.calls < 1:
        p.error("--calls must be positive")
    args.user_cols = bool(cols)
    args.cols = cols or list(QUICK_COLS if args.quick else STANDARD_COLS)
    args.dtypes = list(dict.fromkeys(args.dtypes))
    args.peers = list(dict.fromkeys(args.peers))


def _selected_ops(op: str) -> list[Any]:
    return rowwise_ops() if op == "all" else [OPS[op]]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status (0 on success, 2 if nothing could run)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _parse_lists(parser, args)
    raw = sys.argv[1:] if argv is None else argv
    args.command = "python -m cunorm.bench " + " ".join(shlex.quote(a) for a in raw)

    if args.op in OPS and OPS[args.op].runner is not None:  # ops outside the row-wise sweep
        return int(OPS[args.op].runner(args))

    from .env import probe_gpu

    ok, why = probe_gpu()
    if not ok:
        print(NO_GPU_MESSAGE, flush=True)
        print(f"(reason: {why})", file=sys.stderr, flush=True)
        return _run_numpy(args)
    return _run_gpu(args)


# -- no GPU -----------------------------------------------------------------------------------
def _run_numpy(args: argparse.Namespace) -> int:
    from .report import numpy_table, overhead_table, text_table
    from .sweep import NUMPY_COLS, Notes, per_call_us, run_numpy

    notes = Notes()
    if args.op == "overhead":
        import numpy as np

        fn, why = OPS["softmax"].resolve()
        if fn is None:
            print(why)
            return 2
        x = np.random.default_rng(0).standard_normal((8, 128), dtype=np.float32)
        med, best = per_call_us(lambda: fn(x), args.calls)
        rows = [
            {
                "impl": "cunorm.softmax(x) [NumPy path]",
                "shape": [8, 128],
                "dtype": "float32",
                "calls": args.calls,
                "us_per_call": med,
                "us_per_call_min": best,
            }
        ]
        print(text_table(*overhead_table(rows), right={3, 4, 5}))
        return 0
    cols = args.cols if args.user_cols else list(NUMPY_COLS)
    results, ran = [], 0
    for op in _selected_ops(args.op):
        fn, why = op.resolve()
        if fn is None:
            print(why)
            continue
        results += run_numpy(op, fn, cols, notes)
        ran += 1
    if results:
        print(text_table(*numpy_table(results), right={2, 3, 4, 5, 6}))
    return 0 if ran else 2


# -- GPU --------------------------------------------------------------------------------------
def _run_gpu(args: argparse.Namespace) -> int:
    from .cases import free_memory
    from .env import run_meta
    from .peers import make_peers
    from .report import (
        extras_table,
        overhead_table,
        summarize,
        summary_lines,
        sweep_right,
        sweep_table,
        text_table,
        write_op_files,
        write_overhead_files,
    )
    from .sweep import Notes, Runner, run_overhead
    from .timing import copy_bandwidth, make_timer

    notes = Notes()
    meta: dict[str, Any] = run_meta(args.command)
    device = meta["device"]

    if args.op == "overhead":
        fn, why = OPS["softmax"].resolve()
        if fn is None:
            print(why)
            return 2
        rows = run_overhead(fn, args.calls, notes)
        print(f"\n== per-call overhead, {device} ==")
        print(text_table(*overhead_table(rows), right={3, 4, 5}))
        if not args.no_save:
            for path in write_overhead_files(args.out, meta, rows, notes.lines):
                print(f"wrote {path}")
        return 0

    ops = []
    for op in _selected_ops(args.op):
        fn, why = op.resolve()
        if fn is None:
            print(why)
        else:
            ops.append((op, fn))
    if not ops:
        return 2

    timer = make_timer(args.timer)
    copy = copy_bandwidth(timer)
    meta.update(copy_gbps=copy, timer=timer.method)
    print(
        f"{device}: device-to-device copy {copy:.0f} GB/s (read + write); timer: {timer.method}",
        flush=True,
    )
    peers = make_peers(args.peers, log=notes)
    runner = Runner(timer, peers, notes)

    for op, fn in ops:
        run = runner.run_op(op, fn, args.dtypes, args.cols, args.rows, extras=not args.no_extras)
        summary = summarize(run, copy)
        print(f"\n== {op.name} (GB/s), {device}, copy {copy:.0f} GB/s ==")
        print(text_table(*sweep_table(run, copy), right=sweep_right(run)))
        if run.extras:
            h, r = extras_table(run, copy)
            print(f"\n-- {op.name} over a non-last axis (GB/s) --")
            print(text_table(h, r, right=set(range(3, len(h)))))
        print()
        for line in summary_lines(summary):
            print(f"  {line}")
        if not args.no_save:
            paths = write_op_files(args.out, meta, run, summary, plot=not args.no_plot)
            for path in paths:
                print(f"wrote {path}")
            if not args.no_plot and not any(p.suffix == ".png" for p in paths):
                print("no plot written: matplotlib is not installed (pip install matplotlib)")
        sys.stdout.flush()
        free_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
