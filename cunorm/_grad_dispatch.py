"""Pure launch planning for the softmax and norm gradients (``cuda_src/grad.cu``).

:func:`plan_grad` maps (op, dtype, rows, cols, alignment, device, occupancy oracle) to a
:class:`cunorm._dispatch.LaunchPlan`, as :func:`cunorm._dispatch.plan_rows` does for the
forward ops, and like it is unit-tested on a CPU with a fake device. A backward row moves
three arrays (reads y and dy, writes dx), so the paths hold two row operands a thread:

warp
    a group of 1-32 lanes of a 128-thread block holds a row of y and of dy in registers (at
    most :data:`GRAD_WARP_MAX_BYTES` of each a lane); read once;
block
    a block of 128-1024 threads (a multiple of 32) holds a row in registers (at most
    :data:`GRAD_BLOCK_MAX_PACKS` packs of each a thread); read once;
cluster
    on sm_90, a row no block holds is split over a thread-block cluster whose blocks each
    hold a slice in registers; read once;
uncached
    a block reads a row of any length twice: the sum, then the write.

:func:`plan_norm_grad` plans layer_norm / rms_norm gradients on the same paths
(:data:`NORM_GRAD_PATHS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._device import DeviceProps
from ._dispatch import (
    CLUSTER_SIZES,
    CTYPE,
    ITEMSIZE,
    MAX_GRID,
    LaunchPlan,
    Occupancy,
    _cbool,
    _cdiv,
    _next_pow2,
    max_pack,
)

GRAD_OPS = ("softmax_backward", "log_softmax_backward")
#: Paths :func:`plan_grad` may be forced onto (``cunorm._dispatch.force_path``).
GRAD_PATHS = ("warp", "block", "cluster", "uncached")
#: Threads of a warp-path block (128 / GROUP rows at a time).
GRAD_WARP_BLOCK = 128
#: Bytes of each of y and dy one lane of the warp path holds, in at most GRAD_WARP_MAX_PACKS
#: packs (4 packs of 16 bytes: 16-bit rows of up to 1024 columns, float32 512, float64 256).
#: H200, one process, softmax_backward GB/s (49152 rows; benchmarks/results/
#: nvidia-h200-2026-11-29-session76-grad-profile.txt): 8 packs a lane (96 registers) against
#: the block path's 128 threads of 2 packs, float16 2048 cols 4167 -> 4185, float32 1024
#: 4154 -> 4212; float16 1024 on 2 packs a lane lost 1.5% (3972 -> 3917).
GRAD_WARP_MAX_BYTES = 64
GRAD_WARP_MAX_PACKS = 4
#: Packs a lane holds before a row takes more lanes (up to 32).
GRAD_WARP_LANE_PACKS = 1
#: The block path: GRAD_BLOCK_TARGET_PACKS packs of each operand a thread, on as many threads
#: as that takes (a multiple of 32, at least GRAD_BLOCK_MIN_THREADS), at most
#: GRAD_BLOCK_MAX_PACKS past 1024 threads (1024-thread blocks have 64 registers a thread; 4
#: packs of y and of dy take 32). 16-byte packs: 16-bit rows of up to 32768 columns, float32
#: 16384, float64 8192. Smaller blocks of 4 packs a thread fit more of them an SM: H200, one
#: process, 2 -> 4 packs, softmax_backward GB/s (session 76 record): float16 12288 cols 3776
#: -> 4298 (768 -> 384 threads), 16384 4137 -> 4282, 4096 4246 -> 4270; float32 8192 3853 ->
#: 4283, 4096 4174 -> 4280, 2048 4208 -> 4260; 3 packs lay between or below.
GRAD_BLOCK_MIN_THREADS = 128
GRAD_BLOCK_MAX_THREADS = 1024
GRAD_BLOCK_TARGET_PACKS = 4
GRAD_BLOCK_MAX_PACKS = 4
#: The uncached path: threads of a block, and packs of each operand a thread has in flight.
#: Under the kernel's 64-register bound (grad.cu), 4 packs of 16 bytes spilled: 512 x 4
#: moved float16 65536 cols at 1627 GB/s, 1024 x 2 at 3248 (unbounded 512 x 4, 100 registers:
#: 3226), float32 32768 at 1885 -> 2977 (unbounded 3061), 131072 1908 -> 2602 (2572); 512 x 2
#: and 256 x 2 ran 1-20% below 1024 x 2 (same record).
GRAD_UNCACHED_BLOCK = 1024
GRAD_UNCACHED_PACKS = 2
#: Most blocks a grid launches, in waves of the resident blocks (rows beyond it loop).
GRAD_WAVES = 32
#: The cluster path (sm_90, grad.cu softmax_grad_cluster): a row is split over the smallest
#: cluster of GRAD_CLUSTER_SIZES blocks whose slices take at most the threads of the first
#: (packs a thread, threads) layout of GRAD_CLUSTER_LAYOUTS that holds it (packs of 16
#: bytes), so it is read once; the blocks' row sums meet through distributed shared memory.
#: Unforced, it takes rows no block holds of the dtypes of GRAD_CLUSTER_DTYPES (float64 is
#: not measured) from GRAD_CLUSTER_FROM[op] columns, on at most GRAD_CLUSTER_MAX_PACKS packs a
#: thread ((op, itemsize); else any layout). H200, one process, GB/s (49152 rows, then
#: 3072 of 65536 columns, 1536 of 131072, 768 of 262144; benchmarks/results/
#: nvidia-h200-2026-11-29-session81-grad-profile.txt), read twice -> cluster:
#: softmax_backward float16 65536 3118 -> 3787, 131072 2516 -> 3791, float32 32768 2942 ->
#: 3789, 65536 2579 -> 3330, 131072 2549 -> 3662 (four packs, no prefetch; grad.cu);
#: log_softmax_backward float16 131072 3186 -> 3405, 262144 3100 -> 3697, float32 131072
#: 3122 -> 3575. Not taken: softmax_backward float16 262144 (four packs: 2517 -> 2364),
#: log_softmax_backward below 131072 columns (float32 32768 3674 -> 3511, 65536 3210 ->
#: 3082, float16 65536 3648 -> 3704: its first read takes dy alone, which the L2 keeps for
#: the second), float16 32768 (1024-thread blocks: 3869 -> 3714). Four packs a thread from
#: the start ran 0.82-0.84x of two on float16 and float32 rows of 32768-131072 columns, one
#: 0.58-0.94x.
GRAD_CLUSTER_SIZES = CLUSTER_SIZES
GRAD_CLUSTER_LAYOUTS = ((2, 512), (2, 1024), (4, 1024))
GRAD_CLUSTER_DTYPES = ("float16", "bfloat16", "float32")
GRAD_CLUSTER_FROM = {"softmax_backward": 1, "log_softmax_backward": 131072}
GRAD_CLUSTER_MAX_PACKS = {("softmax_backward", 2): 2}


#: ``clusters(kernel, cluster, block, smem)``: how many clusters of ``cluster`` blocks of the
#: kernel the device runs at once (the driver's ``cuOccupancyMaxActiveClusters``, which
#: knows how the SMs are grouped).
ClusterOccupancy = Callable[[str, int, int, int], int]


def grad_kernel(op: str, dtype: str, pack: int, bound: int, group: int, packs: int,
                hold: bool) -> str:
    """NVRTC name of the ``softmax_grad`` instantiation (``cuda_src/grad.cu``): ``bound``
    threads a block at most, ``group`` threads a row (0: the whole block)."""
    log = _cbool(op == "log_softmax_backward")
    return (f"cunorm::softmax_grad<{CTYPE[dtype]}, {log}, {pack}, {bound}, {group}, {packs}, "
            f"{_cbool(hold)}>")


def grad_cluster_kernel(op: str, dtype: str, pack: int, bound: int, packs: int,
                        cluster: int) -> str:
    """NVRTC name of the ``softmax_grad_cluster`` instantiation (``cuda_src/grad.cu``)."""
    log = _cbool(op == "log_softmax_backward")
    return (f"cunorm::softmax_grad_cluster<{CTYPE[dtype]}, {log}, {pack}, {bound}, {packs}, "
            f"{cluster}>")


def _round_up(n: int, multiple: int) -> int:
    return _cdiv(n, multiple) * multiple


def grad_config(path: str, cols: int, pack: int,
                itemsize: int) -> tuple[int, int, int, int] | None:
    """(block threads, the kernel's bound on them, threads a row (0: the block), packs a
    thread) of ``path`` for rows of ``cols`` columns in packs of ``pack`` elements, or None
    where the path cannot hold the row."""
    npacks = cols // pack
    if path == "warp":
        most = min(GRAD_WARP_MAX_PACKS, GRAD_WARP_MAX_BYTES // (pack * itemsize))
        if npacks > 32 * most:
            return None
        group = min(32, _next_pow2(_cdiv(npacks, GRAD_WARP_LANE_PACKS)))
        return GRAD_WARP_BLOCK, GRAD_WARP_BLOCK, group, _cdiv(npacks, group)
    if path == "block":
        per_thread = max(GRAD_BLOCK_TARGET_PACKS, _cdiv(npacks, GRAD_BLOCK_MAX_THREADS))
        if per_thread > GRAD_BLOCK_MAX_PACKS:
            return None
        threads = max(_round_up(_cdiv(npacks, per_thread), 32), GRAD_BLOCK_MIN_THREADS)
        return threads, GRAD_BLOCK_MAX_THREADS, 0, _cdiv(npacks, threads)
    if path == "cluster":
        cfg = grad_cluster_config(cols, pack, itemsize)
        return None if cfg is None else cfg[:4]
    if path == "uncached":
        return GRAD_UNCACHED_BLOCK, GRAD_UNCACHED_BLOCK, 0, GRAD_UNCACHED_PACKS
    raise ValueError(f"unknown path {path!r} for the softmax gradients; expected one of "
                     f"{GRAD_PATHS}")


def grad_cluster_config(cols: int, pack: int,
                        itemsize: int) -> tuple[int, int, int, int, int] | None:
    """(block threads, the kernel's bound on them, 0, packs a thread, blocks a cluster) of
    the softmax gradients' cluster path for rows of ``cols`` columns in packs of ``pack``
    elements, or None where no cluster of GRAD_CLUSTER_SIZES holds the row (or its packs are
    narrower than 16 bytes). The kernel is bound to GRAD_BLOCK_MAX_THREADS threads (64
    registers), as the block path's are."""
    layout = _cluster_layout(cols // pack, pack * itemsize, GRAD_CLUSTER_LAYOUTS,
                             GRAD_CLUSTER_SIZES)
    if layout is None:
        return None
    threads, packs, cluster = layout
    return threads, GRAD_BLOCK_MAX_THREADS, 0, packs, cluster


def _cluster_layout(npacks: int, pack_bytes: int, layouts: tuple[tuple[int, int], ...],
                    sizes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(block threads, packs a thread, blocks a cluster) of the smallest cluster of ``sizes``
    blocks whose slices of ``npacks`` packs take at most ``threads`` threads of ``per`` packs,
    for the first (``per``, ``threads``) of ``layouts`` that has one; None if none has (or
    for packs narrower than 16 bytes)."""
    if pack_bytes != 16:
        return None
    for per, most in layouts:
        for cluster in sizes:
            threads = _round_up(_cdiv(_cdiv(npacks, cluster), per), 32)
            if threads <= most:
                return threads, _cdiv(_cdiv(npacks, cluster), threads), cluster
    return None


def _check_plan_args(op: str, ops: tuple[str, ...], dtype: str, rows: int, cols: int,
                     force: str | None, props: DeviceProps,
                     paths: tuple[str, ...] = GRAD_PATHS) -> None:
    """The checks both planners make of their arguments (``ops``: the planner's ops,
    ``paths``: its paths; a forced cluster path needs sm_90)."""
    if op not in ops:
        raise ValueError(f"unknown op {op!r}; expected one of {ops}")
    if dtype not in CTYPE:
        raise ValueError(f"no {op} kernel for {dtype}; expected one of {tuple(CTYPE)}")
    if rows < 1 or cols < 1:
        raise ValueError(f"{op}: nothing to plan for ({rows}, {cols})")
    if force is not None and force not in paths:
        raise ValueError(f"{op} has no {force!r} path; expected one of {paths}")
    if force == "cluster" and not props.has_clusters:
        raise ValueError(f"{op}: path 'cluster' needs sm_90 or newer; device is sm_{props.arch}")


def plan_grad(op: str, dtype: str, rows: int, cols: int, align_elems: int,
              props: DeviceProps, occ: Occupancy, force: str | None = None,
              clusters: ClusterOccupancy | None = None) -> LaunchPlan:
    """Launch plan of ``op`` (``"softmax_backward"`` or ``"log_softmax_backward"``) over
    ``rows`` rows of ``cols`` columns of ``dtype`` (y, dy and dx alike).

    Parameters
    ----------
    align_elems : int
        Alignment, in elements, that every pointer and row stride allows (a power of two):
        the pack is the widest one dividing it and ``cols``, at most 16 bytes.
    props, occ
        The device and its occupancy oracle (``occ(kernel, block, smem)``), as for
        :func:`cunorm._dispatch.plan_rows`.
    force : str, optional
        ``"warp"``, ``"block"``, ``"cluster"`` (sm_90) or ``"uncached"``; ``ValueError`` if
        the row does not fit it.
    clusters : callable, optional
        ``clusters(kernel, cluster, block, smem)``: the clusters the device runs at once,
        which sizes a cluster path's grid (one wave); without it the grid takes
        ``props.sm_count * occ(...) // cluster`` clusters.

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h200 = DeviceProps("fake", (9, 0), 132, 2048, 232448, 233472, 60 << 20)
    >>> plan_grad("softmax_backward", "float16", 4096, 1024, 8, h200,
    ...           lambda kernel, block, smem: 8).kernel
    'cunorm::softmax_grad<cunorm::half_t, false, 8, 128, 32, 4, true>'
    >>> plan_grad("softmax_backward", "float16", 4096, 65536, 8, h200,
    ...           lambda kernel, block, smem: 4).kernel
    'cunorm::softmax_grad_cluster<cunorm::half_t, false, 8, 1024, 2, 8>'
    """
    _check_plan_args(op, GRAD_OPS, dtype, rows, cols, force, props)
    itemsize = ITEMSIZE[dtype]
    pack = max_pack(cols, itemsize, align_elems)
    layout = grad_cluster_config(cols, pack, itemsize)  # (None: no cluster holds the row)
    clustered = (props.has_clusters and dtype in GRAD_CLUSTER_DTYPES
                 and cols >= GRAD_CLUSTER_FROM[op] and _cluster_packs_allowed(op, itemsize,
                                                                              layout))
    cfg = None
    for path in (force,) if force else GRAD_PATHS:
        if force or path != "cluster" or clustered:
            cfg = grad_config(path, cols, pack, itemsize)
        if cfg is not None:
            break
    if cfg is None:
        raise ValueError(f"{op}: rows of {cols} columns do not fit the {force!r} path")
    block, bound, group, packs = cfg
    if path == "cluster":
        cluster = layout[4]
        name = grad_cluster_kernel(op, dtype, pack, bound, packs, cluster)
        grid = _cluster_grid(op, cols, name, cluster, block, 0, rows, props, occ, clusters,
                             force)
        if grid is None:
            return plan_grad(op, dtype, rows, cols, align_elems, props, occ, "uncached")
        return LaunchPlan(path, name, grid, block, 0)
    name = grad_kernel(op, dtype, pack, bound, group, packs, path != "uncached")
    per_sm = max(1, occ(name, block, 0))
    row_blocks = _cdiv(rows, _rows_a_block(block, group))
    grid = max(1, min(row_blocks, props.sm_count * per_sm * GRAD_WAVES, MAX_GRID))
    return LaunchPlan(path, name, grid, block, 0)


def _cluster_grid(op: str, cols: int, name: str, cluster: int, block: int, smem: int,
                  rows: int, props: DeviceProps, occ: Occupancy,
                  clusters: ClusterOccupancy | None, force: str | None) -> int | None:
    """Blocks of a cluster path's grid: one wave of clusters (the driver's count where
    ``clusters`` gives it), each looping over rows, at most one a row. None where the device
    runs no such cluster (the caller reads the row twice instead); ``ValueError`` there if the
    path was forced."""
    resident = (clusters(name, cluster, block, smem) if clusters is not None
                else props.sm_count * max(1, occ(name, block, smem)) // cluster)
    if resident < 1:
        if force:
            raise ValueError(f"{op}: rows of {cols} columns do not fit the 'cluster' path: "
                             f"the device runs no cluster of {cluster} x {block} threads")
        return None
    return min(rows, resident, MAX_GRID // cluster) * cluster


def _cluster_packs_allowed(op: str, itemsize: int,
                           cfg: tuple[int, int, int, int, int] | None) -> bool:
    """Whether an unforced plan may take the cluster layout ``cfg`` (grad_cluster_config;
    None: no cluster holds the row): at most GRAD_CLUSTER_MAX_PACKS packs a thread."""
    return cfg is not None and cfg[3] <= GRAD_CLUSTER_MAX_PACKS.get((op, itemsize), cfg[3])


def all_grad_kernel_names(arch: int = 90) -> list[str]:
    """Every ``softmax_grad`` / ``softmax_grad_cluster`` instantiation :func:`plan_grad` can
    emit for compute capability ``arch``, forced paths included (the nvcc compile test,
    ``python -m cunorm.precompile``)."""
    names = set()
    for dtype, itemsize in ITEMSIZE.items():
        for op in GRAD_OPS:
            for pack in (p for p in (1, 2, 4, 8) if p * itemsize <= 16):
                for path in ("warp", "block", "uncached"):  # the cluster path's below
                    top = {"warp": 32 * GRAD_WARP_MAX_PACKS * pack,
                           "block": GRAD_BLOCK_MAX_THREADS * GRAD_BLOCK_MAX_PACKS * pack,
                           "uncached": pack}[path]
                    for cols in range(pack, top + 1, pack):
                        cfg = grad_config(path, cols, pack, itemsize)
                        if cfg is not None:
                            names.add(grad_kernel(op, dtype, pack, *cfg[1:], path != "uncached"))
            pack = 16 // itemsize
            top = GRAD_CLUSTER_SIZES[-1] * max(p * t for p, t in GRAD_CLUSTER_LAYOUTS) * pack
            for cols in range(pack, top + 1, pack) if arch >= 90 else ():
                cfg = grad_cluster_config(cols, pack, itemsize)
                if cfg is not None:
                    block, bound, _, packs, cluster = cfg
                    names.add(grad_cluster_kernel(op, dtype, pack, bound, packs, cluster))
    return sorted(names)


# --- layer_norm / rms_norm gradients ------------------------------------------------------
NORM_GRAD_OPS = ("layer_norm_backward", "rms_norm_backward")
#: Paths :func:`plan_norm_grad` may be forced onto: the softmax gradients' and, on sm_90,
#: ``cluster`` (a row held by the blocks of a thread-block cluster).
NORM_GRAD_PATHS = ("warp", "block", "cluster", "uncached")
#: Threads of a block whose rows take 1-256 threads each (NORM_GRAD_BLOCK / group rows a block
#: at a time). One partial row of column sums is written a block, so the bigger the block,
#: the fewer partial rows norm_grad_cols adds up.
NORM_GRAD_BLOCK = 512
#: Packs of x and of dy a thread of a holding path takes (as many threads as that needs); a
#: thread also keeps the column sums of its elements (two values each for layer_norm): 2, or 1
#: for 16-bit rows of at most NORM_GRAD_SHORT_PACKS packs. H200, one process, GB/s of x, dy
#: and dx, 49152 rows, 1 -> 2 packs (benchmarks/results/
#: nvidia-h200-2026-11-29-session77-norm-grad-profile.txt): rms_norm float16 2048 cols 3557
#: -> 3808, 4096 3094 -> 3916, 8192 2795 -> 3946, float32 1024 2727 -> 3592; layer_norm
#: float16 4096 2927 -> 3058, 8192 2654 -> 2797, float32 1024 2586 -> 2853, 4096 2356 -> 2512;
#: but layer_norm float16 256 2331 -> 2131, 1024 3068 -> 2966, rms_norm float16 256 2521 ->
#: 2398 (half the rows a block at a time, and 86 registers against 64).
NORM_GRAD_PACKS = 2
NORM_GRAD_SHORT_PACKS = 128
#: Row groups past 32 threads wait on named barriers, at most 8 rows a block (grad.cu
#: row_group_sum): groups of 64-256 threads in NORM_GRAD_BLOCK-thread blocks.
NORM_GRAD_GROUP_MAX = 256
#: Whole-block rows: up to 1024 threads of one pack, or NORM_GRAD_BLOCK threads of up to
#: NORM_GRAD_BLOCK_MAX_PACKS[op] packs of 16 bytes (rms_norm: 16-bit rows of up to 16384
#: columns, float32 8192, float64 4096; layer_norm three quarters of that). With 2 packs the
#: 1024-thread kernels spilled under their 64 registers (nvcc 13, sm_90: 16-bit layer_norm
#: 112 bytes, float32 204), and layer_norm's with 4 under the 128 of 512-thread blocks
#: (float16 52 bytes, bfloat16 100, float32 40); rms_norm keeps no bias sums. Narrower packs
#: (misaligned rows) keep one a thread: two spilled float64 kernels of scalar packs.
NORM_GRAD_BLOCK_MAX_THREADS = 1024
NORM_GRAD_BLOCK_MAX_PACKS = {"layer_norm_backward": 3, "rms_norm_backward": 4}
#: Packs a thread of a 1024-thread block may take on float32 rows worked in float (not WIDE):
#: 2 (nvcc 13, sm_90: layer_norm 64 registers, rms_norm 58, no spill), for rows that need more
#: than NORM_GRAD_BLOCK threads of 2 packs. layer_norm then holds rows of up to 8192 columns,
#: which were read twice. H200, one process, GB/s, 49152 rows, 512 threads of 3-4 packs (or
#: uncached) -> 1024-thread kernels of 2 packs (benchmarks/results/
#: nvidia-h200-2026-11-29-session78-profile.txt): layer_norm 5120 3260 -> 3281, 6144 3471 ->
#: 3518, 8192 2477 -> 3920; rms_norm 6144 3432 -> 3571, 8192 3781 -> 3974. Rows of up to 512
#: threads keep the kernel bound to 512 (rms_norm 3000 3720 -> 3659 and 4096 4113 -> 4100 on
#: the 1024 bound; layer_norm's the same).
NORM_GRAD_FLOAT_BLOCK_PACKS = 2
#: Longer rows: 1024 threads read a row twice, NORM_GRAD_UNCACHED_PACKS[itemsize] packs of
#: each operand a thread at a time (two packs of float32 or float64 spilled when both worked
#: in double), and the column sums come from x and dy in a pass of their own (norm_grad_cols,
#: DIRECT). float32 kernels bound to two 1024-thread blocks an SM (32 registers) lost 4-9% on
#: layer_norm rows of 16384-32768 columns (two blocks' rows no longer stay in L2 for the second
#: read; benchmarks/results/nvidia-h200-2026-11-29-session78-profile.txt): not kept.
NORM_GRAD_UNCACHED_BLOCK = 1024
NORM_GRAD_UNCACHED_PACKS = {2: 2, 4: 1, 8: 1}
#: The cluster path (sm_90): a row is split over the smallest cluster of
#: NORM_GRAD_CLUSTER_SIZES blocks whose slices take at most NORM_GRAD_CLUSTER_THREADS[0]
#: threads (else [1]) of NORM_GRAD_CLUSTER_PACKS[op][itemsize] packs of 16 bytes (grad.cu
#: norm_grad_rows_cluster), so it is read once; the blocks' row sums meet through distributed
#: shared memory. Unforced, only rows no block holds take it, and only of the dtypes of
#: NORM_GRAD_CLUSTER_DTYPES[op] (float64 is not measured). H200, one process, GB/s of x, dy
#: and dx, 49152 rows, read twice -> cluster (two mails in turn and the L2 prefetch, grad.cu;
#: benchmarks/results/nvidia-h200-2026-11-29-session80-cluster-profile.txt):
#: rms_norm float32 16384 1985 -> 3697, 32768 1818 -> 3589, float16 32768 1975 -> 3037,
#: bfloat16 32768 1935 -> 2684; layer_norm float16 16384 1691 -> 2752, 32768 1787 -> 2675,
#: bfloat16 16384 1692 -> 2670, 32768 1774 -> 2503, float32 16384 2231 -> 2738, 32768
#: 1902 -> 2559. Rows a block holds stay on it: at 3000-8192 columns clusters ran 0.72-0.96x
#: of the block kernels with their prefetch but for 5120 columns (16-bit layer_norm 1.08x and
#: 1.15x, float32 rms_norm 1.04x; the block kernels there have 320 or 640 threads an SM).
#: float32 takes two packs a thread (16-bit one): float32 layer_norm 12288 and 24576 columns
#: ran 2891 -> 3425 and 2262 -> 3248 GB/s with two rather than one, float32 rms_norm 0.93-0.95x
#: with one (session80-prefetch-profile.txt, "packs-swapped"). Session 79's kernels, a cluster
#: barrier a row and no prefetch, gained 1.06-1.39x and lost on float32 layer_norm, whose
#: two-pack kernel then spilled 4 bytes at 64 registers (it no longer does; nvcc 13, sm_90)
#: (nvidia-h200-2026-11-29-session79-cluster-profile.txt).
NORM_GRAD_CLUSTER_SIZES = CLUSTER_SIZES
NORM_GRAD_CLUSTER_THREADS = (512, 1024)
NORM_GRAD_CLUSTER_PACKS = {"layer_norm_backward": {2: 1, 4: 2, 8: 1},
                           "rms_norm_backward": {2: 1, 4: 2, 8: 1}}
NORM_GRAD_CLUSTER_DTYPES = {"layer_norm_backward": ("float16", "bfloat16", "float32"),
                            "rms_norm_backward": ("float16", "bfloat16", "float32")}
#: A holding row kernel prefetches (grad.cu: once a row's loads are issued, a thread asks the
#: L2 for its lines of its next row) on the cluster path, and on the block path (rows of lane
#: groups of more than a warp included) where an SM holds one row at a time or fewer than
#: NORM_GRAD_PREFETCH_BELOW bytes of x and dy (resident blocks x rows a block x cols x 2 x
#: itemsize): with more in flight the SM hides DRAM latency already, and the prefetch only
#: adds requests. H200, one process, 49152 rows, GB/s with / without
#: (benchmarks/results/nvidia-h200-2026-11-29-session80-prefetch-profile.txt): below it,
#: 16-bit layer_norm 512-8192 columns 0.99-1.24x (32 KB and less), float32 3000 1.09-1.12x and
#: 16-bit rms_norm 3000 1.06-1.07x (47 KB), bfloat16 rms_norm 512 and 1024 1.04-1.07x (32 KB);
#: from it, 0.91-0.97x: float32 512-4096 and 16-bit rms_norm 2048-8192 (60-64 KB), float16
#: rms_norm 512 and 1024 (48 KB); one row an SM: float32 5120 1.11-1.16x, 8192 1.05-1.06x,
#: float16 rms_norm 16384 1.07x, but bfloat16 rms_norm 16384 0.95x. The cluster kernels
#: 1.02-1.21x (session80-cluster-profile.txt).
NORM_GRAD_PREFETCH_BELOW = 48 * 1024
#: float32 rows of fewer columns work in double (the row kernel's WIDE, cuda_src/grad.cu
#: NormGrad), longer ones in float but for the row sums: on 2-7 columns float arithmetic left
#: dx 1.7e-5 off (DESIGN's bound: 2e-6), as dx is what g keeps of its projection on 1 and
#: xhat, a small part of g on a few columns. H200, one process, GB/s of x, dy and dx, 49152
#: rows, double -> float (benchmarks/results/nvidia-h200-2026-11-29-session78-profile.txt):
#: layer_norm 256 columns 2459 -> 2955, 1024 2843 -> 3754, 4096 2520 -> 4016, rms_norm 64
#: 1690 -> 1921, 4096 2456 -> 4112 (98 -> 64 registers: two 512-thread blocks an SM).
NORM_GRAD_WIDE_BELOW = 64
#: The column kernels' blocks: 32 columns by 32 rows.
NORM_GRAD_COLS_BLOCK = (32, 32)
#: The DIRECT column pass splits the rows into chunks so that about this many blocks an SM run.
NORM_GRAD_COLS_BLOCKS_PER_SM = 4


@dataclass(frozen=True)
class NormGradPlan:
    """Launch plan of a layer_norm / rms_norm gradient: the row kernel, then the column sums.

    Attributes
    ----------
    rows : LaunchPlan
        ``norm_grad_rows`` (``norm_grad_rows_cluster`` on the cluster path): dx, and with
        ``hold`` one partial row of column sums a block (a cluster).
    hold : bool
        Whether the row kernel writes the partial rows (``partial_rows`` of them); otherwise
        ``direct`` takes the column sums from x and dy.
    direct : tuple or None
        (kernel, grid, rows a chunk): ``norm_grad_cols`` DIRECT over (column blocks, chunks).
    partial_rows : int
        Partial rows the final ``norm_grad_cols`` adds up (the row kernel's blocks or
        clusters, or the DIRECT pass's chunks).
    final : tuple
        (kernel, grid) of the final ``norm_grad_cols``.
    prefetch : bool
        Whether the row kernel asks the L2 for each next row (NORM_GRAD_PREFETCH_BELOW).
    """

    rows: LaunchPlan
    hold: bool
    direct: tuple[str, tuple[int, int], int] | None
    partial_rows: int
    final: tuple[str, tuple[int, int]]
    prefetch: bool = False


def norm_grad_rows_kernel(op: str, dtype: str, cols: int, pack: int, bound: int, group: int,
                          packs: int, hold: bool) -> str:
    """NVRTC name of the ``norm_grad_rows`` instantiation (``cuda_src/grad.cu``) for rows of
    ``cols`` columns: WIDE (arithmetic in the accumulation type) but for float32 rows of at
    least NORM_GRAD_WIDE_BELOW columns."""
    rms = _cbool(op == "rms_norm_backward")
    return (f"cunorm::norm_grad_rows<{CTYPE[dtype]}, {rms}, {pack}, {bound}, {group}, "
            f"{packs}, {_cbool(hold)}, {_wide(dtype, cols)}>")


def _wide(dtype: str, cols: int) -> str:
    """The row kernels' WIDE argument: true but for float32 rows of at least
    NORM_GRAD_WIDE_BELOW columns."""
    return _cbool(dtype != "float32" or cols < NORM_GRAD_WIDE_BELOW)


def norm_grad_cluster_kernel(op: str, dtype: str, cols: int, pack: int, bound: int,
                             packs: int, cluster: int) -> str:
    """NVRTC name of the ``norm_grad_rows_cluster`` instantiation (``cuda_src/grad.cu``)."""
    rms = _cbool(op == "rms_norm_backward")
    return (f"cunorm::norm_grad_rows_cluster<{CTYPE[dtype]}, {rms}, {pack}, {bound}, {packs}, "
            f"{_wide(dtype, cols)}, {cluster}>")


def norm_grad_cols_kernel(op: str, dtype: str, direct: bool) -> str:
    """NVRTC name of the ``norm_grad_cols`` instantiation (``cuda_src/grad.cu``)."""
    rms = _cbool(op == "rms_norm_backward")
    return f"cunorm::norm_grad_cols<{CTYPE[dtype]}, {rms}, {_cbool(direct)}>"


def norm_grad_config(path: str, op: str, cols: int, pack: int,
                     itemsize: int) -> tuple[int, int, int, int] | None:
    """(block threads, the kernel's bound on them, threads a row (0: the block), packs a
    thread) of ``op``'s ``path`` for rows of ``cols`` columns in packs of ``pack`` elements
    of ``itemsize`` bytes, or None where the path cannot hold the row."""
    npacks = cols // pack
    wide = pack * itemsize == 16
    per = NORM_GRAD_PACKS if wide and not (
        itemsize == 2 and npacks <= NORM_GRAD_SHORT_PACKS) else 1
    most = NORM_GRAD_BLOCK_MAX_PACKS[op] if wide else 1
    if path == "warp":
        if npacks > 32 * per:
            return None
        group = _next_pow2(_cdiv(npacks, per))
        return NORM_GRAD_BLOCK, NORM_GRAD_BLOCK, group, _cdiv(npacks, group)
    if path == "block":
        if npacks <= NORM_GRAD_GROUP_MAX * per:
            group = max(64, _next_pow2(_cdiv(npacks, per)))
            return NORM_GRAD_BLOCK, NORM_GRAD_BLOCK, group, _cdiv(npacks, group)
        full = (NORM_GRAD_FLOAT_BLOCK_PACKS if itemsize == 4 and cols >= NORM_GRAD_WIDE_BELOW
                else 1)  # packs a thread of a 1024-thread block
        packs = max(per, _cdiv(npacks, NORM_GRAD_BLOCK_MAX_THREADS))
        if packs > full:  # NORM_GRAD_BLOCK threads at most (128 registers each)
            packs = max(packs, _cdiv(npacks, NORM_GRAD_BLOCK))
        if packs > most:
            return None
        threads = _round_up(_cdiv(npacks, packs), 32)
        wide_block = packs == 1 or (packs <= full and threads > NORM_GRAD_BLOCK)
        return threads, NORM_GRAD_BLOCK_MAX_THREADS if wide_block else NORM_GRAD_BLOCK, 0, packs
    if path == "cluster":
        cfg = norm_grad_cluster_config(op, cols, pack, itemsize)
        return None if cfg is None else cfg[:4]
    if path == "uncached":
        return (NORM_GRAD_UNCACHED_BLOCK, NORM_GRAD_UNCACHED_BLOCK, 0,
                NORM_GRAD_UNCACHED_PACKS[itemsize])
    raise ValueError(f"unknown path {path!r} for the norm gradients; expected one of "
                     f"{NORM_GRAD_PATHS}")


def norm_grad_cluster_config(op: str, cols: int, pack: int,
                             itemsize: int) -> tuple[int, int, int, int, int] | None:
    """(block threads, the kernel's bound on them, 0, packs a thread, blocks a cluster) of
    the cluster path for rows of ``cols`` columns in packs of ``pack`` elements, or None
    where no cluster of NORM_GRAD_CLUSTER_SIZES holds the row (or its packs are narrower
    than 16 bytes)."""
    per = NORM_GRAD_CLUSTER_PACKS[op][itemsize]
    layout = _cluster_layout(cols // pack, pack * itemsize,
                             tuple((per, most) for most in NORM_GRAD_CLUSTER_THREADS),
                             NORM_GRAD_CLUSTER_SIZES)
    if layout is None:
        return None
    threads, packs, cluster = layout
    bound = NORM_GRAD_BLOCK if threads <= NORM_GRAD_BLOCK else NORM_GRAD_BLOCK_MAX_THREADS
    return threads, bound, 0, packs, cluster


def _rows_a_block(block: int, group: int) -> int:
    """Rows a block of ``block`` threads takes at a time: one a lane group of ``group``
    threads (0: the whole block takes one)."""
    return block // group if group else 1


def norm_grad_stage_bytes(cols: int, block: int, group: int, itemsize: int) -> int:
    """Dynamic shared memory of a holding row kernel: the column sums of its rows, staged to
    be added in order (none for a block of one row)."""
    rows = _rows_a_block(block, group)
    return rows * cols * _acc_size(itemsize) if rows > 1 else 0


def _acc_size(itemsize: int) -> int:
    """Bytes of the staged column sums' type (grad.cu NormGrad P): float for 16-bit rows,
    double otherwise."""
    return 4 if itemsize == 2 else 8


def plan_norm_grad(op: str, dtype: str, rows: int, cols: int, align_elems: int,
                   props: DeviceProps, occ: Occupancy, force: str | None = None,
                   clusters: ClusterOccupancy | None = None) -> NormGradPlan:
    """Launch plan of ``op`` (``"layer_norm_backward"`` or ``"rms_norm_backward"``) over
    ``rows`` rows of ``cols`` columns of ``dtype`` (dy, x and dx alike); arguments as
    :func:`plan_grad`, and ``force`` may also be ``"cluster"`` (sm_90).

    ``clusters`` sizes a cluster path's grid (one wave of clusters); without it the grid
    takes ``props.sm_count * occ(...) // cluster`` clusters.

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h200 = DeviceProps("fake", (9, 0), 132, 2048, 232448, 233472, 60 << 20)
    >>> plan = plan_norm_grad("rms_norm_backward", "float16", 4096, 4096, 8, h200,
    ...                       lambda kernel, block, smem: 2)
    >>> plan.rows.kernel, plan.rows.grid, plan.partial_rows
    ('cunorm::norm_grad_rows<cunorm::half_t, true, 8, 512, 256, 2, true, true>', 264, 264)
    """
    _check_plan_args(op, NORM_GRAD_OPS, dtype, rows, cols, force, props, NORM_GRAD_PATHS)
    itemsize = ITEMSIZE[dtype]
    pack = max_pack(cols, itemsize, align_elems)
    cfg, path = None, force
    for path in (force,) if force else NORM_GRAD_PATHS:
        if path != "cluster" or (props.has_clusters and (
                force or dtype in NORM_GRAD_CLUSTER_DTYPES[op])):
            cfg = norm_grad_config(path, op, cols, pack, itemsize)
        if cfg is not None:
            break
    if cfg is None:
        raise ValueError(f"{op}: rows of {cols} columns do not fit the {force!r} path")
    block, bound, group, packs = cfg
    hold = path != "uncached"
    cluster = norm_grad_cluster_config(op, cols, pack, itemsize)[4] if path == "cluster" else 1
    name = (norm_grad_cluster_kernel(op, dtype, cols, pack, bound, packs, cluster)
            if cluster > 1 else norm_grad_rows_kernel(op, dtype, cols, pack, bound, group, packs,
                                                      hold))
    smem = norm_grad_stage_bytes(cols, block, group, itemsize) if hold else 0
    per_sm = max(1, occ(name, block, smem))
    row_blocks = _cdiv(rows, _rows_a_block(block, group))
    # Holding: one wave of resident blocks (clusters), each looping over rows (one partial row
    # a block or cluster): a cluster that waited for a second wave would double the time.
    waves = 1 if hold else GRAD_WAVES
    if cluster > 1:
        grid = _cluster_grid(op, cols, name, cluster, block, smem, rows, props, occ, clusters,
                             force)
        if grid is None:
            return plan_norm_grad(op, dtype, rows, cols, align_elems, props, occ, "uncached")
    else:
        grid = max(1, min(row_blocks, props.sm_count * per_sm * waves, MAX_GRID))
    col_blocks = _cdiv(cols, NORM_GRAD_COLS_BLOCK[0])
    direct = None
    partial_rows = grid // cluster
    if not hold:
        want = max(1, _cdiv(props.sm_count * NORM_GRAD_COLS_BLOCKS_PER_SM, col_blocks))
        chunk = _cdiv(rows, min(want, _cdiv(rows, NORM_GRAD_COLS_BLOCK[1])))
        partial_rows = _cdiv(rows, chunk)
        direct = (norm_grad_cols_kernel(op, dtype, True), (col_blocks, partial_rows), chunk)
    rows_in_flight = min(per_sm, _cdiv(grid, props.sm_count)) * _rows_a_block(block, group)
    prefetch = hold and (cluster > 1 or (group == 0 or group > 32) and (
        rows_in_flight == 1
        or rows_in_flight * cols * 2 * itemsize < NORM_GRAD_PREFETCH_BELOW))
    return NormGradPlan(LaunchPlan(path, name, grid, block, smem), hold, direct, partial_rows,
                        (norm_grad_cols_kernel(op, dtype, False), (col_blocks, 1)), prefetch)


def all_norm_grad_kernel_names(arch: int = 90) -> list[str]:
    """Every ``norm_grad_rows`` / ``norm_grad_rows_cluster`` / ``norm_grad_cols``
    instantiation :func:`plan_norm_grad` can emit for compute capability ``arch``, forced
    paths included."""
    names = set()
    for dtype, itemsize in ITEMSIZE.items():
        for op in NORM_GRAD_OPS:
            names.update(norm_grad_cols_kernel(op, dtype, d) for d in (False, True))
            for pack in (p for p in (1, 2, 4, 8) if p * itemsize <= 16):
                for path in ("warp", "block", "uncached"):  # the cluster path's below
                    top = {"warp": 32 * NORM_GRAD_PACKS * pack,
                           "block": NORM_GRAD_BLOCK_MAX_THREADS * 4 * pack,
                           "uncached": pack}[path]
                    # the uncached kernel is one for any width, WIDE or not
                    extra = (_round_up(NORM_GRAD_WIDE_BELOW, pack),) if path == "uncached" else ()
                    for cols in (*range(pack, top + 1, pack), *extra):
                        cfg = norm_grad_config(path, op, cols, pack, itemsize)
                        if cfg is not None:
                            names.add(norm_grad_rows_kernel(op, dtype, cols, pack,
                                                            *cfg[1:], path != "uncached"))
            pack = 16 // itemsize
            for cols in range(pack, 8 * NORM_GRAD_CLUSTER_THREADS[-1] * 4 * pack + 1, pack):
                cfg = norm_grad_cluster_config(op, cols, pack, itemsize) if arch >= 90 else None
                if cfg is not None:
                    block, bound, _, packs, cluster = cfg
                    names.add(norm_grad_cluster_kernel(op, dtype, cols, pack, bound, packs,
                                                       cluster))
    return sorted(names)
