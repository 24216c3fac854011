"""Pure launch planning for fused attention (``cuda_src/attention.cu``).

Like :mod:`cunorm._dispatch`, nothing here touches CuPy or a GPU: the caller passes the device
description and an occupancy oracle ``occ(kernel_name, block, dynamic_smem) -> blocks per SM``,
so every branch is unit-tested on a CPU.

A launch covers, for every (batch, KV head), the ``G * Lq`` query rows of that KV head's
``G = Hq / Hkv`` query heads, flattened (grouped-query attention shares each K/V tile across the
group). float16 / bfloat16 run on tensor cores: on compute capability 9.0 with warpgroup MMA
(``attn_wg``, sm_90a, 64 or 128 query rows per block, head dims below 64 padded to 64; for
head dims up to 128 on rows that fill the GPU, the warp-specialized ``attn_ws``: one warpgroup
loads, two compute), elsewhere, for causal rows of at most WG_CAUSAL_SHORT_KEYS keys at head
dims up to 32 and for fewer than WG_MIN_ROWS rows per KV head, with warp-level ``mma.sync``
(``attn_tc``, 64 rows);
float32 / float64 on the SIMT path (``attn_simt``, 8 rows per block). When the row tiles cannot
fill the GPU (decoding: ``Lq = 1``), the keys are split over ``splits`` blocks per row tile
(FlashDecoding) and ``attn_combine`` merges the partial results by their log-sum-exp. When
they more than fill it, ``attn_wg`` may run a persistent grid (:func:`wg_blocks`) whose
blocks take the row tiles in rounds.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from dataclasses import dataclass

from ._device import DeviceProps
from ._dispatch import CTYPE, ITEMSIZE, Occupancy, _cdiv, context_value

TC_DTYPES = ("float16", "bfloat16")
SIMT_DTYPES = ("float32", "float64")
MAX_HEAD_DIM = 256
#: warpgroup path (wgmma): query rows and threads per warpgroup; keys per tile by (head dim
#: padded to 64, warpgroups per block). ptxas (sm_90a, nvcc 13), two warpgroups: 226 registers
#: at D = 64 / BN = 128, 248 at 128 / 128, 229 at 192 / 64, 250 at 256 / 64, no spills; 256 / 128
#: spills. One-warpgroup blocks are compiled for 2 resident per SM (at most 255 registers, and
#: at most half the shared memory: BN = 64 from D = 128 on, none past D = 128): 226 registers
#: at 64 / 128, 210 at 128 / 64.
WG_ROWS = 64
WG_GROUP_THREADS = 128
WG_TILES = {(64, 2): 128, (128, 2): 128, (192, 2): 64, (256, 2): 64, (64, 1): 128, (128, 1): 64}
#: One- or two-warpgroup blocks. A block's Q and first K / V loads, first softmax and last
#: P V do not overlap its own MMAs: about 5 us a block on an H200 (ncu, bf16 D = 64, L = 512,
#: two warpgroups: 22.2k cycles a block against 13.4k for its four key tiles at the rate of
#: L = 16384), while one block per SM leaves the tensor cores idle. Two one-warpgroup blocks
#: per SM cover for each other, at twice the K / V traffic per query row. H200, bf16, 16k
#: tokens, TFLOP/s one / two warpgroups, one run (tools/gpu_profile.py attention-groups):
#: D = 64, L = 512 ... 16384: 225 / 191, 282 / 238, 318 / 268, 339 / 286, 350 / 289, 351 / 299;
#: causal: 136 / 125, 202 / 179, 260 / 226, 301 / 260, 328 / 282, 337 / 301. D = 128 (one
#: warpgroup: 64-key tiles): 274 / 277, 337 / 352, 376 / 394, 380 / 420, 389 / 426, 384 / 443;
#: causal: 191 / 179, 263 / 259, 320 / 328, 360 / 374, 382 / 404, 393 / 422. So D = 64 takes
#: one warpgroup, and D = 128 two except on causal rows of at most this many keys. (Before the
#: causal bound was masked by a per-row limit, attention.cu AttnScores::softmax_step, short
#: causal rows at D = 64 had run faster on two warpgroups: 67 / 81 at L = 512.) With persistent
#: grids (below), D = 128 causal at L = 512 / 1024: one warpgroup 201 / 268, two 196 / 278.
WG_CAUSAL_SHORT_KEYS = 512
#: Persistent attn_wg grids: one block per resident slot, taking the row tiles in rounds, each
#: tile's Q and first K / V loads issued under the previous tile's last P V and stores. For
#: head dims (padded) with the persistent loop (attention.cu kPersistent), rows of at most
#: WG_PERSISTENT_MAX_KEYS keys, and two-warpgroup blocks (alone on their SM) or causal rows
#: (many short row tiles). H200, bf16, 16k tokens, TFLOP/s a block per row tile / persistent,
#: one run (tools/gpu_profile.py attention-grids), L = 512, 1024, 2048, 4096: D = 64 one
#: warpgroup 235 / 239, 288 / 285, 322 / 319, 345 / 334; causal 134 / 149, 201 / 210,
#: 263 / 262, 306 / 304. D = 128 two warpgroups 289 / 299, 359 / 367, 400 / 411, 428 / 435;
#: causal 186 / 196, 263 / 278, 332 / 350, 360 / 396. Past 4096 keys no gain, and causal rows
#: of 16384 keys at D = 128 ran at 302 against 450 TFLOP/s: a block's row tiles come from
#: ever more heads as their lengths differ, and the K / V that blocks running together read
#: no longer stays in L2 (tools/gpu_profile.py attention-persistent).
WG_PERSISTENT_MAX_DIM = 192
WG_PERSISTENT_MAX_KEYS = 4096
#: Head dims up to this are padded to 64 on the warpgroup kernels although that doubles their
#: MMA work: at head dim 64 those kernels are bound by the softmax, not by the tensor cores, so
#: a score costs about the same at head dim 16, 32 or 64. H200, bf16, 16k tokens, hidden 2048,
#: TFLOP/s attn_tc / padded attn_ws (one process; nvidia-h200-2026-11-27-small-head-dims.txt):
#: D = 32, L = 512 ... 16384: 130 / 145, 139 / 176, 144 / 195, 146 / 205, 148 / 210, 148 / 213;
#: causal 101 / 94, 120 / 132, 132 / 164, 139 / 185, 143 / 196, 145 / 208. D = 16, L = 512,
#: 2048, 16384: 65 / 74, 71 / 101, 72 / 103; causal 51 / 47, 66 / 84, 71 / 102. Causal rows
#: of at most WG_CAUSAL_SHORT_KEYS keys stay on attn_tc, as do launches with fewer than
#: WG_MIN_ROWS query rows per KV head (decoding: 64-row tiles waste less than 128-row ones).
WG_MAX_SMALL_DIM = 32
WG_MIN_ROWS = 64
#: Warp-specialized attn_ws (sm_90a; attention.cu): a loading warpgroup keeps Q and the K / V
#: stages filled through mbarriers, and CW computing warpgroups of 64 query rows each run
#: attn_wg's loop, taking turns to issue their MMAs (ping-pong), on a persistent grid. Head dim
#: (padded) -> (keys per tile, K / V stages, CW, Q stages). H200, bf16, 16k tokens, TFLOP/s
#: attn_wg / attn_ws in one process, best of two rounds
#: (benchmarks/results/nvidia-h200-2026-11-27-warp-specialized-profile.txt, ping-pong):
#: D = 128, L = 512 ... 16384: 294 / 337, 360 / 427, 405 / 477, 436 / 506, 442 / 514,
#: 451 / 523; causal 196 / 215, 273 / 315, 346 / 405, 394 / 472, 412 / 480, 448 / 517.
#: D = 64: 235 / 247, 287 / 305, 323 / 342, 341 / 363, 345 / 374, 346 / 378; causal
#: 146 / 158, 208 / 229, 264 / 290, 303 / 332, 329 / 352, 339 / 374. So attn_ws wherever its
#: row tiles fill the SMs. At D = 64, three computing warpgroups in the ring (64-key tiles,
#: 152 registers) ran 7-25% below two, and two on 64-key tiles (2 or 4 stages) 13-24% below;
#: three K / V stages measured within 1.3% of two. A second Q stage (the next row tile's Q
#: loaded a tile ahead) gained 1-4% at D = 64 and 0-3% at D = 128 before the ping-pong; at
#: D = 128 it spilled the computing warpgroups' registers, so only D = 64 has it.
WS_TILES: dict[int, tuple[int, int, int, int]] = {64: (128, 2, 2, 2), 128: (128, 2, 2, 1)}
#: tensor-core path: query rows per block and warp row tile (4 warps x 16; x MW, see
#: tc_row_tiles_per_warp), threads, head dims compiled
TC_BLOCK_M = 64
TC_THREADS = 128
#: key split (attn_tc's KS): with at most this many query rows per KV head (decoding), the 4
#: warps share one 16-row tile and split each key tile 4 ways (16 keys each where BN = 64,
#: 32 on TC_KEY_SPLIT_TILES' 128-key tiles; not on 32-key tiles). Measured on an H200 (bf16
#: decoding, 32 / 8 heads, D = 128): at Lk = 16384 the kernel with 4 warps on 64-row tiles
#: ran at 29% of DRAM bandwidth (ncu; 12.5% occupancy,
#: 7.1 cycles per issued instruction): three warps computed on padding rows while the
#: block's one K/V tile in flight waited.
TC_KEY_SPLIT = 4
TC_KEY_SPLIT_MAX_ROWS = 16
#: K/V pipeline stages of attn_tc (ST). The key-split (decoding) kernels wait on K/V most of
#: the time, but deeper pipelines do not help: on an H200 (tools/gpu_profile.py decode-stages,
#: memo emptied between settings, each run twice in one process; bf16, 32 / 8 heads) 2, 3 and
#: 4 stages decoded within 3% of each other at Lk = 4096-131072, D = 64 and 128 (the best, 4
#: stages at D = 128, Lk = 16384: 33.3 us against 34.4-34.8; 3 and 4 stages at D = 64 slower
#: or equal). (An earlier sweep timed the first setting's kernels throughout: the call memo
#: kept them; fixed 2026-11-27.) Both stay double-buffered.
TC_STAGES = 2
TC_KEY_SPLIT_STAGES = 2
#: Short decoding rows on thread-block clusters (sm_90): where the key-split kernel (KS = 4)
#: would take at least TC_CLUSTER key splits of at most TC_CLUSTER_MAX_TILES key tiles each,
#: exactly TC_CLUSTER splits of a row tile run as one cluster (attn_tc_cluster) that merges
#: them through distributed shared memory, with no workspace and no attn_combine launch. H200,
#: Lq = 1, 32 / 8 heads, one process, cluster against workspace + attn_combine (us): Lk = 4096
#: D = 128 16.1-16.4 against 17.0-18.0, D = 64 13.1 against 14.4-14.6; Lk = 8192 D = 128
#: 22.9-23.1 against 22.7-23.7. Longer rows lost (16384: 36.0 against 32.4-33.9; 131072: 165
#: against 140): 16 splits of 8 row tiles are one block an SM, too few loads in flight
#: (benchmarks/results/nvidia-h200-2026-11-27-decode-cluster-profile.txt), at least on 64-key
#: tiles: the 128-key key-split kernel (TC_KEY_SPLIT_TILES) runs one block an SM and is the
#: fastest there. The rule counts the 64-key kernel's tiles and slots. 0 turns it off.
TC_CLUSTER = 16
TC_CLUSTER_MAX_TILES = 4
#: K/V pipeline stages of attn_tc_cluster (4 stages lost 30% at D = 128, gained 4-10% at D = 64)
TC_CLUSTER_STAGES = 2
#: Decoding launches whose K/V tiles each have one reading block (kv_stream) read them under
#: L2 evict_first (attention.cu l2_read_once_policy) where the launch's K/V bytes are at most
#: this many times the L2: the stream then replaces its own lines and leaves L2's other lines,
#: dirty ones included, in place, instead of writing them back while it reads. bf16, Lq = 1, 32 / 8
#: heads, D = 128, the benchmark's timer (whose flush leaves L2 dirty), one process, plain ->
#: evict_first (us). H100 (50 MB L2): Lk = 4096 18.5-18.6 -> 17.6-17.7, 8192 26.9-27.9 ->
#: 25.8-26.0, 16384 42.9-43.2 -> 37.8-38.4, 32768 66.1-66.4 -> 62.2-62.4, 40960 (168 MB)
#: 76.5-77.2 -> 74.0-74.2, 49152 (201 MB) 87.5-87.7 -> 84.5-85.4, 65536 (268 MB) 109.5-110.1
#: -> 109.4-109.8, 131072 196.5-197.3 -> 201.1-201.5. H200 (50 MB): 4096 16.4 -> 15.9, 8192
#: 23.7-23.9 -> 21.5-22.7, 16384 33.2-34.6 -> 31.0-32.1, 32768 50.1-51.2 -> 48.6-49.4, 65536
#: 80.0-80.9 -> 81.5-82.8, 131072 140.0-140.2 -> 146.2-147.2. ncu on the H100 at 16384: the
#: attention kernel wrote 21.3 MB back to DRAM while it read its 67 MB, 4.8 MB under the
#: policy, and ran 31.2-31.9 us instead of 35.4-36.7. With 32 rows a KV head (Lq = 8, KS = 1)
#: on another H100: 16384 keys 44.6 -> 39.3-40.5 us, 32768 69.1-69.2 -> 64.6
#: (benchmarks/results/nvidia-h100-2026-11-28-decode-l2-policy-profile.txt).
KV_STREAM_MAX_L2 = 4
#: SIMT path: query rows per block (one warp each), keys per tile
SIMT_ROWS = 8
SIMT_THREADS = 256
SIMT_BLOCK_N = 32
SIMT_ACC_BYTES = 8  # the SIMT path stages K, V and q in double (AttnWork in attention.cu)
COMBINE_THREADS = 256
#: split-KV: at most this many splits, each at least this many key tiles
MAX_SPLITS = 128
MIN_TILES_PER_SPLIT = 2
MAX_GRID = 2**31 - 1


@dataclass(frozen=True)
class AttnPlan:
    """How to launch one attention forward.

    Attributes
    ----------
    kernel : str
        Main kernel (NVRTC name expression).
    combine : str
        Split-KV merge kernel, used when ``splits > 1``.
    grid : tuple[int, int, int]
        ``(blocks, 1, splits)``: a block per row tile (``blocks = items``), or a persistent
        grid of fewer blocks that take the row tiles in rounds (attn_wg only, ``splits = 1``).
    block : int
        Threads per block.
    smem : int
        Dynamic shared memory in bytes.
    row_tiles : int
        Row tiles per (batch, KV head).
    splits : int
        Key ranges per row tile (1: no split, the kernel writes the output directly).
    items : int
        Row tiles in all, ``row_tiles * batch * Hkv``.
    cluster : int
        Key splits of a row tile that the kernel merges itself, as one thread-block cluster
        (``attn_tc_cluster``: ``splits == cluster``, no workspace and no ``combine``); 1: none.
    kv_stream : bool
        Whether ``attn_tc`` reads K/V under L2 evict_first (:func:`kv_stream`).
    """

    kernel: str
    combine: str
    grid: tuple[int, int, int]
    block: int
    smem: int
    row_tiles: int
    splits: int
    items: int
    cluster: int = 1
    kv_stream: bool = False

    @property
    def needs_combine(self) -> bool:
        """Whether the split-KV merge (``combine``) runs after the kernel."""
        return self.splits > 1 and self.cluster == 1


_FORCED_SPLIT: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "cunorm_attn_split", default=None)
_FORCED_GROUPS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "cunorm_attn_warpgroups", default=None)
_FORCED_PERSISTENT: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "cunorm_attn_persistent", default=None)
_FORCED_WS: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "cunorm_attn_warp_specialized", default=None)
_FORCED_KV_STREAM: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "cunorm_attn_kv_stream", default=None)


@contextlib.contextmanager
def force_split(splits: int | None) -> Iterator[None]:
    """Force the split-KV count of every attention plan made inside the block (tests).

    ``1`` disables splitting; ``None`` restores the planner's choice. A count larger than the
    number of key tiles leaves some splits empty, which the merge must handle.

    Examples
    --------
    >>> with force_split(3):
    ...     pass  # cunorm.attention(q, k, v) here splits the keys three ways
    """
    if splits is not None and (not isinstance(splits, int) or not 1 <= splits <= MAX_SPLITS):
        raise ValueError(f"force_split(): splits must be an int in [1, {MAX_SPLITS}] or None, "
                         f"got {splits!r}")
    with context_value(_FORCED_SPLIT, splits):
        yield


def forced_split() -> int | None:
    """The split count forced by the innermost :func:`force_split`, or ``None``."""
    return _FORCED_SPLIT.get()


@contextlib.contextmanager
def force_warpgroups(groups: int | None) -> Iterator[None]:
    """Force the warpgroups per block (1 or 2) of every warpgroup-MMA plan made inside the
    block (tests, measurements); head dims without a one-warpgroup kernel keep 2. ``None``
    restores the planner's choice (:func:`wg_groups`).

    Examples
    --------
    >>> with force_warpgroups(2):
    ...     pass  # cunorm.attention(q, k, v) here runs 128-row blocks on an H100 / H200
    """
    if groups not in (None, 1, 2):
        raise ValueError(f"force_warpgroups(): groups must be 1, 2 or None, got {groups!r}")
    with context_value(_FORCED_GROUPS, groups):
        yield


def forced_warpgroups() -> int | None:
    """The warpgroup count forced by the innermost :func:`force_warpgroups`, or ``None``."""
    return _FORCED_GROUPS.get()


@contextlib.contextmanager
def force_persistent(blocks: int | None) -> Iterator[None]:
    """Force the grid of every warpgroup-MMA plan made inside the block (tests, measurements):
    ``0`` a block per row tile, ``n >= 1`` a persistent grid of ``min(n, row tiles)`` blocks;
    split-KV plans and head dims without the persistent loop keep a block per row tile.
    ``None`` restores the planner's choice (:func:`wg_blocks`).

    Examples
    --------
    >>> with force_persistent(3):
    ...     pass  # cunorm.attention(q, k, v) here runs three blocks on sm_90, looping
    """
    if blocks is not None and (not isinstance(blocks, int) or isinstance(blocks, bool)
                               or blocks < 0):
        raise ValueError(f"force_persistent(): blocks must be an int >= 0 or None, got {blocks!r}")
    with context_value(_FORCED_PERSISTENT, blocks):
        yield


def forced_persistent() -> int | None:
    """The grid forced by the innermost :func:`force_persistent`, or ``None``."""
    return _FORCED_PERSISTENT.get()


def _forced_flag(var: contextvars.ContextVar, fname: str, enabled: bool | None):
    """``context_value(var, enabled)`` for a forced on / off choice, refusing anything but
    True, False or None with ``fname`` in the message."""
    if enabled is not None and not isinstance(enabled, bool):
        raise ValueError(f"{fname}(): enabled must be True, False or None, got {enabled!r}")
    return context_value(var, enabled)


@contextlib.contextmanager
def force_warp_specialized(enabled: bool | None) -> Iterator[None]:
    """Force or forbid the warp-specialized kernel (``attn_ws``) in every warpgroup-MMA plan
    made inside the block (tests, measurements): ``True`` wherever its kernel exists (head
    dims in WS_TILES, no forced split, warpgroups or grid), ``False`` never; ``None``
    restores the planner's choice (:func:`uses_ws`).

    Examples
    --------
    >>> with force_warp_specialized(False):
    ...     pass  # cunorm.attention(q, k, v) here runs attn_wg on an H100 / H200
    """
    with _forced_flag(_FORCED_WS, "force_warp_specialized", enabled):
        yield


def forced_warp_specialized() -> bool | None:
    """The choice forced by the innermost :func:`force_warp_specialized`, or ``None``."""
    return _FORCED_WS.get()


@contextlib.contextmanager
def force_kv_stream(enabled: bool | None) -> Iterator[None]:
    """Force (``True``) or forbid (``False``) the L2 evict_first reads of K/V in every plan
    made inside the block whose K/V tiles have one reader each (tests, measurements); other
    plans never take them. ``None`` restores the planner's choice (:func:`kv_stream`).

    Examples
    --------
    >>> with force_kv_stream(False):
    ...     pass  # cunorm.attention(q, k, v) here decodes with plain K/V reads
    """
    with _forced_flag(_FORCED_KV_STREAM, "force_kv_stream", enabled):
        yield


def forced_kv_stream() -> bool | None:
    """The choice forced by the innermost :func:`force_kv_stream`, or ``None``."""
    return _FORCED_KV_STREAM.get()


def forced_choices() -> tuple[int | None, int | None, int | None, bool | None, bool | None]:
    """``(forced_split(), forced_warpgroups(), forced_persistent(),
    forced_warp_specialized(), forced_kv_stream())``: part of the key of every memoized
    plan."""
    return (_FORCED_SPLIT.get(), _FORCED_GROUPS.get(), _FORCED_PERSISTENT.get(),
            _FORCED_WS.get(), _FORCED_KV_STREAM.get())


def padded_head_dim(d: int, dv: int) -> int:
    """Head dim the tensor-core kernel is compiled for: max(D, Dv) rounded up to 32."""
    return _cdiv(max(d, dv), 32) * 32


#: tensor-core tiles by padded head dim: (keys per tile BN, m16 row tiles per warp MW). MW = 2
#: feeds each K/V fragment read from shared memory to two mma, but measured no faster (H200,
#: bf16 D = 64, 16k tokens: 164-190 TFLOP/s against 163-180 with MW = 1, and causal L = 1024
#: at 68 against 135: larger row tiles waste the diagonal); it also spills from D = 128 on.
#: Every head dim runs MW = 1: BN = 64 up to D = 128, 32 beyond (registers).
TC_TILES = {32: (64, 1), 64: (64, 1), 96: (64, 1), 128: (64, 1), 160: (32, 1), 192: (32, 1),
            224: (32, 1), 256: (32, 1)}


#: keys per tile of attn_tc's key-split kernel (decoding, KS = 4; not attn_tc_cluster) on
#: sm_90, by padded head dim, where it differs from TC_TILES. Each warp takes 32 keys of a
#: tile instead of 16, so a tile's barrier, wait and softmax rescale serve twice the bytes.
#: The two stages' 131 KB leave one block an SM (16 splits for 8 KV heads, against 43-49 of
#: the 64-key kernel), and it still decodes faster. H200, bf16, 32 / 8 heads, B = 1, the
#: benchmark's timer, 3 rounds a process each, medians: Lk = 8192 21.8-22.2 -> 21.2-22.0 us,
#: 16384 31.2-31.4 -> 30.2-30.9, 32768 48.2-48.9 -> 47.5-48.3, 131072 138.6-139.3 ->
#: 137.1-137.5 (at 4096 the cluster kernel stays: 16.0 against 16.6-17.4); at D = 64 the
#: wide tile measured -1% to +2% (benchmarks/results/nvidia-h200-2026-11-28-decode-tile-
#: profile.txt). torch SDPA's cuDNN decoding kernel also takes 128-key tiles.
TC_KEY_SPLIT_TILES = {128: 128}


def tc_block_n(dp: int, ks: int = 1, arch: int = 0) -> int:
    """Keys per tile of the tensor-core kernel: TC_TILES, or on sm_90 with key split ``ks``
    > 1 TC_KEY_SPLIT_TILES where it lists ``dp`` (measured on Hopper only; other parts,
    some with less shared memory than its 131 KB, keep TC_TILES)."""
    if ks > 1 and arch == 90:
        return TC_KEY_SPLIT_TILES.get(dp, TC_TILES[dp][0])
    return TC_TILES[dp][0]


def tc_row_tiles_per_warp(dp: int) -> int:
    """m16 row tiles per warp of the tensor-core kernel (TC_TILES)."""
    return TC_TILES[dp][1]


def tc_key_split(dp: int, rows: int) -> int:
    """attn_tc's KS: TC_KEY_SPLIT for at most TC_KEY_SPLIT_MAX_ROWS query rows per KV head
    where the key tile splits into whole k16 steps (BN = 64), else 1."""
    return TC_KEY_SPLIT if rows <= TC_KEY_SPLIT_MAX_ROWS and tc_block_n(dp) == 64 else 1


def tc_block_m(dp: int, ks: int = 1) -> int:
    """Query rows per block of the tensor-core kernel: 4 warps x 16 x MW, over KS."""
    return TC_BLOCK_M * tc_row_tiles_per_warp(dp) // ks


def tc_stages(ks: int = 1) -> int:
    """K/V pipeline stages of ``attn_tc`` with key split ``ks``."""
    return TC_KEY_SPLIT_STAGES if ks > 1 else TC_STAGES


def tc_kernel(ctype: str, dp: int, ks: int = 1, arch: int = 0) -> str:
    """``attn_tc`` for padded head dim ``dp`` and key split ``ks`` on compute capability
    ``arch`` (its key tile: :func:`tc_block_n`)."""
    return (f"cunorm::attn_tc<{ctype}, {dp}, {tc_block_n(dp, ks, arch)}, "
            f"{tc_row_tiles_per_warp(dp)}, {ks}, {tc_stages(ks)}>")


def tc_cluster_kernel(ctype: str, dp: int) -> str:
    """The clustered key-split kernel (:data:`TC_CLUSTER` splits a row tile)."""
    return (f"cunorm::attn_tc_cluster<{ctype}, {dp}, {tc_block_n(dp)}, "
            f"{TC_CLUSTER_STAGES}, {TC_CLUSTER}>")


def tc_cluster(props: DeviceProps, dp: int, ks: int, splits: int, key_tiles: int) -> int:
    """Key splits a row tile of the key-split kernel runs as one cluster (:data:`TC_CLUSTER`)
    where ``splits`` of its ``key_tiles`` were planned, else 1.

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h200 = DeviceProps("H200", (9, 0), 132, 2048, 232448, 233472, 50 << 20, max_cluster=16)
    >>> tc_cluster(h200, 128, TC_KEY_SPLIT, 32, 64)  # Lk = 4096: 4 key tiles a split
    16
    >>> tc_cluster(h200, 128, TC_KEY_SPLIT, 12, 64), tc_cluster(h200, 128, TC_KEY_SPLIT, 43, 256)
    (1, 1)
    """
    if (TC_CLUSTER > 1 and props.has_clusters and props.max_cluster >= TC_CLUSTER
            and ks == TC_KEY_SPLIT and splits >= TC_CLUSTER and dp % TC_CLUSTER == 0
            and key_tiles <= TC_CLUSTER * TC_CLUSTER_MAX_TILES):
        return TC_CLUSTER
    return 1


def tc_smem(dp: int, ks: int = 1, stages: int | None = None, arch: int = 0) -> int:
    """Shared memory of ``attn_tc`` on ``arch``: the Q tile and the stages of K and V tiles
    (16-bit); ``stages`` (default :func:`tc_stages`) for ``attn_tc_cluster``, whose tiles
    are TC_TILES'."""
    stages = tc_stages(ks) if stages is None else stages
    return (tc_block_m(dp, ks) + 2 * stages * tc_block_n(dp, ks, arch)) * dp * 2


def simt_smem(d: int, dv: int, itemsize: int) -> int:
    """Shared memory of ``attn_simt``: a K tile (odd row stride), a V tile, 8 query rows."""
    ksd = d + 1 if d % 2 == 0 else d
    return (SIMT_BLOCK_N * ksd + SIMT_BLOCK_N * dv + SIMT_ROWS * d) * itemsize


def wg_head_dim(d: int, dv: int) -> int:
    """Head dim the warpgroup kernel is compiled for: max(D, Dv) rounded up to 64."""
    return _cdiv(max(d, dv), 64) * 64


def packed_args(kernel: str) -> bool:
    """Whether forward kernel ``kernel`` takes its scalar arguments as one ``AttnArgs`` struct
    (attn_tc, attn_simt: one argument; with CuPy's launcher, which converted every argument
    on each call, that cost less host time) rather than as plain
    parameters in the struct's order (attn_wg: the struct made it 2.4x slower on an H200;
    see attention.cu)."""
    return not kernel.startswith(("cunorm::attn_wg<", "cunorm::attn_ws<"))


def wg_groups(dp: int, lk: int, causal: bool, forced: int | None = None) -> int:
    """Warpgroups per block of ``attn_wg`` at head dim ``dp`` over ``lk`` keys: 1 at D = 64
    and on causal rows of at most WG_CAUSAL_SHORT_KEYS keys, else 2; ``forced`` (1 or 2)
    overrides that where the kernel exists (no one-warpgroup kernel past D = 128)."""
    if forced is None:
        forced = 1 if dp == 64 or (causal and lk <= WG_CAUSAL_SHORT_KEYS) else 2
    return forced if (dp, forced) in WG_TILES else 2


def wg_blocks(dp: int, groups: int, lk: int, causal: bool, row_blocks: int, resident: int,
              forced: int | None = None) -> int:
    """Blocks of an attn_wg launch without a key split: ``resident`` (a persistent grid) for
    more row tiles than that, head dims up to WG_PERSISTENT_MAX_DIM, rows of at most
    WG_PERSISTENT_MAX_KEYS keys and two-warpgroup blocks or causal rows; else one per row tile.
    ``forced`` as :func:`force_persistent` (head dims past WG_PERSISTENT_MAX_DIM keep one per
    row tile)."""
    if dp > WG_PERSISTENT_MAX_DIM:
        return row_blocks
    if forced is not None:
        return min(forced, row_blocks) if forced else row_blocks
    persistent = (resident < row_blocks and lk <= WG_PERSISTENT_MAX_KEYS
                  and (groups == 2 or causal))
    return resident if persistent else row_blocks


def _mask_arg(masked: bool) -> str:
    """The trailing template argument of attn_wg / attn_ws: ``, true`` builds the explicit
    mask's code in (with it compiled out, the kernels skip a division a row a tile; see
    AttnTile::head_of in attention.cu), nothing keeps the default ``false``."""
    return ", true" if masked else ""


def wg_kernel(ctype: str, dp: int, groups: int = 2, masked: bool = False) -> str:
    return f"cunorm::attn_wg<{ctype}, {dp}, {WG_TILES[dp, groups]}, {groups}{_mask_arg(masked)}>"


def wg_smem(dp: int, groups: int = 2) -> int:
    """Shared memory of ``attn_wg``: the Q tile and two stages of K and V tiles (16-bit), plus
    1 KB to align them to the 1024-byte period of wgmma's 128-byte swizzle."""
    return (WG_ROWS * groups + 4 * WG_TILES[dp, groups]) * dp * 2 + 1024


def uses_ws(dp: int, rows: int, heads: int, sm_count: int) -> bool:
    """Whether a warpgroup-MMA launch at padded head dim ``dp`` runs on ``attn_ws``: a kernel
    exists for ``dp``, nothing else is forced (:func:`force_split`, :func:`force_warpgroups`,
    :func:`force_persistent`), and, unless :func:`force_warp_specialized` says, its row tiles
    (``rows`` query rows for each of ``heads`` (batch, KV head) pairs, :func:`ws_rows` rows a
    tile) fill ``sm_count`` SMs without a key split."""
    if dp not in WS_TILES or any(c is not None for c in forced_choices()[:3]):
        return False
    forced = forced_warp_specialized()
    if forced is not None:
        return forced
    return _cdiv(rows, ws_rows(dp)) * heads >= sm_count


def ws_kernel(ctype: str, dp: int, masked: bool = False) -> str:
    tiles = ", ".join(map(str, WS_TILES[dp]))
    return f"cunorm::attn_ws<{ctype}, {dp}, {tiles}{_mask_arg(masked)}>"


def ws_rows(dp: int) -> int:
    """Query rows of an ``attn_ws`` block: 64 a computing warpgroup."""
    return WG_ROWS * WS_TILES[dp][2]


def ws_threads(dp: int) -> int:
    """Threads of an ``attn_ws`` block: the loading warpgroup and the computing ones."""
    return WG_GROUP_THREADS * (WS_TILES[dp][2] + 1)


def ws_smem(dp: int) -> int:
    """Shared memory of ``attn_ws``: the Q stages, the K and V stages, the 1 KB swizzle
    alignment and the mbarriers (two a Q stage, four a K / V stage)."""
    bn, stages, _, q_stages = WS_TILES[dp]
    return ((q_stages * ws_rows(dp) + 2 * stages * bn) * dp * 2 + 1024
            + 8 * (2 * q_stages + 4 * stages))


def uses_wgmma(dtype: str, d: int, dv: int, rows: int, arch: int,
               scale_positive: bool = True, causal: bool = False, lk: int = 0) -> bool:
    """Whether a launch runs on the warpgroup kernel: a 16-bit dtype on compute capability 9.0
    (sm_90a; ``_kernels.ARCH_SPECIFIC_SOURCES``), at least WG_MIN_ROWS query rows per KV head,
    a positive scale, and not a small head dim (at most WG_MAX_SMALL_DIM) on causal rows of
    at most WG_CAUSAL_SHORT_KEYS keys (``lk``). The warpgroup kernels fold the scale into the
    exponent after taking the row max of the unscaled scores (``AttnScores::softmax_step``'s
    FOLD), which holds for a positive scale only; a zero or negative one runs on
    ``attn_tc``."""
    short_causal_small = (max(d, dv) <= WG_MAX_SMALL_DIM and causal
                          and lk <= WG_CAUSAL_SHORT_KEYS)
    return (arch == 90 and dtype in TC_DTYPES and rows >= WG_MIN_ROWS and scale_positive
            and not short_causal_small)


def kv_stream(one_reader: bool, kv_bytes: int, l2_bytes: int) -> bool:
    """Whether a launch reads its ``kv_bytes`` of K/V under L2 evict_first: where each K/V
    tile has ``one_reader`` (``attn_tc`` or ``attn_tc_cluster`` with tiles of 64 keys or more
    on one row tile a batch and KV head: decoding rows, every key split of which one block
    reads), up to :data:`KV_STREAM_MAX_L2` times the L2, unless :func:`force_kv_stream` says
    otherwise.

    Examples
    --------
    >>> l2 = 50 << 20
    >>> kv_stream(True, 67 << 20, l2), kv_stream(True, 268 << 20, l2)  # Lk = 16384, 65536
    (True, False)
    >>> kv_stream(False, 1 << 20, l2)  # row tiles that share their K/V tiles
    False
    """
    if not one_reader:
        return False
    forced = _FORCED_KV_STREAM.get()
    return kv_bytes <= KV_STREAM_MAX_L2 * l2_bytes if forced is None else forced


# (cached: a KV cache that grows by a key a call plans a new Lk every call, and the search
# below was 3/4 of the planner's time, ~30 us on an H200's host)
@functools.lru_cache(maxsize=1024)
def choose_splits(row_blocks: int, key_tiles: int, resident: int) -> int:
    """Split-KV count: enough blocks to fill ``resident`` slots (SMs x blocks per SM) when
    the row tiles alone cannot, with at least MIN_TILES_PER_SPLIT key tiles per split.

    A block's time is about its key tiles (one in flight at a time), so the launch takes
    waves x tiles per block, ``ceil(row_blocks * s / resident) * ceil(key_tiles / s)``: the
    fewest splits ``s``, up to one wave's worth, that minimize it. Rounding the splits up to
    fill every slot instead left a second wave of a few blocks that ran alone: on an H200
    (bf16 decoding, 8 KV heads, Lk = 131072, 396 slots) 50 splits took 172 us, 49 took 142.
    """
    if row_blocks >= resident or key_tiles < 2 * MIN_TILES_PER_SPLIT:
        return 1
    most = max(1, min(key_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS, _cdiv(resident, row_blocks)))

    def cost(s: int) -> int:
        return _cdiv(row_blocks * s, resident) * _cdiv(key_tiles, s)

    return min(range(1, most + 1), key=lambda s: (cost(s), s))


def plan_attention(dtype: str, d: int, dv: int, lq: int, lk: int, batch: int, hkv: int,
                   group: int, props: DeviceProps, occ: Occupancy,
                   splits: int | None = None, causal: bool = False,
                   masked: bool = False, scale_positive: bool = True) -> AttnPlan:
    """Plan an attention forward.

    Parameters
    ----------
    dtype : str
        ``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"`` (q, k, v and out).
    d, dv : int
        Head dims of q/k and of v (1 to 256).
    lq, lk : int
        Query and key lengths (>= 1).
    batch, hkv, group : int
        Batch (leading dims collapsed), KV heads, query heads per KV head.
    props : DeviceProps
        Target device.
    occ : Occupancy
        Occupancy oracle.
    splits : int, optional
        Force the split-KV count (default: :func:`forced_split`, else the planner's choice).
    causal : bool
        Whether the launch applies the causal mask (it picks the warpgroups per block,
        :func:`wg_groups`).
    masked : bool
        Whether the launch has an explicit mask: the warpgroup kernels are built with or
        without its code (:func:`wg_kernel`, :func:`ws_kernel`).
    scale_positive : bool
        Whether the launch's scale is above 0 (else no warpgroup kernel: :func:`uses_wgmma`).

    Returns
    -------
    AttnPlan

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h100 = DeviceProps("fake", (9, 0), 132, 2048, 232448, 233472, 50 << 20)
    >>> p = plan_attention("bfloat16", 128, 128, 4096, 4096, 4, 16, 1, h100, lambda k, b, s: 1)
    >>> p.kernel, p.items, p.grid, p.splits, p.block  # 2048 row tiles on a persistent grid
    ('cunorm::attn_ws<cunorm::bf16_t, 128, 128, 2, 2, 1>', 2048, (132, 1, 1), 1, 384)
    >>> plan_attention("bfloat16", 64, 64, 1024, 1024, 16, 32, 1, h100, lambda k, b, s: 2).kernel
    'cunorm::attn_ws<cunorm::bf16_t, 64, 128, 2, 2, 2>'
    >>> plan_attention("bfloat16", 64, 64, 1024, 1024, 1, 8, 1, h100, lambda k, b, s: 2).kernel
    'cunorm::attn_wg<cunorm::bf16_t, 64, 128, 1>'
    >>> plan_attention("bfloat16", 128, 128, 1, 65536, 1, 8, 4, h100, lambda k, b, s: 2).splits
    32
    >>> plan_attention("bfloat16", 64, 64, 1024, 1024, 16, 32, 1, h100, lambda k, b, s: 2,
    ...                masked=True).kernel
    'cunorm::attn_ws<cunorm::bf16_t, 64, 128, 2, 2, 2, true>'
    """
    if dtype not in CTYPE:
        raise ValueError(f"no attention kernel for {dtype}; expected one of {tuple(CTYPE)}")
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        raise ValueError(f"head dims must be in [1, {MAX_HEAD_DIM}], got D={d}, Dv={dv}")
    if min(lq, lk, batch, hkv, group) < 1:
        raise ValueError("attention plan needs lq, lk, batch, hkv and group >= 1")
    ctype = CTYPE[dtype]
    rows = group * lq
    ws = False
    if uses_wgmma(dtype, d, dv, rows, props.arch, scale_positive, causal, lk):
        dp = wg_head_dim(d, dv)
        ws = splits is None and uses_ws(dp, rows, batch * hkv, props.sm_count)
        groups = wg_groups(dp, lk, causal, forced_warpgroups())
        bn = WG_TILES[dp, groups]
        kernel = wg_kernel(ctype, dp, groups, masked)
        smem, threads, bm = wg_smem(dp, groups), WG_GROUP_THREADS * groups, WG_ROWS * groups
        if ws:
            kernel, smem = ws_kernel(ctype, dp, masked), ws_smem(dp)
            threads, bm = ws_threads(dp), ws_rows(dp)
    elif dtype in TC_DTYPES:
        dp = padded_head_dim(d, dv)
        bn = tc_block_n(dp)
        ks = tc_key_split(dp, rows)
        kernel = tc_kernel(ctype, dp, ks)
        smem, threads, bm = tc_smem(dp, ks), TC_THREADS, tc_block_m(dp, ks)
    else:
        bn = SIMT_BLOCK_N
        kernel = f"cunorm::attn_simt<{ctype}, {_cdiv(dv, 32)}>"
        smem, threads, bm = simt_smem(d, dv, SIMT_ACC_BYTES), SIMT_THREADS, SIMT_ROWS
    if smem > props.smem_per_block_optin:
        raise ValueError(f"attention with D={d}, Dv={dv} needs {smem} bytes of shared memory "
                         f"per block; the device allows {props.smem_per_block_optin}")
    row_tiles = _cdiv(rows, bm)
    row_blocks = row_tiles * batch * hkv
    if row_blocks > MAX_GRID:
        raise ValueError(f"attention grid too large: {row_blocks} blocks")
    if splits is None:
        splits = forced_split()
    forced_splits = splits is not None
    resident = props.sm_count * max(1, occ(kernel, threads, smem))
    cluster = 1
    if ws:
        splits = 1
    if splits is None:
        splits = choose_splits(row_blocks, _cdiv(lk, bn), resident)
        if kernel.startswith("cunorm::attn_tc<"):
            cluster = tc_cluster(props, dp, ks, splits, _cdiv(lk, bn))
            if cluster > 1:
                kernel, splits = tc_cluster_kernel(ctype, dp), cluster
                smem = tc_smem(dp, ks, TC_CLUSTER_STAGES)
    if (cluster == 1 and kernel.startswith("cunorm::attn_tc<")
            and tc_block_n(dp, ks, props.arch) != bn
            and tc_smem(dp, ks, arch=props.arch) <= props.smem_per_block_optin):
        # Decoding's wider key tiles (TC_KEY_SPLIT_TILES), once the cluster rule has been
        # asked with the 64-key kernel's tiles and slots, as measured; the split count
        # follows the wide kernel's own slots (one block an SM at D = 128)
        bn = tc_block_n(dp, ks, props.arch)
        kernel, smem = tc_kernel(ctype, dp, ks, props.arch), tc_smem(dp, ks, arch=props.arch)
        if not forced_splits:
            resident = props.sm_count * max(1, occ(kernel, threads, smem))
            splits = choose_splits(row_blocks, _cdiv(lk, bn), resident)
    blocks = row_blocks
    if ws and not (causal and lk > WG_PERSISTENT_MAX_KEYS):
        # a persistent grid but for long causal rows, as attn_wg's (WG_PERSISTENT_MAX_KEYS):
        # causal D = 128, L = 16384 ran at 0.82x of attn_wg on one, 1.13x on a block per tile
        blocks = min(row_blocks, resident)
    if splits == 1 and kernel.startswith("cunorm::attn_wg"):
        blocks = wg_blocks(dp, groups, lk, causal, row_blocks, resident, forced_persistent())
    # (tiles of 64 keys or more: at head dims 160-256, 32-key tiles, D = 256 decoding
    # measured -2% to +2% with the policy on an H100, where 32 rows a KV head at D = 128
    # gained 7-12%)
    one_reader = (row_tiles == 1 and bn >= 64
                  and kernel.startswith(("cunorm::attn_tc<", "cunorm::attn_tc_cluster<")))
    stream = kv_stream(one_reader, batch * hkv * lk * (d + dv) * ITEMSIZE[dtype], props.l2_bytes)
    return AttnPlan(kernel, f"cunorm::attn_combine<{ctype}>", (blocks, 1, splits), threads,
                    smem, row_tiles, splits, row_blocks, cluster, stream)


def all_kernel_names(arch: int) -> list[str]:
    """Every attention kernel the planner can emit for compute capability ``arch`` (nvcc test,
    precompile)."""
    names = []
    for dtype in TC_DTYPES:
        ctype = CTYPE[dtype]
        names += [tc_kernel(ctype, dp) for dp in TC_TILES]
        names += [tc_kernel(ctype, dp, TC_KEY_SPLIT) for dp in TC_TILES
                  if tc_key_split(dp, 1) > 1]
        # decoding's wide key tiles; the 64-key kernel also sizes its cluster rule
        names += [tc_kernel(ctype, dp, TC_KEY_SPLIT, arch) for dp in TC_KEY_SPLIT_TILES
                  if tc_block_n(dp, TC_KEY_SPLIT, arch) != tc_block_n(dp)]
        if arch == 90:
            for masked in (False, True):
                names += [wg_kernel(ctype, dp, groups, masked) for dp, groups in WG_TILES]
                names += [ws_kernel(ctype, dp, masked) for dp in WS_TILES]
        if arch >= 90 and TC_CLUSTER > 1:
            names += [tc_cluster_kernel(ctype, dp) for dp in TC_TILES
                      if tc_key_split(dp, 1) > 1 and dp % TC_CLUSTER == 0]
    for dtype in SIMT_DTYPES:
        ctype = CTYPE[dtype]
        names += [f"cunorm::attn_simt<{ctype}, {n}>" for n in range(1, MAX_HEAD_DIM // 32 + 1)]
    names += [f"cunorm::attn_combine<{CTYPE[dt]}>" for dt in TC_DTYPES + SIMT_DTYPES]
    return names
