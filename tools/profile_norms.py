"""layer_norm / rms_norm profiles of tools/gpu_profile.py: every path per shape, resident-block
variants, block sizes, carveouts and the cost of the affine parameters."""

from __future__ import annotations

import functools
import time

import cupy
from profile_common import (
    _affine_case,
    _build_with,
    _call_case,
    _fresh_plan,
    _norm_inputs,
    _row_case,
    _triton_norm_gbps,
    _use_sources,
    _warm_up,
)

import cunorm
from cunorm import _dispatch

NORM_CASES = [("float16", 32), ("float16", 2048), ("float16", 4096), ("float16", 8192),
              ("float16", 16384), ("float32", 32), ("float32", 4096), ("float32", 8192),
              ("float32", 16384)]



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


STORE_BATCH_CASES = [
    ("layer_norm", "float16", 1024, 49152), ("layer_norm", "float16", 2048, 49152),
    ("layer_norm", "float16", 8192, 49152), ("layer_norm", "bfloat16", 16384, 24576),
    ("layer_norm", "float16", 32768, 12288), ("layer_norm", "float16", 65536, 3072),
    ("layer_norm", "float32", 4096, 49152), ("layer_norm", "float32", 16384, 24576),
    ("layer_norm", "float32", 65536, 3072), ("rms_norm", "bfloat16", 16384, 24576),
    ("rms_norm", "float32", 512, 49152)]


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
            # (the driver itself: cunorm's occupancy() caches the planner's answer, taken
            # under the driver's own split)
            blocks = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                kern.kernel.ptr, block, smem)
            line += f"  {pct}% {2 * y.nbytes / ms / 1e6:5.0f} ({blocks} blk)"
        kern.preferred_shared_memory_carveout = -1
        print(line + " GB/s", flush=True)
        del y, args


# What the affine parameters cost (affine_cost): layer_norm and rms_norm with and without
# weight (and bias), next to softmax, on the same rows; these rows take the smem path.
AFFINE_COST_CASES = [("float16", 12288), ("float16", 32768), ("bfloat16", 12288)]
# Register-path rows (block path up to 8192 columns, smem at 12288), for param-cost.
PARAM_COST_CASES = [(dt, cols) for dt in ("float16", "bfloat16")
                    for cols in (2048, 4096, 8192, 12288)]


def affine_cost(rows: int = 12288, cases: list[tuple[str, int]] = AFFINE_COST_CASES) -> None:
    """GB/s (and % of the copy bandwidth) of the norms on ``cases`` with weight and bias, with
    one of them and with neither, against softmax on the same rows."""
    from triton.testing import do_bench

    from cunorm.bench.timing import TritonTimer, copy_bandwidth, gbps

    _warm_up()
    copy = copy_bandwidth(TritonTimer())
    print(f"copy {copy:.0f} GB/s", flush=True)
    for dt, cols in cases:
        y, _, (x, w, b) = _affine_case("layer_norm", dt, rows, cols)
        for name, fn, args in (("layer_norm w+b", cunorm.layer_norm, (x, w, b)),
                               ("layer_norm w", cunorm.layer_norm, (x, w)),
                               ("layer_norm b", cunorm.layer_norm, (x, None, b)),
                               ("layer_norm", cunorm.layer_norm, (x,)),
                               ("rms_norm w", cunorm.rms_norm, (x, w)),
                               ("rms_norm", cunorm.rms_norm, (x,)),
                               ("softmax", cunorm.softmax, (x,))):
            fn(*args, out=y)
            ms = do_bench(functools.partial(fn, *args, out=y), warmup=10, rep=50,
                          return_mode="median")
            rate = gbps(2 * y.nbytes, ms)
            print(f"{dt} ({rows}, {cols}) {name:15s} {rate:5.0f} GB/s {100 * rate / copy:5.1f}%",
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


# Rows of 12288 and 16384 cols in registers on 512-thread blocks holding 24 or 32 values a
# thread (as the Triton peer does), compiled for 2 resident blocks (64 registers: rows.cuh
# block_row_mid), against the default plan (dispatcher BLOCK_MID) and the other paths.
MID_BLOCK_CASES = [(op, "float32", c, 49152) for op in ("layer_norm", "rms_norm", "softmax")
                   for c in (12288, 16384)]
MID_BLOCK_CASES += [(op, dt, c, 49152) for op in ("layer_norm", "rms_norm")
                    for dt in ("float16", "bfloat16") for c in (12288, 16384)]
MID_BLOCK_CASES += [(op, dt, c, 49152) for op in ("softmax", "log_softmax")
                    for dt in ("float16", "bfloat16") for c in (12288, 16384)]
_MID_CONSTS = {"BLOCK_MAX_VALUES": {4: 32, 8: 16}, "BLOCK_WIDE_THREADS": ()}
MID_BLOCK_VARIANTS = [("default", {}, None),
                      ("mid", _MID_CONSTS, "block"),
                      ("mid-t32", {**_MID_CONSTS, "BLOCK_TARGET_VALUES": 32}, "block"),
                      ("no-mid", {"BLOCK_MID": {}}, None), ("smem", {}, "smem")]


# Short norm rows where torch.compile's kernels beat cunorm's on the GPU alone (rowops-profile
# section 9), with softmax (which matches it there) for contrast.
COMPILE_CASES = [("layer_norm", "float16", 256), ("rms_norm", "float16", 256),
                 ("softmax", "float16", 256), ("layer_norm", "float16", 1024)]
# Long norm rows where torch.compile's kernels run 2-5% faster than cunorm's and above the
# device-to-device copy rate (benchmarks/results/nvidia-h200-2026-11-23-rms_norm.md).
LONG_COMPILE_CASES = [("rms_norm", "float32", 4096), ("rms_norm", "float32", 8192),
                      ("rms_norm", "float32", 32768), ("rms_norm", "float16", 12288),
                      ("layer_norm", "float16", 16384)]


def compile_kernels(rows: int = 49152, cases=COMPILE_CASES) -> None:
    """cunorm against torch.compile on ``cases``: GPU-only GB/s (padded event timer), then,
    under ``ncu --profile-from-start off``, one launch of each between profiler start and stop
    (cunorm first, then Inductor's kernel, case by case)."""
    from cunorm.bench.cases import make_case
    from cunorm.bench.ops import OPS
    from cunorm.bench.peers import TorchCompile
    from cunorm.bench.timing import CupyEventTimer, gbps

    timer = CupyEventTimer(pad_us=100)
    compiled = TorchCompile()
    calls = []
    for op, dt, cols in cases:
        case = make_case(OPS[op], (rows, cols), dt)
        fn = OPS[op].resolve()[0]
        ours = functools.partial(case.cunorm, fn)
        theirs = compiled.build(case)
        ours(), theirs()
        calls.append((f"{op} {dt} ({rows}, {cols})", case, ours, theirs))
    cupy.cuda.runtime.deviceSynchronize()
    for name, case, ours, theirs in calls:
        a, b = gbps(case.nbytes, timer(ours)), gbps(case.nbytes, timer(theirs))
        print(f"{name:32s} cunorm {a:5.0f} GB/s  torch.compile {b:5.0f} GB/s  {a / b:5.3f}x",
              flush=True)
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.runtime.profilerStart()
    for _, _, ours, theirs in calls:
        for fn in (ours, theirs):
            fn()
            cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.runtime.profilerStop()


# The warp path's lane groups (dispatcher WARP_GROUP_PACKS): 32 lanes past 32 packs, as before
# session 23, against the narrowed groups; and its blocks of 128 threads against 64 and 32
# (WARP_BLOCK): (name, dispatcher constants).
WARP_GROUP_VARIANTS = [("32 lanes", {"WARP_GROUP_PACKS": {}}), ("narrow", {})]
WARP_BLOCK_VARIANTS = [("block 128", {"WARP_BLOCK": 128}), ("block 64", {"WARP_BLOCK": 64}),
                       ("block 32", {"WARP_BLOCK": 32})]
WARP_GROUP_CASES = [
    (op, dt, cols)
    for op, dts in (("layer_norm", ("float16", "bfloat16", "float32")),
                    ("rms_norm", ("float16", "bfloat16", "float32")),
                    ("softmax", ("float16", "bfloat16", "float32")),
                    ("log_softmax", ("float16", "float32")))
    for dt in dts
    for cols in (32, 64, 128, 256, 512, 1024) if cols <= (512 if dt == "float32" else 1024)]


# Softmax rows of 4-31 full packs on narrowed lane groups (session 39) against the tiny-row
# groups (a pack a lane, two rows a group) they took before, and with the 16-bit rows of 64
# columns narrowed too (softmax-narrow).
SOFTMAX_NARROW_VARIANTS = [
    ("tiny rows", {"WARP_GROUP_MIN_PACKS": {"norm": 4, "softmax": 32}}),
    ("all narrowed", {"WARP_GROUP_KEEP_TINY": {}}), ("shipped", {})]
SOFTMAX_NARROW_CASES = [(op, dt, cols) for op in ("softmax", "log_softmax")
                        for dt in ("float16", "bfloat16", "float32") for cols in (32, 64, 128)]


# The residual norms' rows on 32-lane groups (the rule before session 42), narrowed up to
# RESIDUAL_NARROW_MAX_PACKS packs (shipped) and narrowed at every length (residual-narrow).
RESIDUAL_NARROW_VARIANTS = [("32 lanes", {"RESIDUAL_NARROW_MAX_PACKS": 0}), ("shipped", {}),
                            ("all narrowed", {"RESIDUAL_NARROW_MAX_PACKS": 1 << 20})]
RESIDUAL_NARROW_CASES = [(op, dt, c) for op in ("layer_norm_residual", "rms_norm_residual")
                         for dt in ("float16", "bfloat16") for c in (32, 48, 64, 128, 256)]
RESIDUAL_NARROW_CASES += [(op, "float32", c) for op in ("layer_norm_residual",
                                                        "rms_norm_residual")
                          for c in (16, 24, 32, 64, 128)]


# Norm rows of WARP_SPREAD_PACKS packs (16-bit 64 columns, float32 32), where torch.compile
# leads most: two rows a group (the 16-bit kernels of 2 rows keep their 64-register bound, so
# that variant is the build before WARP_SPREAD_ROWS 4), as shipped, and on narrowed groups (no
# spread); float16 32 columns unchanged alongside (spread-rows).
SPREAD_VARIANTS = [("2 rows", {"WARP_SPREAD_ROWS": 2}), ("shipped", {}),
                   ("narrowed", {"WARP_SPREAD_PACKS": {}})]
SPREAD_CASES = [(op, dt, c) for op in ("layer_norm", "rms_norm", "layer_norm_residual",
                                       "rms_norm_residual")
                for dt, c in (("float16", 64), ("bfloat16", 64), ("float32", 32),
                              ("float16", 32))]


# Lanes holding 4 packs of a row (32 16-bit values) against 2 (WARP_GROUP_PACKS): the
# Inductor kernels hold 32 values a lane on 256-1024-column rows (4 rows a warp at 256), so
# twice the bytes in flight a warp (warp-packs).
WARP_PACK_VARIANTS = [("2 packs", {}),
                      ("4 packs", {"WARP_GROUP_PACKS": {"norm": 4, "softmax": 4}})]
WARP_PACK_CASES = [("layer_norm", dt, c) for dt in ("float16", "bfloat16")
                   for c in (32, 128, 256, 512)]
WARP_PACK_CASES += [("layer_norm", "float32", c) for c in (64, 128, 256)]
WARP_PACK_CASES += [("rms_norm", "float16", c) for c in (128, 256, 512)]
WARP_PACK_CASES += [("rms_norm", "float32", 128), ("softmax", "float16", 256),
                    ("softmax", "float16", 512), ("softmax", "float32", 128),
                    ("softmax", "float32", 256), ("log_softmax", "float16", 512)]


def warp_groups(variants=WARP_GROUP_VARIANTS, rows: int = 49152, rounds: int = 2,
                cases=WARP_GROUP_CASES) -> None:
    """GB/s (padded event timer) of ``cases`` on each of ``variants`` and on
    torch.compile, ``rounds`` interleaved rounds, with each variant's warp configuration
    (values a lane, lanes a row, rows a group) and the largest difference of its output from
    the first variant's (relative to the row's largest value)."""
    import numpy as np

    from cunorm.bench.cases import make_case
    from cunorm.bench.ops import OPS
    from cunorm.bench.peers import TorchCompile
    from cunorm.bench.timing import CupyEventTimer, gbps

    timer = CupyEventTimer(pad_us=100)
    compiled = TorchCompile()
    names = "".join(f"{n:>24s}" for n, _ in variants)
    print(f"case{' ' * 32}{names}   torch.compile", flush=True)
    for op, dt, cols in cases:
        case = make_case(OPS[op], (rows, cols), dt)
        fn = OPS[op].resolve()[0]
        theirs = compiled.build(case)
        theirs()
        ref, cells = None, []
        family = "softmax" if op in _dispatch.SOFTMAX_OPS else "norm"
        for name, consts in variants:
            with _dispatch.override_constants(consts):
                out = case.cunorm(fn)
                out = out[0] if isinstance(out, tuple) else out
                pack = 16 // out.dtype.itemsize
                cfg = _dispatch.warp_config(cols, pack, 4, family, _dispatch.narrow_groups(
                    dt, dt, pack, cols, op.endswith("residual")))
            got = cupy.asnumpy(out.astype(cupy.float32))
            if ref is None:
                ref = got
            scale = np.maximum(np.abs(ref).max(axis=1, keepdims=True), 1e-30)
            err = float(np.nanmax(np.abs(got - ref) / scale))
            cells.append([name, consts, ",".join(map(str, cfg or ("-",))), err, []])
        peer = []
        for _ in range(rounds):
            for cell in cells:
                with _dispatch.override_constants(cell[1]):
                    cell[4].append(gbps(case.nbytes, timer(functools.partial(case.cunorm, fn))))
            peer.append(gbps(case.nbytes, timer(theirs)))
        line = f"{op:19s} {dt:8s} {cols:5d}"
        for _, _, cfg, err, rates in cells:
            line += f"  {'/'.join(f'{r:.0f}' for r in rates):>9s} {cfg:>8s} {err:.0e}"
        print(line + f"   {'/'.join(f'{r:.0f}' for r in peer)}", flush=True)
        del case, theirs
        cupy.get_default_memory_pool().free_all_blocks()


# Row ops against the kernel sources of another commit (row-sources): (op, dtype, cols);
# "_residual" adds r (bytes: x, r read, y, h written), "_offset" moves every row's mean 200
# standard deviations from 0.
SOURCE_CASES = [("layer_norm", dt, c) for dt in ("float16", "bfloat16")
                for c in (2048, 3000, 4096, 5120, 8192, 12288, 16384, 32768, 65536, 131072,
                          262144)]
SOURCE_CASES += [("layer_norm", "float32", c) for c in (2048, 4096, 8192, 32768, 262144)]
SOURCE_CASES += [("layer_norm_residual", dt, c) for dt in ("float16", "bfloat16")
                 for c in (4096, 8192, 65536)]
SOURCE_CASES += [("rms_norm", "float16", c) for c in (4096, 65536)]
SOURCE_CASES += [("layer_norm_offset", dt, c) for dt in ("float16", "bfloat16")
                 for c in (4096, 65536)]


# float32 rows of at most 8 values a thread on the block path, at 32 registers (rows.cuh
# block_resident), against the previous sources (short-block-sources) and on other block sizes
# (short-blocks: 8 values a thread on more threads, or the block path for warp-path rows).
SHORT_BLOCK_CASES = [(op, "float32", c) for op in ("softmax", "log_softmax", "layer_norm",
                                                   "rms_norm") for c in (1000, 1024, 2048)]
SHORT_BLOCK_CASES += [("layer_norm_residual", "float32", 1024), ("rms_norm_residual", "float32",
                                                                 1024)]
SHORT_BLOCK_SIZE_CASES = [(op, "float32", c) for op in ("softmax", "log_softmax", "layer_norm",
                                                        "rms_norm")
                          for c in (256, 512, 1000, 2048, 3000, 4096)]
SHORT_BLOCK_VARIANTS = [("default", {}, None), ("block", {}, "block"),
                        ("block-t8", {"BLOCK_TARGET_VALUES": 8}, "block")]


# 16-bit rows at the warp path's upper end (1000-1536 cols) on the block path (8 values a
# thread, 32 registers) against the warp path (warp-edge-blocks).
WARP_EDGE_CASES = [(op, dt, c) for op in ("softmax", "log_softmax", "layer_norm", "rms_norm")
                   for dt in ("float16", "bfloat16") for c in (1000, 1024, 1536)]
WARP_EDGE_VARIANTS = [("default", {}, None), ("block", {}, "block")]
# Norm rows of 17-32 values a lane on the warp path, whose kernels are capped at the registers
# of 8 resident 128-thread blocks (norm.cu norm_warp), against the previous sources
# (warp-norm-sources).
WARP_NORM_CASES = [(op, dt, c) for op in ("layer_norm", "rms_norm", "layer_norm_residual",
                                          "rms_norm_residual")
                   for dt in ("float16", "bfloat16") for c in (512, 1000, 1024, 1536)]
WARP_NORM_CASES += [(op, "float32", 768) for op in ("layer_norm", "rms_norm")]

# bfloat16 rows, whose packs now convert two values a 32-bit word (common.cuh pack_to_compute),
# against the previous sources on every row path (convert-sources); float16 and float32 rows
# (element-wise conversions, unchanged code) as controls.
CONVERT_CASES = [("layer_norm", "bfloat16", c) for c in (1024, 2048, 8192, 16384, 32768, 65536,
                                                         262144)]
CONVERT_CASES += [("rms_norm", "bfloat16", c) for c in (2048, 32768, 65536)]
CONVERT_CASES += [("layer_norm_residual", "bfloat16", c) for c in (8192, 65536)]
CONVERT_CASES += [("softmax", "bfloat16", 8192), ("softmax", "bfloat16", 32768),
                  ("log_softmax", "bfloat16", 1024), ("layer_norm", "float16", 32768),
                  ("layer_norm_residual", "float32", 16384), ("layer_norm", "float32", 262144)]

# Block-path rows (2048-16384 columns) of every row op, 16-bit layer_norm rows 200 off 0 (every
# row summed again) and one cluster row as a control: the block kernels' 32-bit rows and the
# 16-bit layer_norm word stores (rows.cuh rows_block) against the previous sources
# (block-row-sources).
BLOCK_ROW_CASES = [(op, dt, c) for dt in ("float16", "bfloat16")
                   for op, cols in (("layer_norm", (2048, 3000, 4096, 6144, 8192, 16384)),
                                    ("rms_norm", (2048, 4096, 8192)),
                                    ("layer_norm_offset", (4096,)),
                                    ("layer_norm_residual", (4096,)))
                   for c in cols]
BLOCK_ROW_CASES += [("layer_norm", "float32", c) for c in (2048, 4096, 8192)]
BLOCK_ROW_CASES += [("rms_norm", "float32", 4096), ("log_softmax", "bfloat16", 4096),
                    ("layer_norm", "bfloat16", 262144)]
BLOCK_ROW_CASES += [("softmax", dt, c) for dt in ("float16", "bfloat16", "float32")
                    for c in (2048, 8192)]

# Warp-path rows (32-1024 columns) against the previous sources (warp-row-sources): the
# parameters' presence tested once (common.cuh AffineStore::with_known_params) and loaded with
# rows of 64-256 columns (rows.cuh warp_early_params); softmax and log_softmax (no
# parameters: the same loop, nothing to load early) for comparison.
WARP_ROW_CASES = [("layer_norm", dt, c) for dt in ("float16", "bfloat16", "float32")
                  for c in (32, 64, 128, 256, 512, 1000, 1024)]
WARP_ROW_CASES += [("rms_norm", dt, c) for dt in ("float16", "bfloat16")
                   for c in (64, 128, 256, 512, 1024)]
WARP_ROW_CASES += [("rms_norm", "float32", c) for c in (32, 128, 512)]
WARP_ROW_CASES += [("layer_norm_residual", "float16", c) for c in (256, 1024)]
WARP_ROW_CASES += [("layer_norm_residual", "float32", 1024), ("rms_norm_residual", "float16", 256)]
WARP_ROW_CASES += [("softmax", "float16", c) for c in (64, 256, 512, 1024)]
WARP_ROW_CASES += [("softmax", "float32", 1024), ("log_softmax", "float16", 256),
                   ("log_softmax", "float16", 1024)]
# The fused residual norms' warp rows (residual-row-sources): the lane's staged x and r packs
# (common.cuh ResidualLoad::Staged; session 71 held them as 32-bit words, which moved 16-bit
# rows of 64-128 columns, the spread and two-row groups, and nothing else); float32 rows for
# comparison.
RESIDUAL_ROW_CASES = [(op, dt, c) for op in ("layer_norm_residual", "rms_norm_residual")
                      for dt in ("float16", "bfloat16") for c in (32, 64, 96, 128, 256, 1024)]
RESIDUAL_ROW_CASES += [("layer_norm_residual", "float32", 64),
                       ("rms_norm_residual", "float32", 128)]


# Rows of the norms' shared-memory and cluster paths, for a build of rows.cuh rows_smem against
# another ($CUNORM_BASE_SOURCES) (smem-store-sources): stores testing once a row whether
# weight and bias are both present (with_known_params; shipped for 16-bit parameters only, see
# benchmarks/results/nvidia-h200-2026-11-23-smem-stores-profile.txt), and L1 prefetches of the
# 4- and 8-byte parameters (norm.cu norm_prefetch); softmax as a control.
SMEM_STORE_CASES = ([("layer_norm", dt, c) for dt in ("float16", "bfloat16")
                     for c in (12288, 32768, 65536, 262144)]
                    + [("rms_norm", dt, 32768) for dt in ("float16", "bfloat16")]
                    + [("layer_norm_residual", "float16", 32768), ("softmax", "float16", 32768)]
                    + [("layer_norm", "float32", c) for c in (12288, 16384, 32768, 65536, 131072,
                                                             262144)]
                    + [("layer_norm_residual", "float32", 32768), ("rms_norm", "float32", 32768),
                       ("layer_norm", "float64", 32768), ("layer_norm", "float64", 131072)])
# Long rows of the cluster and block paths (and 1024-column warp-path rows), for affine-cost
# (long-affine-cost).
LONG_AFFINE_CASES = [("float16", 1024), ("bfloat16", 1024), ("float16", 16384),
                     ("bfloat16", 16384), ("float16", 32768), ("bfloat16", 32768),
                     ("float32", 32768)]


def row_sources(base: str, rounds: int = 2, cases=SOURCE_CASES) -> None:
    """GB/s (padded event timer) of ``cases``, norms' weight (and bias) included, with kernels
    built from the sources in folder ``base`` (a ``cuda_src`` of another commit) and from this
    checkout's, alternated ``rounds`` times in one process on the same buffers; and the
    largest difference of the two outputs over the first 256 rows."""
    from pathlib import Path

    import numpy as np

    from cunorm import _kernels
    from cunorm.bench.timing import CupyEventTimer, gbps

    timer = CupyEventTimer(pad_us=100)
    shipped = _kernels.source_dir
    builds = [("base", lambda: Path(base)), ("this", shipped)]
    try:
        for op, dt, cols in cases:
            rows = min(49152, 201326592 // cols)
            y, call, nbytes = _call_case(op, dt, rows, cols)
            rates, outs = {name: [] for name, _ in builds}, {}
            for _ in range(rounds):
                for name, folder in builds:
                    _use_sources(folder)
                    call()
                    outs[name] = cupy.asnumpy(y[:256].astype(cupy.float32))
                    rates[name].append(gbps(nbytes, timer(call)))
            diff = float(np.abs(outs["base"] - outs["this"]).max())
            cells = "  ".join(f"{name} {'/'.join(f'{r:.0f}' for r in rs)}"
                              for name, rs in rates.items())
            print(f"{op:19s} {dt:8s} {cols:6d}  {cells}  max diff {diff:.1e}", flush=True)
            del y, call
            cupy.get_default_memory_pool().free_all_blocks()
    finally:
        _use_sources(shipped)
