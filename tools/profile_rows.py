"""Softmax profiles of tools/gpu_profile.py: host overhead, per-kernel launches for ncu, the
strided path, the gaps to Triton, output placement."""

from __future__ import annotations

import functools
import sys
import time

import cupy
import numpy as np
from profile_common import _fresh_plan, _norm_inputs, _triton

import cunorm
from cunorm import _dispatch

CASES = [("float16", 1024, 49152), ("float16", 8192, 24576), ("float32", 4096, 49152),
         ("float32", 32768, 6144), ("float16", 131072, 1536), ("float32", 65536, 3072)]


def overhead(n: int = 10_000) -> None:
    x = cupy.random.standard_normal((8, 128), dtype=np.float32)
    for _ in range(200):
        cunorm.softmax(x)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        cunorm.softmax(x)
    t1 = time.perf_counter()
    cupy.cuda.Device().synchronize()
    print(f"host time per cunorm.softmax((8,128) float32): {(t1 - t0) / n * 1e6:.2f} us")
    try:
        import torch

        t = torch.from_dlpack(x)
        for _ in range(200):
            torch.softmax(t, -1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            torch.softmax(t, -1)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"host time per torch.softmax (same): {(t1 - t0) / n * 1e6:.2f} us")
    except ImportError:
        pass


def kernels() -> None:
    for dt, cols, rows in CASES:
        x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
        y = cupy.empty_like(x)
        cunorm.softmax(x, out=y)
    cupy.cuda.Device().synchronize()


STRIDED_CASES = [("float32", (32, 21, 256, 256)), ("float16", (16, 4096, 1024)),
                 ("bfloat16", (16, 4096, 1024)), ("float16", (32, 4096, 1024)),
                 ("float16", (4, 8192, 512)), ("float32", (8, 4096, 1024))]
# dispatcher constants tried for the strided path: name -> overrides ("before": the rule
# before session 24, whose twice-read plans had no clusters, which no constant restores)
STRIDED_VARIANTS = {
    "default": {},
    "before": {"STRIDED_BLOCK": 256, "STRIDED_MIN_TILE_BYTES": 128,
               "STRIDED_SLICE_PREFERRED_BYTES": 64 * 1024, "STRIDED_NARROW_TILE_BYTES": 128},
    "block256": {"STRIDED_BLOCK": 256},
    "slice64k": {"STRIDED_SLICE_PREFERRED_BYTES": 64 * 1024},
    "tile32": {"STRIDED_MIN_TILE_BYTES": 32},
    "uncached": {"STRIDED_SLICE_PREFERRED_BYTES": 0, "STRIDED_SLICE_MAX_BYTES": 0},
    # rows a thread of a cached cluster kernel holds in registers (the shipped 2 is "default")
    "held0": {"STRIDED_HELD_ROWS": 0},
    "held4": {"STRIDED_HELD_ROWS": 4},
}


def strided(launch_only: bool = False) -> None:
    """GB/s of softmax over axis=1 for each STRIDED_VARIANTS setting (or one launch each)."""
    from triton.testing import do_bench

    plans = sys.modules["cunorm.softmax"]._PLANS
    for dt, shape in STRIDED_CASES:
        x = cupy.random.standard_normal(shape, dtype=np.float32).astype(dt)
        y = cupy.empty_like(x)
        for name, consts in STRIDED_VARIANTS.items():
            with _dispatch.override_constants(consts):
                try:
                    cunorm.softmax(x, axis=1, out=y)
                except ValueError as err:
                    print(f"{dt} {shape} {name}: {err}")
                    continue
                plan = next(iter(plans.values()))[0]
                if launch_only:
                    continue
                ms = do_bench(functools.partial(cunorm.softmax, x, axis=1, out=y), warmup=10,
                              rep=50, return_mode="median")
                print(f"{dt} {shape} {name:14s} {2 * x.nbytes / ms / 1e6:7.0f} GB/s  "
                      f"{plan.kernel[16:]} grid={plan.grid} tx={plan.tx_count} smem={plan.smem}")
    cupy.cuda.Device().synchronize()


# Cells where the row paths trail a peer or the copy bandwidth (bench summary): each shape on
# the default path and on every other path that can take it, next to the Triton peer. The
# block path is also tried past its dispatcher limits (values per thread up to 32).
GAP_CASES = [("softmax", "float16", 8192, 49152), ("softmax", "bfloat16", 8192, 49152),
             ("softmax", "float16", 1024, 49152), ("softmax", "float16", 4096, 49152),
             ("softmax", "float32", 4096, 49152), ("softmax", "float32", 8192, 49152),
             ("softmax", "float16", 5120, 49152), ("softmax", "float16", 16384, 24576),
             ("softmax", "float32", 16384, 24576), ("layer_norm", "float16", 2048, 49152),
             ("layer_norm", "float16", 4096, 49152), ("layer_norm", "float16", 8192, 49152),
             ("layer_norm", "bfloat16", 8192, 49152), ("layer_norm", "float32", 8192, 49152),
             ("layer_norm", "float32", 16384, 24576), ("layer_norm", "float16", 16384, 24576)]
GAP_PATHS = (None, "warp", "block", "smem", "cluster")
# the block path's value caps raised while the gap tools run
_GAP_LIMITS = {"BLOCK_MAX_VALUES": {4: 32, 8: 16}, "NORM_BLOCK_MAX_VALUES_SCALAR": {4: 32, 8: 16}}


def _gap_calls():
    """(label, thunk) for every GAP_CASES shape and path, the block limits raised."""
    import torch

    from cunorm.bench import triton_kernels

    calls = []
    for op, dt, cols, rows in GAP_CASES:
        x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
        y = cupy.empty_like(x)
        if op == "softmax":
            def run(x=x, y=y):
                return cunorm.softmax(x, out=y)
            tx = torch.from_dlpack(x)
            peer = functools.partial(triton_kernels.softmax, tx) if cols <= 16384 else None
        else:
            w = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
            b = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)

            def run(x=x, y=y, w=w, b=b):
                return cunorm.layer_norm(x, w, b, out=y)
            tx, tw, tb = (torch.from_dlpack(a) for a in (x, w, b))
            peer = functools.partial(triton_kernels.norm, tx, tw, tb, 1e-5)
        for path in GAP_PATHS:
            def forced(run=run, path=path):
                with _dispatch.force_path(path):
                    return run()
            try:
                forced()
            except ValueError:
                continue
            calls.append((f"{op} {dt} ({rows}, {cols}) {path or 'default'}", forced, x.nbytes))
        if peer is not None:
            peer()
            calls.append((f"{op} {dt} ({rows}, {cols}) triton", peer, x.nbytes))
    cupy.cuda.Device().synchronize()
    torch.cuda.synchronize()
    return calls


def gaps() -> None:
    """GB/s (L2 flushed, median) of each GAP_CASES shape on each path and of its Triton peer,
    with the registers and local memory of the kernel each cunorm call launched (NVRTC's
    build, which can differ from nvcc's)."""
    from triton.testing import do_bench

    with _dispatch.override_constants(_GAP_LIMITS):
        for label, fn, nbytes in _gap_calls():
            ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
            line = f"{label:48s} {2 * nbytes / ms / 1e6:6.0f} GB/s"
            if not label.endswith("triton"):
                kern, _, _ = _fresh_plan(label.split()[0], fn)
                line += (f"  {kern.name.split('<')[0][8:]} regs={kern.num_regs} "
                         f"local={kern.local_size_bytes}")
            print(line, flush=True)


def gap_kernels() -> None:
    """One launch of each GAP_CASES call (after a warm-up), for ncu."""
    import torch

    with _dispatch.override_constants(_GAP_LIMITS):
        calls = _gap_calls()
        cupy.cuda.Device().synchronize()
        for label, fn, _ in calls:
            print("launch:", label, flush=True)
            fn()
            cupy.cuda.Device().synchronize()
            torch.cuda.synchronize()


PLACEMENT_CASES = [("float16", 8192, 49152), ("bfloat16", 8192, 49152),
                   ("float32", 16384, 24576), ("float16", 1024, 49152)]


def placement() -> None:
    """GB/s of softmax by where the output lies: cunorm and the Triton peer, each writing into
    a CuPy-pool buffer, a torch-allocated one and CuPy buffers at a few offsets; and a plain
    device-to-device copy of x into each. Tells a kernel gap from an address-mapping one."""
    import torch
    from triton.testing import do_bench

    from cunorm.bench import triton_kernels

    def gbps(fn, nbytes):
        fn()
        ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
        return f"{2 * nbytes / ms / 1e6:5.0f}"

    warm = cupy.ones((4096, 4096), dtype=np.float32)
    do_bench(functools.partial(cunorm.softmax, warm), warmup=100, rep=200)
    for dt, cols, rows in PLACEMENT_CASES:
        x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
        tx = torch.from_dlpack(x)
        n = x.nbytes
        outs = {"cupy": cupy.empty_like(x), "torch": cupy.from_dlpack(torch.empty_like(tx))}
        big = cupy.empty(n + (4 << 20), dtype=np.uint8)
        for off in (4096, 65536, 1 << 20, 3 << 20):
            outs[f"cupy+{off >> 10}K"] = big[off:off + n].view(x.dtype).reshape(x.shape)
        block = triton.next_power_of_2(cols) if (triton := _triton()) else 0
        print(f"{dt} ({rows}, {cols}): x at {x.data.ptr:#x}", flush=True)
        for name, y in outs.items():
            ty = torch.from_dlpack(y)
            line = f"  out={name:10s} y-x={(y.data.ptr - x.data.ptr) / 2**20:+10.2f} MiB"
            line += f"  cunorm {gbps(functools.partial(cunorm.softmax, x, out=y), n)}"
            if block:
                def peer(ty=ty, tx=tx, rows=rows, cols=cols, block=block):
                    triton_kernels._softmax_kernel[(rows,)](
                        ty, tx, tx.stride(0), ty.stride(0), cols, BLOCK=block, LOG=False,
                        num_warps=triton_kernels.num_warps(block))
                line += f"  triton {gbps(peer, n)}"
            line += f"  copy {gbps(functools.partial(ty.copy_, tx), n)}"
            print(line + " GB/s", flush=True)
        del outs, big


def peer_kernels() -> None:
    """One launch each (for ncu) of softmax float16 (49152, 8192) on the smem and block paths
    and its Triton peer, then layer_norm float16 (49152, 8192) and its Triton peer."""
    import torch

    from cunorm.bench import triton_kernels

    x, w, b = _norm_inputs("float16", 8192)
    tx, tw, tb = (torch.from_dlpack(a) for a in (x, w, b))
    calls = []
    for path in ("smem", "block"):
        def forced(path=path):
            with _dispatch.force_path(path):
                cunorm.softmax(x)
        calls.append(forced)
    calls += [functools.partial(triton_kernels.softmax, tx),
              functools.partial(cunorm.layer_norm, x, w, b),
              functools.partial(triton_kernels.norm, tx, tw, tb, 1e-5)]
    for fn in calls:  # compile outside the profiled launches
        fn()
    torch.cuda.synchronize()
    for fn in calls:
        fn()
        torch.cuda.synchronize()


def compare_builds(builds: list[tuple[str, tuple[str, ...]]], ops: tuple[str, ...],
                   dtypes: tuple[str, ...] | None = None, cols_list: tuple[int, ...] | None = None,
                   rounds: int = 2) -> None:
    """Cells of the benchmark sweep (cunorm.bench: its rows and timer; every dtype and
    STANDARD_COLS unless given) on each (name, extra NVRTC options) build, ``rounds``
    interleaved rounds in one process, the last build's GB/s over the first's (last round),
    and whether their outputs match bit for bit. Only the first round of a cell pays its first
    timing."""
    from profile_common import _build_with

    from cunorm.bench.cases import make_case
    from cunorm.bench.ops import OPS
    from cunorm.bench.sweep import DEFAULT_DTYPES, STANDARD_COLS, rows_for
    from cunorm.bench.timing import CupyEventTimer, gbps

    first, last = builds[0][0], builds[-1][0]
    timer = CupyEventTimer(pad_us=100)
    print(f"{'op':20s} {'dtype':8s} {'cols':>7s} {'rows':>6s}  "
          + "  ".join(f"{name + ' GB/s':>11s}" for name, _ in builds)
          + f"  {last}/{first} (last round)  same output", flush=True)
    for op in ops:
        fn = OPS[op].resolve()[0]
        for dt in dtypes or DEFAULT_DTYPES:
            for cols in cols_list or STANDARD_COLS:
                rows = rows_for(cols)
                case = make_case(OPS[op], (rows, cols), dt)
                rates: dict[str, list[float]] = {name: [] for name, _ in builds}
                outs = {}
                for rnd in range(rounds):
                    for name, options in builds:
                        _build_with(options)
                        if rnd == 0:
                            out = case.cunorm(fn)
                            outs[name] = [o.copy() for o in (out if isinstance(out, tuple)
                                                             else (out,))]
                        rates[name].append(gbps(case.nbytes, timer(
                            functools.partial(case.cunorm, fn))))
                same = all(bool(cupy.array_equal(a, b, equal_nan=True))
                           for a, b in zip(outs[first], outs[last], strict=True))
                line = "  ".join(f"{'/'.join(f'{r:.0f}' for r in rates[n]):>11s}"
                                 for n, _ in builds)
                print(f"{op:20s} {dt:8s} {cols:7d} {rows:6d}  {line}  "
                      f"{rates[last][-1] / rates[first][-1]:.3f}  {same}", flush=True)
                del case, outs
                cupy.get_default_memory_pool().free_all_blocks()
    _build_with(())


def l2_keep(ops: tuple[str, ...] = ("softmax", "log_softmax", "layer_norm", "rms_norm",
                                    "layer_norm_residual", "rms_norm_residual"),
            rounds: int = 2) -> None:
    """Every cell of the benchmark sweep built with the row paths' x loads plain
    (CUNORM_X_L2_KEEP=0) and as shipped (common.cuh load_pack_l2): :func:`compare_builds`."""
    compare_builds([("plain", ("-DCUNORM_X_L2_KEEP=0",)), ("kept", ())], ops, rounds=rounds)


def ln32_cluster(rounds: int = 2) -> None:
    """float32 layer_norm rows of 32768+ columns (cluster kernels) built as before session 45
    (78 registers, one resident 512-thread block, stores batched, parameters prefetched one
    batch ahead on clusters of 16) and as shipped (3 blocks, stores pack by pack, six packs
    ahead: cuda_src/norm.cu norm_cluster_blocks, rows.cuh kPrefetchBatches). The 'before'
    build gives every other cluster kernel one block too, so only these cells compare."""
    before = ("-DCUNORM_NORM_CLUSTER_BLOCKS=1", "-DCUNORM_NORM_CLUSTER_BATCH_BYTES=64",
              "-DCUNORM_PREFETCH_BATCHES=1")
    compare_builds([("before", before), ("shipped", ())], ("layer_norm",), ("float32",),
                   (32768, 65536, 131072, 262144), rounds)


def prefetch_distance() -> None:
    """The cells whose stores prefetch their parameters batches ahead (rows.cuh kAhead: float32
    layer_norm on clusters of 16, float64 layer_norm) built 1, 2, 4 and 6 (shipped) batches
    ahead (CUNORM_PREFETCH_BATCHES); float32 131072 columns (kSlice) as a control."""
    builds = [(f"D{d}", (f"-DCUNORM_PREFETCH_BATCHES={d}",)) for d in (1, 2, 4, 6)]
    compare_builds(builds, ("layer_norm",), ("float32",), (131072, 262144), rounds=3)
    compare_builds(builds, ("layer_norm",), ("float64",), (16384, 32768, 65536, 131072, 262144))


# Rows whose tables sit just under 90% of copy (16-bit 1024 columns) and short rows, next to
# cells that reach it (float32 1024 columns moves twice the bytes).
FIXED_COST_CASES = [("layer_norm", "float16", 1024), ("rms_norm", "float16", 1024),
                    ("softmax", "float16", 1024), ("layer_norm", "float32", 1024),
                    ("layer_norm", "float16", 256), ("rms_norm", "float32", 32),
                    ("rms_norm", "float16", 64)]


def fixed_cost(rows: int = 49152) -> None:
    """Where a call's time goes beyond its bytes, under the benchmark's timer: each case at
    ``rows`` and 4 x ``rows`` rows (steady rate = the extra bytes over the extra time; fixed
    cost = what the smaller call takes beyond its bytes at that rate), a device-to-device copy
    of the same bytes beside each (timing.copy_bandwidth), and the smaller call again with a
    one-row call of the same op between the flush and the start event (which brings its code
    and parameters back into L2: the part of the fixed cost that a cold L2 adds)."""
    from profile_common import _call_case

    from cunorm.bench.timing import CupyEventTimer, copy_bandwidth

    class TouchedTimer(CupyEventTimer):
        touch = staticmethod(lambda: None)

        def _flush(self) -> None:
            super()._flush()
            self.touch()

    def split(nbytes: int, small_us: float, large_us: float) -> tuple[float, float]:
        """(steady GB/s, fixed us) of calls moving nbytes in small_us and 4 x in large_us."""
        steady = 3 * nbytes / ((large_us - small_us) * 1e-6) / 1e9
        return steady, small_us - nbytes / steady * 1e-3

    timer, touched = CupyEventTimer(pad_us=100), TouchedTimer(pad_us=100)
    for op, dt, cols in FIXED_COST_CASES:
        us, copy_us, small = [], [], 0
        for n in (rows, 4 * rows):
            y, call, nbytes = _call_case(op, dt, n, cols)  # (plain ops: x read, y written)
            small = small or nbytes
            x = call.args[0]
            us.append(timer(call) * 1e3)
            copy_us.append(nbytes / copy_bandwidth(timer, x.nbytes) * 1e-3)
            if n == rows:
                touched.touch = functools.partial(call.func, x[:1], *call.args[1:],
                                                  out=y[:1])
                touched_us = touched(call) * 1e3
            del y, call, x
            cupy.get_default_memory_pool().free_all_blocks()
        steady, fixed = split(small, *us)
        copy_steady, copy_fixed = split(small, *copy_us)
        print(f"{op:10s} {dt:8s} {cols:5d}  {small / us[0] * 1e-3:5.0f} GB/s ({us[0]:6.2f} us; "
              f"copy {small / copy_us[0] * 1e-3:5.0f})  steady {steady:5.0f} (copy "
              f"{copy_steady:5.0f})  fixed {fixed:5.2f} us (copy {copy_fixed:5.2f})  touched "
              f"{small / touched_us * 1e-3:5.0f} ({us[0] - touched_us:+.2f} us)", flush=True)
