"""Attention profiles of tools/gpu_profile.py: TFLOP/s against FlashAttention-2, decoding
bandwidth, host overhead and launch cost."""

from __future__ import annotations

import functools
import time

import cupy
import numpy as np
from profile_common import _use_sources, drop_attention_plans

import cunorm


def _fa2_case(d: int, seq: int, causal: bool):
    """A bf16 forward of FlashAttention's convention (16k tokens, hidden 2048): CuPy q, k, v,
    the FLOP count, torch SDPA's flash-backend output and its median time (ms, L2 flushed)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    b, h = 16384 // seq, 2048 // d
    q, k, v = (cupy.random.standard_normal((b, h, seq, d), dtype=np.float32)
               .astype(cupy.dtype("bfloat16")) for _ in range(3))
    flops = 4 * b * h * seq * seq * d / (2 if causal else 1)
    tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
    fa2 = functools.partial(torch.nn.functional.scaled_dot_product_attention, tq, tk, tv,
                            is_causal=causal)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ref = fa2()
        ms_fa = do_bench(fa2, warmup=5, rep=30, return_mode="median")
    return q, k, v, flops, ref, ms_fa


def _cunorm_case(q, k, v, causal: bool, ref) -> tuple[float, float]:
    """(median ms, max |cunorm - ref|) of cunorm.attention on q, k, v."""
    import torch
    from triton.testing import do_bench

    fn = functools.partial(cunorm.attention, q, k, v, causal=causal)
    ms = do_bench(fn, warmup=5, rep=30, return_mode="median")
    err = float((torch.from_dlpack(fn()).float() - ref.float()).abs().max())
    return ms, err


def _vs_fa2(flops: float, ms: float, ms_fa: float, err: float) -> str:
    """One case's TFLOP/s against FlashAttention-2's and the max |difference| from it."""
    return (f"{flops / ms / 1e9:6.1f} TFLOP/s ({ms_fa / ms:4.2f}x FA2 {flops / ms_fa / 1e9:6.1f}, "
            f"max|diff| {err:.1e})")


def attention() -> None:
    """TFLOP/s of cunorm.attention against torch SDPA's flash backend, bf16, 16k tokens."""
    for d in (64, 128):
        for seq in (1024, 4096, 16384):
            for causal in (False, True):
                q, k, v, flops, ref, ms_fa = _fa2_case(d, seq, causal)
                ms, err = _cunorm_case(q, k, v, causal, ref)
                print(f"D={d} L={seq} causal={causal}: cunorm {_vs_fa2(flops, ms, ms_fa, err)}")


def attention_groups(seqs=(512, 1024, 2048, 4096, 8192, 16384), grids=(None,)) -> None:
    """TFLOP/s of the warpgroup kernel with one- and two-warpgroup blocks forced (and each
    grid of ``grids``: ``force_persistent`` values, None the planner's), against
    FlashAttention-2, bf16, 16k tokens (_attn_dispatch.WG_CAUSAL_SHORT_KEYS)."""
    from cunorm._attn_dispatch import force_persistent, force_warpgroups

    for d in (64, 128):
        for seq in seqs:
            for causal in (False, True):
                q, k, v, flops, ref, ms_fa = _fa2_case(d, seq, causal)
                line = f"D={d} L={seq:5d} causal={int(causal)}:"
                for groups in (1, 2):
                    for blocks in grids:
                        with force_warpgroups(groups), force_persistent(blocks):
                            ms, err = _cunorm_case(q, k, v, causal, ref)
                        grid = "" if grids == (None,) else f" grid {blocks}"
                        line += (f" {groups} warpgroup(s){grid} {flops / ms / 1e9:6.1f} TFLOP/s"
                                 f" ({ms_fa / ms:4.2f}x FA2, max|diff| {err:.1e}),")
                print(f"{line} FA2 {flops / ms_fa / 1e9:6.1f}", flush=True)


#: attention-tiles: (label, keys per tile of the D = 64 one-warpgroup kernel)
WG64_TILE_VARIANTS = (("BN=128 (shipped)", 128), ("BN=64", 64), ("BN=128 (shipped) again", 128))


def attention_tiles(seqs=(512, 1024, 2048, 4096, 16384), variants=WG64_TILE_VARIANTS) -> None:
    """TFLOP/s of the D = 64 one-warpgroup kernel with other key tiles
    (``_attn_dispatch.WG_TILES``) against FlashAttention-2, bf16, 16k tokens; every variant on
    the same inputs in one process."""
    from cunorm import _attn_dispatch

    cases = {(seq, causal): _fa2_case(64, seq, causal) for seq in seqs for causal in (False, True)}
    shipped = _attn_dispatch.WG_TILES[64, 1]
    try:
        for label, bn in variants:
            _attn_dispatch.WG_TILES[64, 1] = bn
            drop_attention_plans()
            for (seq, causal), (q, k, v, flops, ref, ms_fa) in cases.items():
                ms, err = _cunorm_case(q, k, v, causal, ref)
                print(f"{label:24s} D=64 L={seq:5d} causal={int(causal)}: "
                      f"{_vs_fa2(flops, ms, ms_fa, err)}", flush=True)
    finally:
        _attn_dispatch.WG_TILES[64, 1] = shipped
        drop_attention_plans()


def attention_sources(base: str, seqs=(512, 1024, 2048, 4096, 16384), rounds: int = 2,
                      persistent: bool = False) -> None:
    """TFLOP/s of the planner's kernels built from the kernel sources in folder ``base`` (a
    ``cuda_src`` of another commit) and from this checkout's, alternated ``rounds`` times in
    one process on the same inputs, against FlashAttention-2 (bf16, 16k tokens, D = 64, 128).
    ``persistent``: the base build and this one run a block per row tile
    (``force_persistent(0)``; a base kernel without the persistent loop ignores the launch's
    trailing ``items`` argument), then this one runs the planner's grid."""
    from pathlib import Path

    from cunorm import _attn_dispatch, _kernels

    shipped = _kernels.source_dir
    per_tile = 0 if persistent else None
    builds = [("base", lambda: Path(base), per_tile), ("this", shipped, per_tile)]
    if persistent:
        builds.append(("this, planner's grid", shipped, None))
    cases = {(d, seq, causal): _fa2_case(d, seq, causal)
             for d in (64, 128) for seq in seqs for causal in (False, True)}
    try:
        for _ in range(rounds):
            for label, folder, blocks in builds:
                _use_sources(folder)
                for (d, seq, causal), (q, k, v, flops, ref, ms_fa) in cases.items():
                    with _attn_dispatch.force_persistent(blocks):
                        ms, err = _cunorm_case(q, k, v, causal, ref)
                    print(f"{label} D={d:3d} L={seq:5d} causal={int(causal)}: "
                          f"{_vs_fa2(flops, ms, ms_fa, err)}", flush=True)
    finally:
        _use_sources(shipped)


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


def short_kernels(seq: int = 512, d: int = 64) -> None:
    """Forwards on short rows for ncu (bf16, 16k tokens, L = 512, D = 64): non-causal and
    causal, on one- and two-warpgroup blocks, each launched twice (profile the second)."""
    from cunorm._attn_dispatch import force_warpgroups

    q, k, v = (cupy.random.standard_normal((16384 // seq, 2048 // d, seq, d), dtype=np.float32)
               .astype(cupy.dtype("bfloat16")) for _ in range(3))
    for causal in (False, True):
        for groups in (1, 2):
            with force_warpgroups(groups):
                for _ in range(2):
                    cunorm.attention(q, k, v, causal=causal)
    cupy.cuda.Device().synchronize()


def _decode_case(q, lk: int, d: int):
    """Random bf16 K and V (1, 8, lk, d) for the decoding query ``q`` and the calls timed on
    them: cunorm, torch SDPA's default backend (GQA), a device copy of K."""
    import torch

    k, v = (cupy.random.standard_normal((1, 8, lk, d), dtype=np.float32).astype("bfloat16")
            for _ in range(2))
    dst = cupy.empty_like(k)
    tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = {"cunorm": functools.partial(cunorm.attention, q, k, v),
             "sdpa": functools.partial(sdpa, tq, tk, tv, enable_gqa=True),
             "copy": functools.partial(cupy.cuda.runtime.memcpyAsync, dst.data.ptr, k.data.ptr,
                                       k.nbytes, cupy.cuda.runtime.memcpyDeviceToDevice, 0)}
    return k, v, calls


def decode(lks=(4096, 16384, 65536, 131072), d: int = 128) -> None:
    """Decoding GB/s of K/V read (bf16, Lq = 1, 32 / 8 heads, D = 128; do_bench, L2 flushed)
    for cunorm and torch SDPA's default backend, and a device copy of the same bytes."""
    from triton.testing import do_bench

    q = cupy.random.standard_normal((1, 32, 1, d), dtype=np.float32).astype("bfloat16")
    for lk in lks:
        k, v, calls = _decode_case(q, lk, d)
        nbytes = k.nbytes + v.nbytes
        times = {n: do_bench(fn, warmup=10, rep=50, return_mode="median")
                 for n, fn in calls.items()}
        gbs = {n: (2 * k.nbytes if n == "copy" else nbytes) / t / 1e6 for n, t in times.items()}
        print(f"decode Lk={lk}: " + ", ".join(f"{n} {times[n] * 1e3:.1f} us {gbs[n]:.0f} GB/s"
                                               for n in times)
              + f"; cunorm/copy {gbs['cunorm'] / gbs['copy']:.0%}")


def decode_dependent(rounds: int = 2, n: int = 2000) -> None:
    """:func:`decode` with the split-KV merge launched as a programmatic dependent of the
    attention kernel (as shipped) and as an ordinary launch after it, alternating ``rounds``
    times in one process, each with the host time per call (Lk = 16384, ``n`` calls)."""
    import time

    from cunorm import _attn_launch

    q = cupy.random.standard_normal((1, 32, 1, 128), dtype=np.float32).astype("bfloat16")
    kv = cupy.random.standard_normal((1, 8, 16384, 128), dtype=np.float32).astype("bfloat16")
    try:
        for _ in range(rounds):
            for name, dependent in (("ordinary", False), ("dependent", True)):
                _attn_launch.DEPENDENT_COMBINE = dependent
                drop_attention_plans()  # prepared launches keep the setting
                cunorm.attention(q, kv, kv)
                cupy.cuda.Device().synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    cunorm.attention(q, kv, kv)
                host = (time.perf_counter() - t0) / n * 1e6
                cupy.cuda.Device().synchronize()
                print(f"combine {name}: host {host:.1f} us per call (back to back)", flush=True)
                decode((4096, 16384, 32768, 65536, 131072))
    finally:
        _attn_launch.DEPENDENT_COMBINE = True
        drop_attention_plans()


def decode_stages(stages=(2, 3, 4, 6)) -> None:
    """:func:`decode` (D = 128 and 64) with the key-split kernel built for each K/V pipeline
    depth (``_attn_dispatch.TC_KEY_SPLIT_STAGES``), with its plan (splits, blocks per SM)."""
    from cunorm import _attn_dispatch, _attn_launch

    default = _attn_dispatch.TC_KEY_SPLIT_STAGES
    try:
        for st in stages:
            _attn_dispatch.TC_KEY_SPLIT_STAGES = st
            drop_attention_plans()
            for d in (128, 64):
                q = cupy.zeros((1, 32, 1, d), "bfloat16")
                kv = cupy.zeros((1, 8, 16384, d), "bfloat16")
                launch = _attn_launch.prepare(q, kv, kv, cupy.empty_like(q), causal=False,
                                              scale=1.0)
                plan = launch.plan
                print(f"stages {st} D={d}: {plan.kernel}, smem {plan.smem}, grid {plan.grid}")
                decode((4096, 16384, 32768, 131072), d)
    finally:
        _attn_dispatch.TC_KEY_SPLIT_STAGES = default
        drop_attention_plans()


def decode_kernels() -> None:
    """One decoding call (bf16, Lq = 1, 32 / 8 heads, D = 128) per Lk, after a warm-up."""
    q = cupy.random.standard_normal((1, 32, 1, 128), dtype=np.float32).astype("bfloat16")
    for lk in (4096, 16384, 131072):
        k, v = (cupy.random.standard_normal((1, 8, lk, 128), dtype=np.float32)
                .astype("bfloat16") for _ in range(2))
        cunorm.attention(q, k, v)
        cupy.cuda.Device().synchronize()


_READ_PROBE = r"""
extern "C" __global__ void read_all(const uint4* a, long long n, const uint4* b, unsigned* sink) {
  unsigned acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint4 x = a[i], y = b[i];
    acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; never true on random data
}
"""


def decode_parts(lks=(4096, 16384, 32768, 65536, 131072), d: int = 128) -> None:
    """A decoding call (bf16, Lq = 1, 32 / 8 heads) against the floor of any kernel over the
    same K/V bytes: a read-only kernel, a device copy of K, and torch SDPA's default backend
    (do_bench medians, L2 flushed; the better of two), then the call, the read-only kernel and
    SDPA timed after a flush that only reads (do_bench's zeroing leaves L2 dirty)."""
    from triton.testing import do_bench

    probe = cupy.RawModule(code=_READ_PROBE).get_function("read_all")
    sink = cupy.zeros(1, np.uint32)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    read_blocks = props["multiProcessorCount"] * 8
    q = cupy.random.standard_normal((1, 32, 1, d), dtype=np.float32).astype("bfloat16")
    big = cupy.ones(256 << 20, np.uint8)  # read-only L2 flush: 256 MB, as do_bench's
    flush = functools.partial(probe, (read_blocks,), (256,),
                              (big, np.int64(big.nbytes // 32), big[big.nbytes // 2:], sink))
    for lk in lks:
        k, v, calls = _decode_case(q, lk, d)
        nbytes = k.nbytes + v.nbytes
        calls["read"] = functools.partial(probe, (read_blocks,), (256,),
                                          (k, np.int64(k.nbytes // 16), v, sink))
        times = {n: min(do_bench(fn, warmup=10, rep=50, return_mode="median")
                        for _ in range(2)) for n, fn in calls.items()}
        # do_bench flushes L2 by zeroing 256 MB, which leaves L2 full of dirty lines that the
        # timed kernel's reads then evict (write back); the same timing after a read-only flush:
        clean = {n: _median_after_read_flush(calls[n], flush) for n in ("cunorm", "read", "sdpa")}
        print(f"Lk={lk} ({nbytes / 1e6:.0f} MB): "
              + ", ".join(f"{n} {t * 1e3:.1f} us" for n, t in times.items())
              + f"; GB/s read {nbytes / times['read'] / 1e6:.0f}, cunorm "
              f"{nbytes / times['cunorm'] / 1e6:.0f}, sdpa {nbytes / times['sdpa'] / 1e6:.0f}"
              + "; after a read-only flush: "
              + ", ".join(f"{n} {t * 1e3:.1f} us" for n, t in clean.items()))


def _median_after_read_flush(fn, flush, reps: int = 50) -> float:
    """Median ms of ``fn`` between CUDA events, each run after ``flush()`` (which evicts L2
    by reading) instead of do_bench's zeroing."""
    times = []
    for _ in range(reps + 5):
        flush()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times[5:]))
