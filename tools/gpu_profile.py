"""Host overhead and per-kernel profiles for the row paths (run on the GPU machine).

``python tools/gpu_profile.py overhead`` prints the host time per call of a small softmax;
``ncu ... python tools/gpu_profile.py kernels`` runs one launch of each representative shape;
``python tools/gpu_profile.py norms`` times layer_norm / rms_norm on every path that can take a
shape (GB/s, L2 flushed) and ``ncu ... python tools/gpu_profile.py norm-kernels`` runs one launch
of the short-row norm and softmax kernels for comparison; ``python tools/gpu_profile.py attention``
compares attention with torch's FlashAttention-2 backend and ``ncu ... python tools/gpu_profile.py
attention-kernels`` runs one bf16 forward per head dim; ``decode-kernels`` one decoding call
per KV length (for ncu); ``attention-overhead`` gives the host and GPU time of a decoding call
with a cProfile of it, ``launch-cost`` the host time of a CuPy launch by argument list;
``norm-variants`` times the norms' block kernels built with other resident-block counts;
``wide-blocks`` the 12288- and 16384-column rows on 768- and 1024-thread blocks,
``block-sizes`` rows on blocks of any whole number of warps against power-of-two blocks,
``smem-blocks`` the smem path at fixed block sizes;
``carveout`` the smem path under other L1 / shared-memory carveouts, ``affine-cost`` the norms
there with and without weight and bias (``affine-kernels``: one launch each, for ncu).
"""

from __future__ import annotations

import functools
import sys
import time

import cupy
import numpy as np

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


STRIDED_CASES = [("float32", (32, 21, 256, 256)), ("float16", (16, 4096, 1024))]
# dispatcher constants tried for the strided path: name -> overrides
STRIDED_VARIANTS = {
    "default": {},
    "rows8": {"STRIDED_ROWS_PER_THREAD": 8},
    "slice32k": {"STRIDED_SLICE_MAX_BYTES": 32 * 1024},
    "uncached": {"STRIDED_SLICE_MAX_BYTES": 0},
    "cached-slice96k": {"STRIDED_SLICE_MAX_BYTES": 96 * 1024},
    "slice128k": {"STRIDED_SLICE_MAX_BYTES": 128 * 1024},
    "tile64": {"STRIDED_MIN_TILE_BYTES": 64},
    "tile256": {"STRIDED_MIN_TILE_BYTES": 256},
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


NORM_CASES = [("float16", 32), ("float16", 2048), ("float16", 4096), ("float16", 8192),
              ("float16", 16384), ("float32", 32), ("float32", 4096), ("float32", 8192),
              ("float32", 16384)]


def _norm_inputs(dt: str, cols: int, rows: int = 49152):
    x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    w = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
    b = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
    return x, w, b


def norms() -> None:
    """GB/s of layer_norm (with weight and bias) on each path that can take each NORM_CASES
    shape, and host time per call at the shortest rows."""
    from triton.testing import do_bench


    for dt, cols in NORM_CASES:
        x, w, b = _norm_inputs(dt, cols, 49152 if cols <= 8192 else 24576)
        y = cupy.empty_like(x)
        for path in (None, "warp", "block", "smem", "cluster"):
            try:
                with _dispatch.force_path(path):
                    cunorm.layer_norm(x, w, b, out=y)
                    ms = do_bench(functools.partial(cunorm.layer_norm, x, w, b, out=y),
                                  warmup=10, rep=50, return_mode="median")
            except ValueError as err:
                if path is None or f"path '{path}'" not in str(err):
                    raise
                continue
            gbps = 2 * x.nbytes / ms / 1e6
            print(f"layer_norm {dt} {x.shape} {path or 'default':8s} {gbps:6.0f} GB/s")
    x, w, b = _norm_inputs("float16", 32)
    for name, fn in (("layer_norm", lambda: cunorm.layer_norm(x, w, b)),
                     ("rms_norm", lambda: cunorm.rms_norm(x, w)),
                     ("softmax", lambda: cunorm.softmax(x))):
        for _ in range(100):
            fn()
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        t1 = time.perf_counter()
        cupy.cuda.Device().synchronize()
        ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
        print(f"{name} float16 (49152, 32): host {(t1 - t0) / 2000 * 1e6:.1f} us/call, "
              f"do_bench {ms * 1e3:.1f} us")


def norm_kernels() -> None:
    x, w, b = _norm_inputs("float16", 32)
    for _ in range(2):  # the first call compiles
        cunorm.layer_norm(x, w, b)
        cunorm.rms_norm(x, w)
        cunorm.layer_norm(x)
        cunorm.softmax(x)
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


STORE_BATCH_CASES = [
    ("layer_norm", "float16", 1024, 49152), ("layer_norm", "float16", 2048, 49152),
    ("layer_norm", "float16", 8192, 49152), ("layer_norm", "bfloat16", 16384, 24576),
    ("layer_norm", "float16", 32768, 12288), ("layer_norm", "float16", 65536, 3072),
    ("layer_norm", "float32", 4096, 49152), ("layer_norm", "float32", 16384, 24576),
    ("layer_norm", "float32", 65536, 3072), ("rms_norm", "bfloat16", 16384, 24576),
    ("rms_norm", "float32", 512, 49152)]


def _affine_case(op: str, dt: str, rows: int, cols: int):
    """Random (rows, cols) input of ``dt`` with a weight (and a bias for layer_norm), an output
    buffer, and the cunorm function with its positional arguments."""
    x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    w = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
    if op == "layer_norm":
        b = cupy.random.standard_normal(cols, dtype=np.float32).astype(dt)
        return cupy.empty_like(x), cunorm.layer_norm, (x, w, b)
    return cupy.empty_like(x), cunorm.rms_norm, (x, w)


def _row_case(op: str, dt: str, rows: int, cols: int):
    """:func:`_affine_case`, softmax included (no parameters)."""
    if op != "softmax":
        return _affine_case(op, dt, rows, cols)
    x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
    return cupy.empty_like(x), cunorm.softmax, (x,)


def _planned(op: str):
    """(kernel, block threads, dynamic smem) of the only plan in ``op``'s plan cache."""
    entry = next(iter(sys.modules["cunorm.softmax" if op == "softmax" else "cunorm.norm"]
                      ._PLANS.values()))
    kern = next(e for e in entry if isinstance(e, cupy.RawKernel))
    if op == "softmax":  # (plan, kernel, grid, block)
        return kern, entry[3][0], entry[0].smem
    return kern, entry[2][0], entry[3]  # (kernel, grid, block, smem)


def _fresh_plan(op: str, run):
    """:func:`_planned` of the plan ``run()`` makes with every cached plan dropped first."""
    _dispatch._drop_cached_plans()
    run()
    return _planned(op)


def _triton_norm_gbps(op: str, args: tuple) -> float | None:
    """GB/s of the Triton norm peer on cunorm's arguments, None past its longest row."""
    import torch
    from triton.testing import do_bench

    from cunorm.bench import triton_kernels

    x = args[0]
    if x.shape[-1] > triton_kernels.MAX_COLS:
        return None
    tx, tw = torch.from_dlpack(x), torch.from_dlpack(args[1])
    tb = torch.from_dlpack(args[2]) if len(args) > 2 else None
    peer = functools.partial(triton_kernels.norm, tx, tw, tb, 1e-5, op == "rms_norm")
    return 2 * x.nbytes / do_bench(peer, warmup=10, rep=50, return_mode="median") / 1e6


def _build_with(options: tuple[str, ...]) -> None:
    """Compile kernels from now on with these NVRTC options added (empty: as shipped), the
    kernel and plan caches emptied."""
    from cunorm import _kernels

    base = getattr(_kernels, "_shipped_options", _kernels.compile_options)
    _kernels._shipped_options = base
    _kernels.compile_options = (lambda arch, op_file="": (*base(arch, op_file), *options))
    _kernels._KERNELS.clear()
    _dispatch._drop_cached_plans()


def _warm_up() -> None:
    """The first timing of a process runs slow: time something first."""
    from triton.testing import do_bench

    warm = cupy.ones((4096, 4096), dtype=np.float32)
    do_bench(functools.partial(cunorm.softmax, warm), warmup=100, rep=200)


def store_batch() -> None:
    """GB/s of the norms with the affine parameter loads batched by 0 (one pack at a time), 64
    and 128 bytes (rows.cuh CUNORM_STORE_BATCH_BYTES), next to the Triton peer."""
    from triton.testing import do_bench

    _warm_up()
    for op, dt, cols, rows in STORE_BATCH_CASES:
        y, fn, args = _affine_case(op, dt, rows, cols)
        line = f"{op} {dt} ({rows}, {cols})"
        for batch in (0, 64, 128):
            _build_with((f"-DCUNORM_STORE_BATCH_BYTES={batch}",))
            fn(*args, out=y)
            ms = do_bench(functools.partial(fn, *args, out=y), warmup=10, rep=50,
                          return_mode="median")
            line += f"  batch{batch} {2 * y.nbytes / ms / 1e6:5.0f}"
        peer = _triton_norm_gbps(op, args)
        if peer is not None:
            line += f"  triton {peer:5.0f}"
        print(line + " GB/s", flush=True)
        del y, args
    _build_with(())


# Norm rows around the block-register path's limits, and the compile-time variants of the
# block kernels compared on them by norm_variants (name, NVRTC options).
NORM_VARIANT_CASES = [("layer_norm", "float16", 2048), ("layer_norm", "float16", 4096),
                      ("layer_norm", "float16", 8192), ("layer_norm", "bfloat16", 4096),
                      ("layer_norm", "bfloat16", 8192), ("layer_norm", "float32", 2048),
                      ("layer_norm", "float32", 4096), ("layer_norm", "float32", 8192),
                      ("rms_norm", "float16", 8192), ("rms_norm", "bfloat16", 4096),
                      ("layer_norm", "float16", 5120), ("layer_norm", "float16", 3072)]
NORM_VARIANTS = [("as-is", ()), ("16bit-3blk", ("-DCUNORM_NORM_BLOCKS16=3",)),
                 ("16bit-4blk", ("-DCUNORM_NORM_BLOCKS16=4",)),
                 ("32bit-3blk", ("-DCUNORM_NORM_BLOCKS32=3",))]


def norm_variants(rows: int = 49152) -> None:
    """GB/s of the norms (weight and bias) on NORM_VARIANT_CASES: the block-register path
    built as each of NORM_VARIANTS, next to the default plan, the smem path and Triton, with
    each build's registers and local memory (NVRTC)."""
    from triton.testing import do_bench

    _warm_up()
    for op, dt, cols in NORM_VARIANT_CASES:
        y, fn, args = _affine_case(op, dt, rows, cols)
        print(f"{op} {dt} ({rows}, {cols})", flush=True)
        runs = [(name, opts, "block") for name, opts in NORM_VARIANTS]
        runs += [("as-is", (), None), ("as-is", (), "smem")]
        for name, opts, path in runs:
            _build_with(opts)
            with _dispatch.force_path(path):
                kern, _, _ = _fresh_plan(op, functools.partial(fn, *args, out=y))
                ms = do_bench(functools.partial(fn, *args, out=y), warmup=10, rep=50,
                              return_mode="median")
            print(f"  {name:14s} {path or 'default':8s} {2 * y.nbytes / ms / 1e6:5.0f} GB/s  "
                  f"{kern.name.split('<')[0][8:]} regs={kern.num_regs} "
                  f"local={kern.local_size_bytes}", flush=True)
        peer = _triton_norm_gbps(op, args)
        if peer is not None:
            print(f"  triton                  {peer:5.0f} GB/s", flush=True)
        del y, args
    _build_with(())


# Rows of 12288 and 16384 cols on the block-register path in blocks of more than 512 threads
# (dispatcher BLOCK_WIDE_THREADS; 768 x 16 values for 12288 cols), against the same path capped
# at 512 threads, blocks of 1024 x 12 values (target 12), the smem path and Triton.
# (variant, dispatcher constants, path)
WIDE_BLOCK_CASES = [(op, dt, cols) for op in ("layer_norm", "rms_norm", "softmax")
                    for dt in ("float16", "bfloat16", "float32") for cols in (12288, 16384)]
_WIDE_768 = {"BLOCK_WIDE_THREADS": (768, 1024)}
WIDE_BLOCK_VARIANTS = [("default", {}, None), ("wide-768", _WIDE_768, "block"),
                       ("block-512", {"BLOCK_WIDE_THREADS": ()}, "block"),
                       ("target12", {**_WIDE_768, "BLOCK_TARGET_VALUES": 12}, "block"),
                       ("smem", {}, "smem")]


# Rows whose packs do not fill a power-of-two block: the block path in blocks of any whole
# number of warps (dispatcher BLOCK_THREADS) against power-of-two blocks only (as dispatched,
# and forced onto the block path), the smem path and Triton.
BLOCK_SIZE_CASES = [(op, dt, cols) for op in ("layer_norm", "rms_norm", "softmax")
                    for dt in ("float16", "bfloat16", "float32") for cols in (3000, 5120, 6144)]
BLOCK_SIZE_CASES += [("softmax", "float32", 769), ("layer_norm", "float32", 2052)]
_POW2 = {"BLOCK_THREADS": (128, 256, 512)}
BLOCK_SIZE_VARIANTS = [("default", {}, None), ("pow2", _POW2, None),
                       ("pow2-block", _POW2, "block"), ("smem", {}, "smem")]


# The smem path at each block size, next to the dispatched one (the norms: pick_block_threads;
# OneFlow's pick_block kept the resident-block count of a 128-thread block: 8 x 128 threads for
# 12288 16-bit cols, where the affine stores wait on their weight and bias loads, ncu:
# affine-kernels).
SMEM_BLOCK_CASES = [("layer_norm", dt, cols) for dt in ("float16", "bfloat16", "float32")
                    for cols in (12288, 32768)]
SMEM_BLOCK_CASES += [("rms_norm", "float16", 12288), ("rms_norm", "bfloat16", 32768),
                     ("layer_norm", "float32", 16384), ("rms_norm", "float32", 16384),
                     ("layer_norm", "float16", 20480), ("layer_norm", "bfloat16", 49152)]
SMEM_BLOCK_VARIANTS = [("default", {}, None), ("smem-128", {"BLOCK_SIZES": (128,)}, "smem"),
                       ("smem-256", {"BLOCK_SIZES": (256,)}, "smem"),
                       ("smem-512", {"BLOCK_SIZES": (512,)}, "smem")]


def block_variants(cases, variants, rows: int) -> None:
    """GB/s of each (op, dtype, cols) case (norms with weight and bias) on each (name,
    dispatcher constants, forced path) variant, with the plan's block size and the kernel's
    registers (NVRTC), next to Triton."""
    from triton.testing import do_bench

    from cunorm.bench import triton_kernels

    _warm_up()
    for op, dt, cols in cases:
        y, fn, args = _row_case(op, dt, rows, cols)
        print(f"{op} {dt} ({rows}, {cols})", flush=True)
        for name, consts, path in variants:
            with _dispatch.override_constants(consts), _dispatch.force_path(path):
                try:
                    fn(*args, out=y)
                except ValueError as err:
                    print(f"  {name:10s} refused: {err}", flush=True)
                    continue
                kern, block, _ = _planned(op)
                ms = do_bench(functools.partial(fn, *args, out=y), warmup=10, rep=50,
                              return_mode="median")
            print(f"  {name:10s} {2 * y.nbytes / ms / 1e6:5.0f} GB/s  block={block} "
                  f"{kern.name[8:]} regs={kern.num_regs} local={kern.local_size_bytes}",
                  flush=True)
        if op == "softmax":
            import torch

            peer = functools.partial(triton_kernels.softmax, torch.from_dlpack(args[0]))
            ms = do_bench(peer, warmup=10, rep=50, return_mode="median")
            print(f"  triton     {2 * y.nbytes / ms / 1e6:5.0f} GB/s", flush=True)
        elif (peer := _triton_norm_gbps(op, args)) is not None:
            print(f"  triton     {peer:5.0f} GB/s", flush=True)
        del y, args


# Rows on the smem path with the kernel's shared-memory carveout preference set (percent of
# the unified L1 / shared memory; -1: the driver's choice, which gives shared memory all it
# can use), a smaller carveout leaving L1 room for the weight and bias every row reads again.
CARVEOUT_CASES = [("layer_norm", "float16", 12288), ("layer_norm", "bfloat16", 12288),
                  ("layer_norm", "float16", 32768), ("layer_norm", "float32", 12288),
                  ("rms_norm", "float16", 12288), ("softmax", "float16", 12288)]
CARVEOUTS = (-1, 50, 60, 70)


def carveout(rows: int = 12288) -> None:
    """GB/s of CARVEOUT_CASES (norms with weight and bias) on the default plan with each
    CARVEOUTS setting, with the resident blocks per SM the occupancy API then reports."""
    from triton.testing import do_bench

    from cunorm._kernels import occupancy

    _warm_up()
    for op, dt, cols in CARVEOUT_CASES:
        y, fn, args = _row_case(op, dt, rows, cols)
        kern, block, smem = _fresh_plan(op, functools.partial(fn, *args, out=y))
        line = f"{op} {dt} ({rows}, {cols}) block={block} smem={smem}:"
        for pct in CARVEOUTS:
            kern.preferred_shared_memory_carveout = pct
            fn(*args, out=y)
            ms = do_bench(functools.partial(fn, *args, out=y), warmup=10, rep=50,
                          return_mode="median")
            line += f"  {pct}% {2 * y.nbytes / ms / 1e6:5.0f} ({occupancy(kern, block, smem)} blk)"
        kern.preferred_shared_memory_carveout = -1
        print(line + " GB/s", flush=True)
        del y, args


# What the affine parameters cost on the smem path: layer_norm and rms_norm with and without
# weight (and bias), next to softmax, on the same rows.
AFFINE_COST_CASES = [("float16", 12288), ("float16", 32768), ("bfloat16", 12288)]


def affine_cost(rows: int = 12288) -> None:
    """GB/s of the norms on AFFINE_COST_CASES with weight and bias, weight only and neither."""
    from triton.testing import do_bench

    _warm_up()
    for dt, cols in AFFINE_COST_CASES:
        y, _, (x, w, b) = _affine_case("layer_norm", dt, rows, cols)
        for name, fn, args in (("layer_norm w+b", cunorm.layer_norm, (x, w, b)),
                               ("layer_norm w", cunorm.layer_norm, (x, w)),
                               ("layer_norm", cunorm.layer_norm, (x,)),
                               ("rms_norm w", cunorm.rms_norm, (x, w)),
                               ("rms_norm", cunorm.rms_norm, (x,)),
                               ("softmax", cunorm.softmax, (x,))):
            fn(*args, out=y)
            ms = do_bench(functools.partial(fn, *args, out=y), warmup=10, rep=50,
                          return_mode="median")
            print(f"{dt} ({rows}, {cols}) {name:15s} {2 * y.nbytes / ms / 1e6:5.0f} GB/s",
                  flush=True)
        del y, x, w, b


def affine_kernels(rows: int = 12288) -> None:
    """One launch each, for ncu, in this order: float16 layer_norm with weight and bias,
    without them, and rms_norm with weight on 12288 cols (smem path), layer_norm with weight
    and bias there again with the driver's carveout and with a 50% one; then the first three
    on 16384 cols (block path, 1024 threads)."""
    for cols in (12288, 16384):
        y, _, (x, w, b) = _affine_case("layer_norm", "float16", rows, cols)
        calls = [(cunorm.layer_norm, (x, w, b)), (cunorm.layer_norm, (x,)),
                 (cunorm.rms_norm, (x, w))]
        for fn, args in calls:  # one launch each (the first call also compiles and plans)
            print(f"launch: {fn.__name__} float16 ({rows}, {cols}) {len(args) - 1} params",
                  flush=True)
            fn(*args, out=y)
        if cols == 12288:
            kern, _, _ = _fresh_plan("layer_norm", functools.partial(cunorm.layer_norm, x, w, b,
                                                                     out=y))
            kern.preferred_shared_memory_carveout = 50
            print("launch: layer_norm float16 (12288, 12288) 2 params, carveout 50%", flush=True)
            cunorm.layer_norm(x, w, b, out=y)
            kern.preferred_shared_memory_carveout = -1
        cupy.cuda.Device().synchronize()
        del y, x, w, b


# Long rows (512 KB and more) on the default plan and on a non-portable cluster of 16 blocks
# (sm_90 allows 16 with cudaFuncAttributeNonPortableClusterSizeAllowed), to see whether
# smaller slices per block beat the portable cluster of 8.
LONG_ROW_CASES = [("float16", 262144, 768), ("bfloat16", 262144, 768),
                  ("float32", 131072, 1536), ("float32", 262144, 768),
                  ("bfloat16", 131072, 1536), ("float32", 65536, 3072)]
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute


def long_rows() -> None:
    """GB/s of softmax on LONG_ROW_CASES: the dispatcher's plan, then clusters of 16 (shared
    memory and uncached), each with the block size pick_block gives it."""
    from triton.testing import do_bench

    from cunorm import _kernels
    from cunorm._device import device_props
    from cunorm._dispatch import CTYPE, pick_block

    props = device_props(0)
    plans = cunorm.softmax.__globals__["_PLANS"]
    warm = cupy.ones((4096, 4096), dtype=np.float32)  # the first timing of a process runs slow
    do_bench(functools.partial(cunorm.softmax, warm), warmup=100, rep=200)
    for dt, cols, rows in LONG_ROW_CASES:
        x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
        y = cupy.empty_like(x)
        plans.clear()
        cunorm.softmax(x, out=y)
        plan = next(iter(plans.values()))[0]
        ref = y.copy()
        ms = do_bench(functools.partial(cunorm.softmax, x, out=y), warmup=10, rep=50,
                      return_mode="median")
        line = (f"{dt} ({rows}, {cols}) default {2 * x.nbytes / ms / 1e6:5.0f} GB/s "
                f"[{plan.kernel.split('<')[0][8:]} block={plan.block} smem={plan.smem}]")
        pack = 16 // x.itemsize
        head = f"{CTYPE[dt]}, {CTYPE[dt]}, false, {pack}"
        for path in ("smem", "uncached"):
            name = f"cunorm::softmax_{path}_cluster<{head}, 16>"
            smem = _dispatch._cdiv(cols // pack, 16) * pack * x.itemsize if path == "smem" else 0
            kern = _kernels.get_kernel(0, props.arch, "softmax.cu", name,
                                       smem_optin=props.smem_per_block_optin)
            cupy.cuda.driver.funcSetAttribute(kern.kernel.ptr,
                                              _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            if path == "smem":
                block, per_sm = pick_block(name, smem, lambda k, b, s, kern=kern:
                                           _kernels.occupancy(kern, b, s))
            else:
                block, per_sm = _dispatch.UNCACHED_BLOCK, 1
            args = (x, y, np.int64(rows), np.int64(cols), np.int64(cols), np.int64(cols))

            def launch(kern=kern, grid=rows * 16, block=block, smem=smem, args=args):
                kern((grid,), (block,), args, shared_mem=smem)
            try:
                y.fill(float("nan"))
                launch()
                cupy.cuda.Device().synchronize()
                err = float(cupy.abs(y.astype(np.float32) - ref.astype(np.float32)).max())
                ms = do_bench(launch, warmup=10, rep=50, return_mode="median")
                line += (f" | {path}16 {2 * x.nbytes / ms / 1e6:5.0f} GB/s block={block} "
                         f"per_sm={per_sm} max|diff|={err:.1e}")
            except cupy.cuda.driver.CUDADriverError as exc:
                line += f" | {path}16 failed: {exc}"
        print(line, flush=True)
        del x, y, ref


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


def _triton():
    try:
        import triton
    except ImportError:
        return None
    return triton


def attention() -> None:
    """TFLOP/s of cunorm.attention against torch SDPA's flash backend, bf16, 16k tokens."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    for d in (64, 128):
        for seq in (1024, 4096, 16384):
            for causal in (False, True):
                b, h = 16384 // seq, 2048 // d
                q, k, v = (cupy.random.standard_normal((b, h, seq, d), dtype=np.float32)
                           .astype(cupy.dtype("bfloat16")) for _ in range(3))
                flops = 4 * b * h * seq * seq * d / (2 if causal else 1)
                ms = do_bench(functools.partial(cunorm.attention, q, k, v, causal=causal),
                              warmup=5, rep=30, return_mode="median")
                tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv,
                                                                           is_causal=causal)
                    ms_fa = do_bench(functools.partial(
                        torch.nn.functional.scaled_dot_product_attention, tq, tk, tv,
                        is_causal=causal), warmup=5, rep=30, return_mode="median")
                ours = torch.from_dlpack(cunorm.attention(q, k, v, causal=causal))
                err = float((ours.float() - ref.float()).abs().max())
                print(f"D={d} L={seq} causal={causal}: cunorm {flops / ms / 1e9:6.1f} TFLOP/s, "
                      f"FA2 {flops / ms_fa / 1e9:6.1f}, max|diff| {err:.2e}")


def attention_overhead(n: int = 2000) -> None:
    """Host and GPU time per decoding call (bf16, Lq = 1, 32 / 8 heads, D = 128, Lk = 4096)
    for CuPy and torch inputs, then a cProfile of the CuPy calls (functions by own time)."""
    import cProfile
    import pstats

    from cupyx.profiler import benchmark

    q = cupy.random.standard_normal((1, 32, 1, 128), dtype=np.float32).astype("bfloat16")
    k, v = (cupy.random.standard_normal((1, 8, 4096, 128), dtype=np.float32).astype("bfloat16")
            for _ in range(2))
    calls = {"cupy": lambda: cunorm.attention(q, k, v)}
    try:
        import torch

        tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
        calls["torch"] = lambda: cunorm.attention(tq, tk, tv)
    except ImportError:
        pass
    for name, fn in calls.items():
        res = benchmark(fn, n_repeat=n, n_warmup=50)
        print(f"decoding cunorm.attention ({name}): host {res.cpu_times.mean() * 1e6:.1f} us, "
              f"GPU {res.gpu_times.mean() * 1e6:.1f} us per call (cupyx benchmark, {n} calls)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        calls["cupy"]()
    prof.disable()
    cupy.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


_LAUNCH_PROBE = r"""
struct Scalars { long long v[29]; double scale; int flags[8]; };
extern "C" __global__ void many(const void* a, const void* b, const void* c, void* d,
    const void* e, void* f, void* g, const void* h, int i0, int i1, int i2, long long l0,
    long long l1, int i3, int i4, long long s0, long long s1, long long s2, long long s3,
    long long s4, long long s5, long long s6, long long s7, long long s8, long long s9,
    long long s10, long long s11, long long s12, long long s13, long long s14, long long s15,
    long long s16, long long s17, long long s18, double x, int i5, int i6, long long l2) {}
extern "C" __global__ void packed(const void* a, const void* b, const void* c, void* d,
    const void* e, void* f, void* g, const void* h, Scalars s) {}
extern "C" __global__ void few(const void* a, void* b) {}
"""


def launch_cost(n: int = 20000) -> None:
    """Host time of one CuPy RawKernel launch by argument list: the attention kernels' 8
    pointers and 30 scalars, the same scalars in one struct (a NumPy structured scalar), and
    2 pointers (the row kernels)."""
    mod = cupy.RawModule(code=_LAUNCH_PROBE)
    x = cupy.zeros(16, np.float32)
    i32, i64 = np.int32, np.int64
    many = (x,) * 4 + (x, x, x, np.uint64(0)) + (i32(0),) * 3 + (i64(1),) * 2 + (i32(0),) * 2 \
        + (i64(1),) * 19 + (np.float64(1.0), i32(0), i32(0), i64(1))
    rec = np.dtype({"names": ["v", "scale", "flags"], "formats": [(np.int64, 29), np.float64,
                   (np.int32, 8)], "offsets": [0, 232, 240], "itemsize": 272})
    packed = (x,) * 4 + (x, x, x, np.uint64(0)) + (np.zeros((), rec)[()],)
    cases = {"many": (mod.get_function("many"), many),
             "packed": (mod.get_function("packed"), packed),
             "few": (mod.get_function("few"), (x, x))}
    for name, (fn, args) in cases.items():
        try:
            for _ in range(100):
                fn((1,), (32,), args)
        except Exception as err:  # noqa: BLE001 - report what CuPy refuses
            print(f"launch {name}: {type(err).__name__}: {err}")
            continue
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn((1,), (32,), args)
        t1 = time.perf_counter()
        cupy.cuda.Device().synchronize()
        print(f"launch {name} ({len(args)} args): {(t1 - t0) / n * 1e6:.2f} us host")


def attention_kernels() -> None:
    """One forward per head dim (bf16, 16k tokens, L = 4096, non-causal) for ncu."""
    for d in (64, 128):
        q, k, v = (cupy.random.standard_normal((4, 2048 // d, 4096, d), dtype=np.float32)
                   .astype(cupy.dtype("bfloat16")) for _ in range(3))
        cunorm.attention(q, k, v)
    cupy.cuda.Device().synchronize()


def decode(lks=(4096, 16384, 65536, 131072)) -> None:
    """Decoding GB/s of K/V read (bf16, Lq = 1, 32 / 8 heads, D = 128; do_bench, L2 flushed)
    for cunorm and torch SDPA's default backend, and a device copy of the same bytes."""
    import torch
    from triton.testing import do_bench

    q = cupy.random.standard_normal((1, 32, 1, 128), dtype=np.float32).astype("bfloat16")
    for lk in lks:
        k, v = (cupy.random.standard_normal((1, 8, lk, 128), dtype=np.float32)
                .astype("bfloat16") for _ in range(2))
        nbytes = k.nbytes + v.nbytes
        dst = cupy.empty_like(k)
        tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        calls = {"cunorm": functools.partial(cunorm.attention, q, k, v),
                 "sdpa": functools.partial(sdpa, tq, tk, tv, enable_gqa=True),
                 "copy": functools.partial(cupy.cuda.runtime.memcpyAsync, dst.data.ptr,
                                           k.data.ptr, k.nbytes,
                                           cupy.cuda.runtime.memcpyDeviceToDevice, 0)}
        times = {n: do_bench(fn, warmup=10, rep=50, return_mode="median")
                 for n, fn in calls.items()}
        gbs = {n: (2 * k.nbytes if n == "copy" else nbytes) / t / 1e6 for n, t in times.items()}
        print(f"decode Lk={lk}: " + ", ".join(f"{n} {times[n] * 1e3:.1f} us {gbs[n]:.0f} GB/s"
                                               for n in times)
              + f"; cunorm/copy {gbs['cunorm'] / gbs['copy']:.0%}")


def decode_kernels() -> None:
    """One decoding call (bf16, Lq = 1, 32 / 8 heads, D = 128) per Lk, after a warm-up."""
    q = cupy.random.standard_normal((1, 32, 1, 128), dtype=np.float32).astype("bfloat16")
    for lk in (4096, 16384, 131072):
        k, v = (cupy.random.standard_normal((1, 8, lk, 128), dtype=np.float32)
                .astype("bfloat16") for _ in range(2))
        cunorm.attention(q, k, v)
        cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    {"overhead": overhead, "kernels": kernels, "strided": strided,
     "strided-launch": lambda: strided(True), "norms": norms,
     "norm-kernels": norm_kernels, "attention": attention,
     "attention-kernels": attention_kernels,
     "attention-overhead": attention_overhead, "launch-cost": launch_cost,
     "decode-kernels": decode_kernels, "decode": decode,
     "gaps": gaps, "gap-kernels": gap_kernels, "norm-variants": norm_variants,
     "store-batch": store_batch, "long-rows": long_rows,
     "placement": placement, "peer-kernels": peer_kernels,
     "wide-blocks": lambda: block_variants(WIDE_BLOCK_CASES, WIDE_BLOCK_VARIANTS, 24576),
     "block-sizes": lambda: block_variants(BLOCK_SIZE_CASES, BLOCK_SIZE_VARIANTS, 49152),
     "smem-blocks": lambda: block_variants(SMEM_BLOCK_CASES, SMEM_BLOCK_VARIANTS, 24576),
     "carveout": carveout,
     "affine-cost": affine_cost, "affine-kernels": affine_kernels}[sys.argv[1]]()
