"""Pure launch planning: problem shape + device properties + occupancy oracle -> LaunchPlan.

Nothing here imports CuPy or touches a GPU. The caller passes the device description
(:class:`cunorm._device.DeviceProps`) and an *occupancy oracle* ``occ(kernel_name, block,
dynamic_smem) -> active blocks per SM`` (in production a thin wrapper over
``cudaOccupancyMaxActiveBlocksPerMultiprocessor``), so every branch is unit-tested on a CPU
with a fake device.

Row-wise problems are viewed as (rows, cols) with the reduced axis contiguous. The three row
paths follow OneFlow's softmax design, with thresholds re-derived for sm_90 (see the tables
below and ``benchmarks/thresholds.py``):

warp
    a group of ``GROUP`` lanes holds ``ROWS`` rows in registers;
smem
    one block per row caches the row in shared memory (raised to the opt-in limit); on sm_90 a
    long row is split over a *cluster* of blocks sharing partial results through distributed
    shared memory;
uncached
    one block per row reads the row twice (any length).

A non-last axis is viewed as (outer, dim, inner) and planned by :func:`plan_strided`.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ._device import DeviceProps

#: ``occ(kernel_name, block_threads, dynamic_smem_bytes) -> resident blocks per SM``
Occupancy = Callable[[str, int, int], int]

#: dtype name -> C++ storage type in cuda_src/common.cuh
CTYPE = {"float16": "cunorm::half_t", "bfloat16": "cunorm::bf16_t", "float32": "float",
         "float64": "double"}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

ROW_PATHS = ("warp", "block", "smem", "cluster", "uncached")
SOFTMAX_OPS = ("softmax", "log_softmax")
NORM_OPS = ("layer_norm", "rms_norm")
STRIDED_PATHS = ("strided-cached", "strided")

#: (input, output) dtype pairs with softmax kernels of their own; other ``dtype=`` requests are
#: served by casting the input up (or the result down) around one of these (see softmax.py).
#: The norms have no ``dtype=``: their output has the input's dtype.
KERNEL_DTYPE_PAIRS = (("float16", "float16"), ("float16", "float32"), ("bfloat16", "bfloat16"),
                      ("bfloat16", "float32"), ("float32", "float32"), ("float64", "float64"))

# --- thresholds -------------------------------------------------------------------------
# Largest cols handled by the warp path, by input item size. OneFlow stops at 1024 for every
# type. Measured with benchmarks/thresholds.py (table in benchmarks/results/thresholds-*.md).
WARP_MAX_COLS = {2: 1536, 4: 768, 8: 1024}
# Row values (compute type) one thread may hold in registers, by compute-type size; the
# warp kernel compiles without spills up to these (tests/test_nvcc.py checks -Xptxas -v).
WARP_MAX_VALUES_PER_THREAD = {4: 48, 8: 32}
# Values per thread are rounded up to pack * k, k from this set, to bound the number of
# instantiations (padding wastes registers, not memory traffic).
WARP_PACKS_PER_THREAD = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)
# Lane groups of the warp path, for rows of at least WARP_GROUP_MIN_PACKS full (16-byte) packs:
# the narrowest group (1 to 32 lanes) whose lanes hold at most WARP_GROUP_PACKS packs, by
# kernel family (the residual norms narrow only short rows; :func:`narrow_groups`). A group of G
# lanes holds a row, so a warp runs 32 / G rows in the same instructions and pays a row's fixed
# work (indices, shuffles, finish) once for all of them. ncu, H200, layer_norm float16
# (49152, 256): 13.5M instructions on 32-lane groups against 4.2M for torch.compile's kernel
# (4 rows a warp), 18.4 against 13.5 us. H200, 49152 rows, weight and bias, GB/s, 32-lane
# groups -> 2 packs a lane (tools/gpu_profile.py warp-groups;
# benchmarks/results/nvidia-h200-2026-11-22-rowops-profile.txt section 10):
#   layer_norm float16 128 1860 -> 2030, 256 2300 -> 2630; bfloat16 256 2210 -> 2520;
#              float32 128 2590 -> 2790; rms_norm float16 64 1290 -> 1400, 256 2570 -> 2765
#   softmax float16 256 2820 -> 2860, log_softmax float16 256 2760 -> 2860, but softmax float16
#   64 1600 -> 1480; rms_norm float32 32 / 64 lost 1-2%; layer_norm and rms_norm with a
#   residual lost 1-5% at 64-256 columns.
# Softmax narrows from 4 packs too (it took 32 until session 39), except 16-bit rows of
# exactly 8 packs (64 columns), which keep a pack a lane and two rows a group
# (WARP_GROUP_KEEP_TINY). H200, 49152 rows, GB/s, tiny-row groups -> narrowed, two rounds
# alike (benchmarks/results/nvidia-h200-2026-11-26-short-rows-profile.txt): softmax float32 64
# 2241 -> 2277, log_softmax float32 32 1435 -> 1554, 64 2155 -> 2300, float16 128 2094 ->
# 2203, bfloat16 128 2092 -> 2209, softmax float16 32 906 -> 964, float64 32 1800 -> 2081,
# log_softmax float64 16 1146 -> 1300; 16-bit rows of 64 columns lost 1-6% narrowed
# (float16 1530 -> 1446), and lost a further 3% as a pack a lane and one row a group.
WARP_GROUP_PACKS = {"norm": 2, "softmax": 2}
WARP_GROUP_MIN_PACKS = {"norm": 4, "softmax": 4}
# The residual norms narrow only rows of at most this many packs. Their 1-5% loss above was
# measured while each pack's loads waited for the previous pack's store of h; with the loads
# staged (rows.cuh fetch_packs) short rows gain. H100, 49152 rows, weight and bias, GB/s, 32-lane
# groups -> narrowed, two rounds alike (benchmarks/results/
# nvidia-h200-2026-11-26-staged-loads-profile.txt section 6): layer_norm_residual float16 32
# 1214 -> 1233, bfloat16 32 1188 -> 1229, float32 32 1767 -> 1816; rms_norm_residual float16
# 32 1188 -> 1240, bfloat16 32 1188 -> 1244, float32 32 1779 -> 1842; rows of 16 packs lost
# 0.4-1.3% (16-bit 128 columns, float32 64). H200, the same way (tools/gpu_profile.py
# residual-narrow, nvidia-h200-2026-11-26-residual-narrow-profile.txt): float16 48 1600 -> 1780,
# float32 32 2137 -> 2228 (layer_norm), 2125 -> 2247 (rms_norm); rows of 16-32 packs
# narrowed: -1.2 to +2.2%.
RESIDUAL_NARROW_MAX_PACKS = 8
#: (pack, packs a row) that keep the tiny-row groups rather than narrowed ones, by family
WARP_GROUP_KEEP_TINY = {"softmax": ((8, 8),)}
# Narrowed norm rows of exactly this many packs (16-bit 64 columns, float32 32) take a lane a
# pack and WARP_SPREAD_ROWS rows a group, instead of half the lanes holding two packs of one
# row: each lane then loads and converts its weight and bias once for all its rows (rows.cuh
# rows_warp, AffineStore store_rows). H200, 49152 rows, weight and bias, GB/s, two GPUs,
# narrowed -> spread (benchmarks/results/nvidia-h200-2026-11-23-warp-rows-profile.txt):
# layer_norm float16 64 1356 -> 1414, 1380 -> 1440; bfloat16 64 1361 -> 1409, 1394 -> 1430;
# rms_norm float16 64 1385 -> 1435, 1420 -> 1473; layer_norm float32 32 1412 -> 1518, 1440 ->
# 1530; rms_norm float32 32 1486 -> 1557. Rows of 4 packs lost 1-3% that way (float16 32
# columns), rows of 12 packs 2-8% and rows of 16 gained nothing. float64 rows (not measured)
# keep the narrowed groups. 16-bit rows took 2 rows a group until their 4-row kernels got 80
# registers (cuda_src/norm.cu norm_warp_blocks; under 64 they spilled and lost 3.5-26%): H200,
# one process, two rounds, 2 -> 4 rows, outputs bit-identical (benchmarks/results/
# nvidia-h200-2026-11-26-spread-rows-profile.txt): layer_norm float16 64 1399 -> 1478,
# bfloat16 1389 -> 1501, rms_norm float16 1456 -> 1530, bfloat16 1446 -> 1524, with a residual
# +1.3-3.8%.
WARP_SPREAD_PACKS = {"norm": (8,)}
WARP_SPREAD_ROWS = 4
# Threads per block of the warp kernels (compiled __launch_bounds__(128, n): at most 128). A
# block holds its SM slot until its last warp ends; two warps a block free it sooner than four.
# H200, GB/s, 128 -> 64 (-> 32) threads, two rounds (tools/gpu_profile.py warp-blocks,
# rowops-profile section 10e): softmax float16 1024 cols 3738 -> 3798 (3807), float32 512
# 3756 -> 3814, layer_norm float16 1024 3714 -> 3752, 512 3187 -> 3216, rms_norm bfloat16 1024
# 3718 -> 3771; rows of 32-256 cols within 1%. 32 threads lost 10-17% from 128 to 512 cols (32
# resident blocks an SM, so at most 32 warps).
WARP_BLOCK = 64
# Families whose warp kernels have an exact variant (rows.cuh rows_warp EXACT): rows of
# exactly the kernel's GROUP x COLS columns in full 16-byte packs, in a grid of a lane group per
# row group, compile their column count, its predicates and 1/cols as constants and drop the
# row loop (warp_exact). H200, 49152 rows, one process, three rounds, general -> exact
# (benchmarks/results/nvidia-h200-2026-11-27-exact-warp-profile.txt): layer_norm bfloat16 512
# cols +4.9-5.7%, float16 +1.4-1.7%, float32 +1.3%, 16-bit 32-64 +1.5-2.5%, 1024 +0.4-0.8%,
# rms_norm +0.4-2.4%, the residual forms +0.4-1.9%, softmax and log_softmax -0.7% to +4.3%
# (16-bit 32 cols). Norm rows without a residual that load their parameters with the row
# (warp_early_params) lost 2-6% in layer_norm (bfloat16 128 cols 2129 -> 1998 GB/s) and keep
# the general kernel there, but 16-bit rows of 256 columns (16 lanes of 16 values, 56
# registers against 64), H200 GPU-8c737ab1, one process, three rounds, general -> exact
# (benchmarks/results/nvidia-h200-2026-11-28-session72-ln32-early-profile.txt section 8):
# float16 2693 -> 2776 GB/s (+3.1%), bfloat16 2735 -> 2784 (+1.8%); float16 128 cols -1.9%,
# float32 64-256 -0.5% to -2.7% keep it. Those 256-column rows take the exact kernel on grids
# of at least WARP_EXACT_EARLY_SM_BLOCKS blocks an SM only (warp_exact_min_blocks). rms_norm's
# rows, whose store has no bias code (common.cuh kParamsNoBias), gained in 16-bit and float32
# and lost in float64, which keeps it too. H200,
# one process, three rounds, general -> exact (benchmarks/results/
# nvidia-h200-2026-11-27-rms-store-profile.txt): rms_norm float16 128 cols +1.3%, bfloat16
# +2.1%, 256 +0-0.4%, float32 64 +1.3%, 128-256 +0.3-0.5%, float64 64 +0.9%, 128-192 -1.1%.
WARP_EXACT_FAMILIES = ("norm", "softmax")
# Blocks an SM from which 16-bit layer_norm rows of 256 columns take the exact kernel
# (warp_exact_min_blocks): it streams faster, yet short calls lost on it, and the more the
# fewer rows. H200, one process, three rounds, exact / general (block count a grid of 64-thread
# blocks of 4 rows; benchmarks/results/nvidia-h200-2026-11-28-session73-ln256-exact-profile.txt):
# GPU-cb651390 float16 12288 rows (23 blocks an SM) 0.957, 24576 (47) 0.974, 36864 (70)
# 1.004, 49152 (93) 0.991, 73728 1.012, 98304 1.018, 147456 1.028, 196608 1.035;
# GPU-1d688dec float16 / bfloat16 24576 0.971 / 0.959, 49152 1.005 / 0.997, 196608 1.038 /
# 1.038; GPU-0ea89ee7 49152 1.022 / 1.011, 196608 1.043 / 1.039; GPU-1ec28ede 49152 0.996 /
# 0.991, 98304 1.019 / 1.016. The floor lies between the losses (47 blocks an SM and fewer)
# and the first sizes that were level (70-93): at 49152 rows, the benchmark's, the exact
# kernel measured -0.9% to +3.1% over five H200s, +0.7% on average; every GPU gained from
# 98304 rows (186 an SM). A floor of 128 would leave 49152 rows on the general kernel.
WARP_EXACT_EARLY_SM_BLOCKS = 64
# Block-register path: largest cols by input item size, and the values per thread it aims at
# (threads = cols / target, 128..512 = __launch_bounds__ of softmax_block) and allows.
BLOCK_MAX_COLS = {2: 4096, 4: 4096, 8: 0}
# Rows up to these (every op) also stay in registers when the block pads them by at most an
# eighth and holds at most BLOCK_TARGET_VALUES a thread: in full 16-byte packs those kernels are
# compiled for 3-4 resident 512-thread blocks (rows.cuh CUNORM_BLOCK_BOUNDS). H200, 8192 cols,
# one run each (tools/gpu_profile.py gaps, norm-variants): softmax float16 4191 GB/s in
# registers against 3967 in shared memory, bfloat16 4191 / 3834, float32 4191 / 3958 (Triton
# 4197, 4199, 4168); layer_norm (weight and bias) float16 3742 / 3382, bfloat16 3595 / 3246,
# rms_norm float16 3876 / 3838; at 4096 cols layer_norm bfloat16 3572 / 3329, float16 3727 /
# 3742. Padded rows lost: float32 5120 cols (512 threads x 12 values) ran at 3839 in a bench
# run, 3925 in shared memory; layer_norm float16 5120 at 3127 against 3846.
# 16-bit rows of up to 16384 cols take 1024-thread blocks (BLOCK_WIDE_THREADS) the same way.
# H200, 24576 rows, weight and bias, one run (tools/gpu_profile.py wide-blocks), 16384 cols in
# registers against shared memory: layer_norm float16 3668 / 3414 GB/s, bfloat16 3562 / 3070,
# rms_norm float16 4013 / 3849, bfloat16 3935 / 2844, softmax float16 3960 / 3938, bfloat16
# 3956 / 3898. Float32 norms gained nothing there (layer_norm 3456 / 3506, rms_norm 3921 /
# 3830), and 12288 cols in 768 x 16 lost to shared memory in most cells (layer_norm float32
# 3159 / 3716, softmax float16 3583 / 3909, rms_norm float32 3573 / 3839).
BLOCK_UNPADDED_MAX_COLS = {2: 16384, 4: 8192, 8: 0}
# The norms' own limits for any row (H200, layer_norm with weight and bias, every path forced on
# the same rows: tools/gpu_profile.py norms): float16 4096 ran at 3032 GB/s in registers and 3785
# in shared memory (2048: 3417 vs 3168), float32 8192 at 4006 in registers and 2762 in shared
# memory.
NORM_BLOCK_MAX_COLS = {2: 3072, 4: 8192, 8: 0}
BLOCK_TARGET_VALUES = 16
BLOCK_THREADS = (128, 256, 512)
# Rows in full 16-byte packs take any whole number of warps from 128 to 512 threads, so they
# need not be padded to a power of two (5120 cols: 320 x 16 values, not 512 x 12 padding a
# fifth). H200, 49152 rows, weight and bias, one run (tools/gpu_profile.py block-sizes), these
# sizes against power-of-two ones as dispatched: layer_norm float32 5120 cols 4151 / 3321 GB/s,
# 6144 4176 / 3767, 2052 3896 / 3570, bfloat16 5120 3682 / 3359; rms_norm float32 5120 4199 /
# 3766; softmax float16 5120 4165 / 3925, 6144 4184 / 3896, float32 5120 4192 / 3970; at 3000
# cols within -4% and +1% (192 x 16 against 128 x 24). Scalar rows lost (float32 softmax 769
# cols: 288 x 3 values 2285, 128 x 8 2589), so narrower packs keep BLOCK_THREADS.
BLOCK_WARP_THREADS = tuple(range(128, 513, 32))
# Larger blocks of the block kernels written for an even number of resident 512-thread blocks
# (rows.cuh CUNORM_BLOCK_BOUNDS: __launch_bounds__(1024, full / 2), the same register cap), for
# rows in full 16-byte packs of at most BLOCK_TARGET_VALUES a thread (block_wide).
BLOCK_WIDE_THREADS = (1024,)
BLOCK_MAX_VALUES = {4: 24, 8: 16}  # by compute-type size; no spills (tests/test_nvcc.py)
# Rows in full 16-byte packs too long for BLOCK_TARGET_VALUES a thread on 512 threads may hold 24
# or 32 values a thread on at most 512 threads, as the Triton peer's 16-warp programs do; those
# kernels get the registers of 2 resident blocks (64: rows.cuh block_row_mid). (op, input and
# output item sizes) -> (values a thread allowed, fewest threads). H200, 49152 rows, weight and
# bias, one run (tools/gpu_profile.py mid-blocks), against the plan then (smem unless noted):
# float32 layer_norm 12288 cols 512 x 24 4189 GB/s (384 x 32 4203) / 3738, 16384 512 x 32 4177
# / 3524; rms_norm 12288 512 x 24 4174 / 3872, but 16384 512 x 32 3084 / 4002 (and 384 x 32 at
# 12288 2916); softmax 12288 512 x 24 4212 / 3972, 16384 512 x 32 4117 / 3962; 16-bit
# softmax 12288 384 x 32 4208 / 3966 (512 x 24 3627), 16384 512 x 32 against 1024 x 16 4051 /
# 3995, but log_softmax 12288 384 x 32 3605 / 3963 (64 registers; 16384: 4023 / 3938); 16-bit
# norms 16384 512 x 32 against 1024 x 16: layer_norm float16 3755 / 3694, bfloat16 3847 /
# 3594, rms_norm float16 4148 / 4052, bfloat16 4178 / 3978, but at 12288 cols 384 x 32 lost to
# shared memory (layer_norm float16 3312 / 3669, rms_norm float16 3813 / 3936) and so did 512 x
# 24 (3325, 3756). float32 softmax keeps 24: at 32 values it spills 8 bytes under the cap (nvcc
# 13, sm_90). Measured on sm_90 and used there only (on sm_80 the float32 layer_norm at 32
# values spills 4 bytes).
BLOCK_MID_MIN_ARCH = 90
BLOCK_MID = {("softmax", 4, 4): ((24,), 128), ("log_softmax", 4, 4): ((24,), 128),
             ("softmax", 2, 2): ((32,), 128), ("log_softmax", 2, 2): ((32,), 512),
             ("layer_norm", 4, 4): ((24, 32), 128), ("rms_norm", 4, 4): ((24,), 128),
             ("layer_norm", 2, 2): ((32,), 512), ("rms_norm", 2, 2): ((32,), 512)}
# Rows of more than this many columns that the 16-value block kernels would hold take a
# BLOCK_MID block of that many values a thread instead, where one holds the row with at most
# an eighth of padding ((op, input and output item sizes) -> (columns, values); the values
# must be among BLOCK_MID's, whose kernels are built): float32 layer_norm, whose 16-value
# blocks (48 registers, norm.cu norm_block_capped) of more than 416 threads fit only 2 an SM
# (the occupancy API's count on an H200: 3 at 416 threads, 2 at 448-512), two rows in flight
# through their two block reductions each; 32 values a thread on half the threads fit 4 (64
# registers). H200, 49152 rows, weight and bias, one process, 3 rounds, outputs within 4e-6,
# median GB/s under the benchmark's timer (torch.compile alongside; the capped kernel in its
# first form, 47 registers beside norm_block's launch bounds, as many blocks an SM): 7168
# cols 448 x 16 4003-4005 -> 224 x 32 4264-4265 (4251-4252), 8192 512 x 16 4154-4155 -> 256 x
# 32 4262-4264 (4263-4264); on 416 threads they fit 3 and hold their own:
# 6656 416 x 16 4293-4296 against 224 x 32 4265-4267 (4272-4275), 6400 4293-4296 against
# 4267-4268 (benchmarks/results/nvidia-h200-2026-11-29-session75-profile.txt). Before that
# cap (53 registers, 3 blocks of 320 threads and 2 of 416) the rule started past 6144 columns:
# 6656 3897 -> 4267, 7168 4000-4002 -> 4264 on two GPUs, 8192 4146-4177 -> 4256-4281 on four
# (session74-profile.txt). float32 rms_norm at 4096-8192 gained nothing on 24 values (-0.2%
# to +0.1%) and lost on 32 (-1.6% to -1.8%), bfloat16 layer_norm at 8192 lost 1% on 32. Rows
# of 7172-7280 columns keep their 16-value blocks (480 threads, 2 an SM): 32 values would pad
# more than an eighth.
BLOCK_MID_PAST_COLS = {("layer_norm", 4, 4): (6656, 32)}
# Block rows that fill every thread's values in full 16-byte packs (threads x values == cols)
# may run the kernel built without column tests (rows.cuh rows_block EXACT): (op, input dtype)
# -> the values a thread at which it measured faster. H200, 49152 rows, weight and bias, one
# process, 3-5 rounds against the general kernel, outputs bit-identical
# (benchmarks/results/nvidia-h200-2026-11-27-block-rows-profile.txt): layer_norm bfloat16
# 2048 / 4096 / 5120 / 8192 cols (16 values a thread) +3.2 / +3.9 / +3.4 / +3.1%, float16
# 16384 (32 values) +3.5-3.6% in two runs (GPU-9d3b55f6, GPU-4cb33e72; +1.5% in a noisy
# first one); but bfloat16 16384 -2.4% to 0%, float16 2048-8192 -1.0% to -1.4%, rms_norm
# 16-bit -0.8% to -1.0% there, float32 0 to +0.7%. ptxas drops 4-20% of the instructions in
# every case; which ones gain follows no rule found in the SASS.
BLOCK_EXACT = {("layer_norm", "bfloat16"): (16,), ("layer_norm", "float16"): (32,)}
# The norm block kernels with scalar packs keep an address per value (the weight and bias at
# the affine store, x, residual and x + r for the residual variant): past these they spill
# under the 128-register cap of __launch_bounds__(512, 1) (nvcc 13, sm_80 and sm_90).
NORM_BLOCK_MAX_VALUES_SCALAR = {4: 16, 8: 8}
# Packs per thread the block path may use (a coarser set than the warp path's: fewer
# instantiations, and each one compiles without spills on sm_80 and sm_90).
BLOCK_PACKS_PER_THREAD = (1, 2, 3, 4, 6, 8, 12, 16, 24)
# Block paths: a row is cached in shared memory by one block (smem) or, on sm_90, split over
# a cluster of blocks exchanging partial results through distributed shared memory (cluster).
# One block caches rows up to SMEM_MAX_COLS (by input item size); longer rows go to the
# smallest cluster whose slices are small (below), and rows longer than 8 SMEM_SLICE_MAX_BYTES
# slices are read twice (uncached: on H200 a cluster of 8 with 128 KB slices ran fp32 262144
# at 2350 GB/s, uncached at 2680). 16-bit rows past 32768 cols (slices of 64 KB) go to clusters:
# H200, (24576, cols), one block against a cluster, same process (benchmarks/results/
# nvidia-h200-2026-11-26-one-exchange-profile.txt section 7): rms_norm float16 40960 / 49152
# 3911 -> 4011 / 3281 -> 3985 GB/s, with a residual 3703 -> 4276 / 3565 -> 4153, softmax and
# log_softmax +0.5%; at 28672-32000 one block kept rms_norm 1-2% ahead. float32 rows of
# 20480-24576 cols measured mixed there (rms_norm -2% on a cluster, softmax +0.4%): kept.
SMEM_MAX_COLS = {2: 32768, 4: 24576, 8: 12288}
# layer_norm's 16-bit rows past the block path go to clusters sooner: its two passes over the
# cached row (and the residual's h) run shorter on a cluster's smaller slices. H200, (12288,
# 32768), weight and bias, one run, one block (64 KB) against a cluster of 2 x 32 KB: float16
# 3554 -> 3631 GB/s, bfloat16 3354 -> 3438, with the residual 3755 -> 3934 and 3281 -> 3917;
# rms_norm's single pass lost on the cluster (bfloat16 4071 -> 3864), so it keeps SMEM_MAX_COLS.
LAYER_NORM_SMEM_MAX_COLS = {**SMEM_MAX_COLS, 2: 16384}
SMEM_SLICE_MAX_BYTES = 64 * 1024
# Clusters prefer slices of at most this size when 8 blocks suffice: bf16 65536 cols ran at
# 3310 GB/s in 4 x 32 KB against 2690 in 2 x 64 KB, fp16 131072 at 3255 vs 3101.
SMEM_SLICE_PREFERRED_BYTES = 32 * 1024
# Every path launches one block (warp path: one block of row groups; clusters: one cluster)
# per row and lets the hardware schedule them. On H200 this beat persistent grids (resident
# blocks looping over rows) on every path: warp fp16 1024 cols 3736 vs 3593 GB/s, smem fp16 8192
# 3859 vs 3432 even with the next row double-buffered by cp.async, clusters of 4 by 10-30%.
# Uncached rows on sm_90 are split over the smallest cluster whose slices are at most this
# many bytes, so the rows in flight (and their second read) stay in L2.
UNCACHED_SLICE_MAX_BYTES = 128 * 1024
# Strided path (non-last axis). A tile is at least STRIDED_MIN_TILE_BYTES wide per dim row
# (wider when dim is short, so each thread still walks about STRIDED_ROWS_PER_THREAD dim rows);
# its (dim slice, tile) slab is cached by one block, or on sm_90 split over the smallest
# cluster whose slices fit STRIDED_SLICE_PREFERRED_BYTES, then with STRIDED_NARROW_TILE_BYTES
# tiles (one 32-byte sector a dim row), then either again within STRIDED_SLICE_MAX_BYTES;
# past that x is read twice, split over the same clusters. Small blocks with small slices
# keep a block's load, reduce and store phases short, so the SM overlaps more of them and the
# grid's first and last waves cost less: H200, softmax over axis 1, GB/s, two rounds each
# (benchmarks/results/nvidia-h200-2026-11-22-strided-profile.txt section 6), from 256-thread
# blocks, 128-byte tiles and 64 KB slices to this rule: float16 (16, 4096, 1024) 2706 -> 2823,
# bfloat16 2630 -> 2720, float16 (32, 4096, 1024) 2911 -> 3047, (16, 2048, 2048) 2794 -> 2871,
# float32 (32, 21, 256, 256) 3403 -> 3493; dims too long for 8 x 64 KB slices had one block
# per tile reading x twice (32 blocks for float16 (4, 8192, 512): 253 GB/s) and now take
# clusters of 32-byte tiles: 1558 GB/s there, float32 (4, 8192, 512) 501 -> 1871, and read
# twice over clusters float16 (1, 32768, 1024) 132 -> 1186, float32 (1, 65536, 256) 73 -> 799.
# Cached slices of 64 KB and 64-byte tiles lost to 32 KB and 32 bytes (float16 (4, 8192, 512)
# 1452 against 1558), 32-byte tiles to 64 bytes where both fit 32 KB (float16 (64, 2048, 128)
# 1497 against 1988), 256-thread blocks of the same tiles by 13% and 64-thread ones by 18%.
STRIDED_MIN_TILE_BYTES = 64
STRIDED_NARROW_TILE_BYTES = 32
STRIDED_ROWS_PER_THREAD = 16
STRIDED_SLICE_PREFERRED_BYTES = 32 * 1024
STRIDED_SLICE_MAX_BYTES = 64 * 1024
# Rows a thread of a cached cluster kernel holds in registers rather than shared memory (the
# kernels' HELD): float16 (16, 4096, 1024) then fits 7 blocks an SM, not 6, 2904 -> 2954 GB/s
# on H200 (softmax.cu softmax_strided_cluster has the measurements).
STRIDED_HELD_ROWS = 2
CLUSTER_SIZES = (2, 4, 8)  # portable cluster sizes (8 is the portable maximum)
# Row clusters may also take 16 blocks where the device allows it (DeviceProps.max_cluster):
# float32 rows of 262144 columns then stay in shared memory as 16 x 64 KB slices. H200, 768
# rows: 3807 GB/s, against 3046 for 8 x 128 KB slices and 2087 uncached (clusters of 8); the
# 16-bit rows of 262144 columns gain 2% (16 x 32 KB against 8 x 64 KB). The strided path
# keeps the portable sizes.
ROW_CLUSTER_SIZES = (*CLUSTER_SIZES, 16)
# Norms of these item sizes cache a row on a portable cluster (slices up to
# SMEM_SLICE_MAX_BYTES) before a cluster of 16: float32 rows of 131072 columns took 16 x 32 KB
# slices by the preference above, and ran faster on 8 x 64 KB. H200, 1536 rows, weight (and
# bias), one process, two rounds each (benchmarks/results/nvidia-h200-2026-11-23-cluster-
# sizes-profile.txt): layer_norm 3021 -> 3211 GB/s (another GPU: 3088 -> 3427), rms_norm
# 3890 -> 3923, rms_norm with a residual 3862 -> 3938, layer_norm with one 3655 -> 3650. Not
# softmax (float32 4099 -> 4066) or 16-bit rows of 262144 columns (layer_norm float16 3398 ->
# 3376, with a residual 3764 -> 3463).
NORM_PORTABLE_CLUSTER_ITEMSIZES = (4,)
BLOCK_SIZES = (128, 256, 512)  # smem kernels: __launch_bounds__(512, 1)
UNCACHED_BLOCK = 512  # = __launch_bounds__ of softmax_uncached
STRIDED_BLOCK = 128  # threads of a strided block (kernel bounds 256, cached clusters 128)
MAX_GRID = 2**31 - 1  # gridDim.x limit; kernels loop over rows beyond it
# Rows the block path takes: its kernels of at most 16 values a thread in full packs count rows
# in 32 bits (rows.cuh BlockRow: row + gridDim.x stays below 2^32), and one limit serves them
# all; more rows take the next path. (Its rows are longer than the warp path's: 2^31 of them
# would not fit in any GPU's memory.)
BLOCK_MAX_ROWS = 2**31 - 1
# Static shared memory of the smem kernels (reduction scratch and cluster mail), reserved out
# of the opt-in limit; tests/test_nvcc.py checks every smem and strided kernel against it (the
# largest, float64 layer_norm on a cluster of 16: 1200 bytes).
STATIC_SMEM_RESERVE = 2048


@dataclass(frozen=True)
class LaunchPlan:
    """How to launch one kernel.

    Attributes
    ----------
    path : str
        ``"warp"``, ``"smem"``, ``"cluster"``, ``"uncached"``, ``"strided-cached"`` or
        ``"strided"``.
    kernel : str
        C++ template instantiation (NVRTC name expression).
    grid, block : int
        1-D launch shape.
    smem : int
        Dynamic shared memory in bytes.
    tx_count : int
        Strided path only: threads along the inner axis of a block.
    carveout : int
        Shared-memory carveout hint the kernel must carry for this launch, in percent of the
        SM's shared-memory capacity; -1 leaves the driver's choice (see
        :func:`weight_l1_residency`).
    """

    path: str
    kernel: str
    grid: int
    block: int
    smem: int
    tx_count: int = 0
    carveout: int = -1


# --- forcing a path (tests, threshold measurement) -------------------------------------
_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("cunorm_force", default=None)


@contextlib.contextmanager
def context_value(var: contextvars.ContextVar, value: object) -> Iterator[None]:
    """Set ``var`` to ``value`` inside the block and restore it on the way out (the forcing
    context managers of both planners)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


@contextlib.contextmanager
def force_path(path: str | None) -> Iterator[None]:
    """Force every plan made inside the block onto ``path`` (``None`` = normal dispatch).

    Raises ``ValueError`` at plan time if the problem cannot run on that path.

    Examples
    --------
    >>> with force_path("uncached"):
    ...     pass  # cunorm.softmax(x) here always takes the uncached path
    """
    if path is not None and path not in ROW_PATHS + STRIDED_PATHS:
        raise ValueError(f"force_path(): unknown path {path!r}; expected one of "
                         f"{ROW_PATHS + STRIDED_PATHS}")
    with context_value(_FORCED, path):
        yield


@contextlib.contextmanager
def override_constants(consts: dict[str, object]) -> Iterator[None]:
    """Plan with these module constants (``BLOCK_WIDE_THREADS``, ``SMEM_SLICE_MAX_BYTES``, ...)
    replaced inside the block, for threshold measurements; the plans the ops cached are dropped
    on the way in and out, so each call inside plans again. Not thread-safe.

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h100 = DeviceProps("fake", (9, 0), 132, 2048, 232448, 233472, 50 << 20)
    >>> with override_constants({"BLOCK_MID": {}, "BLOCK_WIDE_THREADS": ()}):  # registers
    ...     plan_rows("softmax", "float16", "float16", 4096, 16384, 8, h100,
    ...               lambda k, b, s: 2048 // b).path
    'smem'
    """
    unknown = sorted(k for k in consts if k not in globals() or not k.isupper())
    if unknown:
        raise ValueError(f"override_constants(): no dispatcher constant named {unknown}")
    old = {k: globals()[k] for k in consts}
    globals().update(consts)
    _drop_cached_plans()
    try:
        yield
    finally:
        globals().update(old)
        _drop_cached_plans()


def _drop_cached_plans() -> None:
    # The ops' plan caches, in the modules that made them (none yet if nothing ran).
    for module in ("cunorm.softmax", "cunorm.norm", "cunorm.softmax_grad", "cunorm.norm_grad"):
        cached = getattr(sys.modules.get(module), "_PLANS", None)
        if cached is not None:
            cached.clear()


def forced_path() -> str | None:
    """The path forced by the innermost :func:`force_path`, or ``None``."""
    return _FORCED.get()


# --- kernel names -----------------------------------------------------------------------
def kernel_file(name: str) -> str:
    """Source file under ``cuda_src/`` defining kernel ``name``."""
    if name.startswith("cunorm::attn_"):
        return "attention.cu"
    if name.startswith(("cunorm::softmax_grad<", "cunorm::softmax_grad_cluster<",
                        "cunorm::norm_grad_")):
        return "grad.cu"
    return "norm.cu" if name.startswith("cunorm::norm_") else "softmax.cu"


def kernel_head(op: str, src: str, dst: str, residual: bool = False) -> tuple[str, str]:
    """(kernel family, leading template arguments) of ``op``'s row kernels.

    softmax family: ``cunorm::softmax_<path><SRC, DST, LOG, ...>``; norms:
    ``cunorm::norm_<path><SRC, RMS, RESIDUAL, ...>``. Raises ``ValueError`` for an op or dtype
    pair without kernels.
    """
    if op in SOFTMAX_OPS:
        if (src, dst) not in KERNEL_DTYPE_PAIRS:
            raise ValueError(f"no kernel for {src} -> {dst}; expected one of "
                             f"{KERNEL_DTYPE_PAIRS}")
        if residual:
            raise ValueError(f"{op} has no residual variant")
        return "softmax", f"{CTYPE[src]}, {CTYPE[dst]}, {_cbool(op == 'log_softmax')}"
    if op in NORM_OPS:
        if src not in CTYPE or dst != src:
            raise ValueError(f"no {op} kernel for {src} -> {dst}; the output has the input's "
                             "dtype")
        return "norm", f"{CTYPE[src]}, {_cbool(op == 'rms_norm')}, {_cbool(residual)}"
    raise ValueError(f"unknown op {op!r}; expected one of {SOFTMAX_OPS + NORM_OPS}")


def _cbool(flag: bool) -> str:
    return "true" if flag else "false"


# --- helpers ----------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def compute_bytes(src: str, dst: str) -> int:
    """Byte width of the compute type: double if either side is float64, else float."""
    return 8 if "float64" in (src, dst) else 4


def max_pack(cols: int, itemsize: int, align_elems: int) -> int:
    """Largest pack (elements per vector access, at most 16 bytes) dividing ``cols`` and
    ``align_elems`` (the caller's bound from pointer and row-stride alignment)."""
    pack = 16 // itemsize
    while pack > 1 and (cols % pack or align_elems % pack):
        pack //= 2
    return pack


def pick_block(kernel: str, smem: int, occ: Occupancy) -> tuple[int, int]:
    """OneFlow's rule: the largest block size keeping the resident-block count of the
    smallest one (so growing the block costs no occupancy). Returns (block, blocks per SM);
    blocks per SM is 0 if even the smallest block does not fit."""
    base = occ(kernel, BLOCK_SIZES[0], smem)
    if base <= 0:
        return BLOCK_SIZES[0], 0
    for block in reversed(BLOCK_SIZES[1:]):
        if occ(kernel, block, smem) == base:
            return block, base
    return BLOCK_SIZES[0], base


def pick_block_threads(kernel: str, smem: int, occ: Occupancy,
                       larger_on_tie: bool = False) -> tuple[int, int]:
    """The block size with the most resident threads (block x blocks per SM), the smaller on a
    tie (the larger with ``larger_on_tie``: see :func:`_plan_smem`): a norm's shared-memory
    path waits on its weight and bias loads at the stores, and more resident warps hide that
    better than more resident rows. H200, 24576 rows, weight and
    bias (tools/gpu_profile.py smem-blocks), against :func:`pick_block`'s choice: layer_norm
    float16 12288 cols 256 x 6 blocks 3582 GB/s against 128 x 8 3284, bfloat16 3482 / 3187,
    rms_norm bfloat16 32768 cols 512 x 2 3914 against 256 x 3 3405; the other norm cells
    within 2% of the best fixed size. The same holds on clusters, where the 48-register
    bfloat16 kernels had kept 128-thread blocks (H200, one run each, weight and bias):
    rms_norm bfloat16 (3072, 65536) 2830 -> 3720 GB/s, (1536, 131072) 3052 -> 3674, float32
    (1536, 131072) 3215 -> 3685, layer_norm bfloat16 (3072, 65536) 3077 -> 3223 and with the
    residual 2859 -> 3666; layer_norm without parameters lost up to 3% (bfloat16 (3072, 65536)
    3788 -> 3679). Returns (block, blocks per SM); blocks per SM is 0 if no block size fits."""
    best = (BLOCK_SIZES[0], 0)
    for block in BLOCK_SIZES:
        per_sm = occ(kernel, block, smem)
        threads, best_threads = block * per_sm, best[0] * best[1]
        if threads > best_threads or (larger_on_tie and threads == best_threads > 0):
            best = (block, per_sm)
    return best


# --- row-wise (rows, cols) --------------------------------------------------------------
def value_cap(family: str, path: str, cbytes: int, pack: int) -> int:
    """Most row values one thread may hold on the ``"warp"`` or ``"block"`` path."""
    if path == "warp":
        return WARP_MAX_VALUES_PER_THREAD[cbytes]
    if family == "norm" and pack == 1:
        return NORM_BLOCK_MAX_VALUES_SCALAR[cbytes]
    return BLOCK_MAX_VALUES[cbytes]


def narrow_groups(src: str, dst: str, pack: int, cols: int, residual: bool = False) -> bool:
    """Whether the warp path may narrow the lane groups of ``cols``-column rows
    (WARP_GROUP_PACKS): rows in full 16-byte packs (where it was measured); with a residual,
    only rows of at most RESIDUAL_NARROW_MAX_PACKS packs.

    Examples
    --------
    >>> narrow_groups("float16", "float16", 8, 32, residual=True)  # 4 packs
    True
    >>> narrow_groups("float16", "float16", 8, 128, residual=True)  # 16 packs
    False
    >>> narrow_groups("float16", "float16", 8, 128)
    True
    """
    if not full_packs(src, dst, pack):
        return False
    return not residual or _cdiv(cols, pack) <= RESIDUAL_NARROW_MAX_PACKS


def warp_config(cols: int, pack: int, cbytes: int, family: str = "softmax",
                narrow: bool = False) -> tuple[int, int, int] | None:
    """(values per thread, group width, rows per group) for the warp path, or None if the
    row does not fit in registers (:func:`value_cap`). ``narrow``: :func:`narrow_groups`.

    Examples
    --------
    >>> warp_config(256, 8, 4, "norm", narrow=True)  # float16 layer_norm: 16 lanes of 2 packs
    (16, 16, 1)
    >>> warp_config(256, 8, 4, "norm")  # with a residual
    (8, 32, 1)
    >>> warp_config(64, 8, 4, "norm", narrow=True)  # 8 packs: a pack a lane, four rows a group
    (8, 8, 4)
    >>> warp_config(64, 8, 4, "softmax", narrow=True)  # kept tiny: 8 lanes, 2 rows a group
    (8, 8, 2)
    >>> warp_config(64, 4, 4, "softmax", narrow=True)  # float32: 8 lanes of 2 packs
    (8, 8, 1)
    """
    target = WARP_GROUP_PACKS.get(family, 0) if narrow else 0
    if (pack, _cdiv(cols, pack)) in WARP_GROUP_KEEP_TINY.get(family, ()):
        target = 0
    if target and cols >= WARP_GROUP_MIN_PACKS.get(family, 0) * pack:
        if cbytes == 4 and _cdiv(cols, pack) in WARP_SPREAD_PACKS.get(family, ()):
            return pack, _cdiv(cols, pack), WARP_SPREAD_ROWS
        # The narrowest group whose lanes hold at most `target` packs.
        for group in (1, 2, 4, 8, 16, 32):
            k = _cdiv(_cdiv(cols, group), pack)
            if k <= target and k * pack <= value_cap(family, "warp", cbytes, pack):
                return k * pack, group, 1
    if cols <= 32 * pack:
        group = max(1, _next_pow2(_cdiv(cols, pack)))
        # tiny rows: two rows per group, so a warp keeps as many loads in flight
        return pack, group, (2 if group < 32 else 1)
    need = _cdiv(_cdiv(cols, 32), pack)
    k = next((k for k in WARP_PACKS_PER_THREAD if k >= need), None)
    if k is None or k * pack > value_cap(family, "warp", cbytes, pack):
        return None
    return k * pack, 32, 1


def warp_early_params(cfg: tuple[int, int, int], wide: bool = False,
                      tiny: bool = False) -> bool:
    """Whether the warp kernel of configuration ``cfg`` (:func:`warp_config`) loads a norm's
    parameters with the row (rows.cuh warp_early_params, the same rule): groups of one row
    spanning 64-256 columns, or up to 1024 where ``wide`` (16-bit rms_norm without a
    residual in full packs: :func:`warp_wide_early`), or from 32 where ``tiny``
    (:func:`warp_tiny_early`).

    Examples
    --------
    >>> warp_early_params((16, 2, 1)), warp_early_params((16, 2, 1), tiny=True)  # 32 columns
    (False, True)
    """
    per_thread, group, rows_per_group = cfg
    return rows_per_group == 1 and (32 if tiny else 64) <= group * per_thread <= (
        1024 if wide else 256)


def warp_wide_early(op: str, src: str, pack: int, residual: bool = False) -> bool:
    """Whether ``op``'s warp rows in packs of ``pack`` values may load their parameters early
    up to 1024 columns (norm.cu norm_warp_wide_early): 16-bit rms_norm without a residual,
    whose store has one weight and no bias, in full 16-byte packs (+1.0-1.6% at 512-1024
    columns; layer_norm's weight and bias lost there)."""
    return op == "rms_norm" and not residual and ITEMSIZE.get(src) == 2 and full_packs(
        src, src, pack)


def warp_tiny_early(op: str, src: str, pack: int, exact: bool = True) -> bool:
    """Whether ``op``'s warp rows in packs of ``pack`` values load their parameters early from
    32 columns on the ``exact`` kernel (norm.cu norm_warp_tiny_early): the 16-bit norms, with
    or without a residual, in full 16-byte packs (rms_norm and the residual forms +0.7-4.4% at
    32 columns; layer_norm without a residual +1.5-4.0% over staging its weight and bias,
    +8-10% at 196608 rows; the general kernels, rows of 17-31 columns or more rows than one
    grid covers, not measured). It moves no kernel name: the exact kernel is planned for
    these rows either way (:func:`warp_exact`), but layer_norm's no longer stages
    (:func:`warp_stage_bytes`)."""
    return exact and op in ("layer_norm", "rms_norm") and ITEMSIZE.get(src) == 2 and full_packs(
        src, src, pack)


def warp_stage_bytes(op: str, src: str, pack: int, cfg: tuple[int, int, int],
                     residual: bool = False, exact: bool = False) -> int:
    """Dynamic shared memory (bytes) of a warp-path block of ``op`` whose kernel stages the
    weight and bias there (rows.cuh rows_warp STAGE; norm.cu norm_warp_stages_params, the
    same rule), else 0. ``exact``: the plan's kernel is the exact variant (:func:`warp_exact`).

    16-bit layer_norm without a residual, in full 16-byte packs, one row a group, parameters
    not loaded early (:func:`warp_early_params`: 264-1536 columns, and 32, whose two-lane
    groups span fewer than 64, on the general kernel only: the exact one loads them early,
    :func:`warp_tiny_early`): each thread copies its columns' weight and bias by cp.async
    before the row loop and reads them back at the stores. H200: +1.7-2.7% at 512-1024
    columns (rows.cuh has the measurements).

    Examples
    --------
    >>> warp_stage_bytes("layer_norm", "float16", 8, (32, 32, 1))  # 1024 columns
    8192
    >>> warp_stage_bytes("layer_norm", "float16", 8, (16, 16, 1))  # 256: loaded early
    0
    >>> warp_stage_bytes("layer_norm", "float16", 8, (16, 2, 1))  # 32, general kernel
    4096
    >>> warp_stage_bytes("layer_norm", "float16", 8, (16, 2, 1), exact=True)  # loaded early
    0
    """
    per_thread, _, rows_per_group = cfg
    if (op != "layer_norm" or residual or ITEMSIZE[src] != 2 or not full_packs(src, src, pack)
            or rows_per_group != 1
            or warp_early_params(cfg, tiny=warp_tiny_early(op, src, pack, exact))):
        return 0
    return WARP_BLOCK * 2 * per_thread * ITEMSIZE[src]


def warp_exact(op: str, src: str, dst: str, pack: int, cols: int,
               cfg: tuple[int, int, int], residual: bool = False) -> bool:
    """Whether a warp-path row of ``op`` over ``cols`` columns on the configuration ``cfg``
    (values per thread, group width, rows per group; :func:`warp_config`) takes the exact
    kernel variant: the row fills the group's full 16-byte packs (rows.cuh rows_warp EXACT),
    except layer_norm's (which has a bias) and float64 rms_norm's rows that load their
    parameters early without a residual (WARP_EXACT_FAMILIES), but for 16-bit layer_norm
    rows of 256 columns (on large grids only: :func:`warp_exact_min_blocks`).

    Examples
    --------
    >>> warp_exact("layer_norm", "float16", "float16", 8, 512, (16, 32, 1))
    True
    >>> warp_exact("rms_norm", "float16", "float16", 8, 1000, (32, 32, 1))  # 24 cols padding
    False
    >>> warp_exact("layer_norm", "float16", "float16", 8, 128, (16, 8, 1))  # early
    False
    >>> warp_exact("layer_norm", "float16", "float16", 8, 256, (16, 16, 1))  # early, measured
    True
    >>> warp_exact("rms_norm", "float16", "float16", 8, 256, (16, 16, 1))  # no bias
    True
    >>> warp_exact("rms_norm", "float64", "float64", 2, 128, (4, 32, 1))
    False
    >>> warp_exact("layer_norm", "float16", "float16", 8, 256, (16, 16, 1), residual=True)
    True
    """
    family = kernel_head(op, src, dst, residual)[0]
    # (the wide rule, warp_wide_early, covers neither layer_norm nor float64)
    if (family == "norm" and not residual and (op == "layer_norm" or src == "float64")
            and warp_early_params(cfg) and not _layer_norm16_256(op, src, cfg, residual)):
        return False
    return (family in WARP_EXACT_FAMILIES and full_packs(src, dst, pack)
            and cfg[0] * cfg[1] == cols)


def _layer_norm16_256(op: str, src: str, cfg: tuple[int, int, int], residual: bool) -> bool:
    """16-bit layer_norm rows without a residual whose groups span 256 columns, one row a
    group (16 lanes of 16 values), loading weight and bias early: the early rows that may take
    the exact kernel (:func:`warp_exact`) on large grids (:func:`warp_exact_min_blocks`)."""
    return (op == "layer_norm" and not residual and ITEMSIZE.get(src) == 2
            and cfg[0] * cfg[1] == 256 and warp_early_params(cfg))


def warp_exact_min_blocks(op: str, src: str, cfg: tuple[int, int, int], sm_count: int,
                          residual: bool = False) -> int:
    """The fewest blocks a grid of ``op``'s warp rows on configuration ``cfg`` needs to take
    the exact kernel :func:`warp_exact` allows: WARP_EXACT_EARLY_SM_BLOCKS an SM for 16-bit
    layer_norm rows of 256 columns (exact 2.6-4.3% slower on small grids, 3-4% faster on large
    ones), else 0.

    Examples
    --------
    >>> warp_exact_min_blocks("layer_norm", "float16", (16, 16, 1), 132)
    8448
    >>> warp_exact_min_blocks("rms_norm", "float16", (16, 16, 1), 132)
    0
    """
    return (WARP_EXACT_EARLY_SM_BLOCKS * sm_count
            if _layer_norm16_256(op, src, cfg, residual) else 0)


def warp_kernel(family: str, head: str, pack: int, cfg: tuple[int, int, int],
                exact: bool) -> str:
    """The warp kernel's name for configuration ``cfg`` (:func:`warp_config`)."""
    return (f"cunorm::{family}_warp<{head}, {pack}, {cfg[0]}, {cfg[1]}, {cfg[2]}, "
            f"{_cbool(exact)}>")


def block_exact(op: str, src: str, dst: str, pack: int, cols: int, cfg: tuple[int, int],
                residual: bool = False) -> bool:
    """Whether a block-path row of ``op`` over ``cols`` columns on ``cfg`` (threads, values a
    thread) takes the kernel without column tests: the row fills the block's full 16-byte
    packs, and BLOCK_EXACT lists ``op`` on ``src`` rows of that many values a thread (norms
    only: softmax_block has no exact variant).

    Examples
    --------
    >>> block_exact("layer_norm", "bfloat16", "bfloat16", 8, 4096, (256, 16))
    True
    >>> block_exact("layer_norm", "bfloat16", "bfloat16", 8, 4000, (256, 16))  # padded
    False
    >>> block_exact("layer_norm", "bfloat16", "bfloat16", 8, 16384, (512, 32))
    False
    >>> block_exact("layer_norm", "float16", "float16", 8, 4096, (256, 16))
    False
    >>> block_exact("layer_norm", "float16", "float16", 8, 16384, (512, 32))
    True
    """
    return (op in NORM_OPS and not residual and cfg[1] in BLOCK_EXACT.get((op, src), ())
            and full_packs(src, dst, pack) and cfg[0] * cfg[1] == cols)


def block_capped(family: str, head: str, pack: int, per_thread: int) -> bool:
    """Whether block rows of ``per_thread`` values a thread in ``pack``-element packs run
    norm.cu's ``norm_block_capped`` (float32 layer_norm without a residual, 16-byte packs of
    16 values a thread: the same rows held to 48 registers, 4 blocks of 320 threads an SM where
    ``norm_block`` fits 3; its comment has the measurements)."""
    return (family == "norm" and head == kernel_head("layer_norm", "float32", "float32")[1]
            and pack == 4 and per_thread == BLOCK_TARGET_VALUES)


def block_kernel(family: str, head: str, pack: int, per_thread: int, exact: bool) -> str:
    """The block kernel's name for rows of ``per_thread`` values a thread (the exact variant:
    :func:`block_exact`, norms only; :func:`block_capped`'s rows on their own kernel)."""
    capped = "_capped" if block_capped(family, head, pack, per_thread) else ""
    return (f"cunorm::{family}_block{capped}<{head}, {pack}, {per_thread}"
            f"{', true' if exact else ''}>")


def full_packs(src: str, dst: str, pack: int) -> bool:
    """Whether ``pack``-element packs of a ``src -> dst`` row move 16 bytes on the wider side:
    the block kernels compiled for several resident blocks (rows.cuh CUNORM_BLOCK_BOUNDS)."""
    return pack * max(ITEMSIZE[src], ITEMSIZE[dst]) == 16


def block_wide(family: str, src: str, dst: str, pack: int) -> bool:
    """Whether the block kernels of ``family`` for ``src -> dst`` with ``pack``-element packs
    take BLOCK_WIDE_THREADS blocks when a thread holds at most BLOCK_TARGET_VALUES values.

    Mirrors rows.cuh ``block_max_threads``: 16-byte packs, and a register cap written for an
    even number of resident 512-thread blocks (the ``full`` argument of norm.cu's and
    softmax.cu's block kernels: 4 for 16-bit data, 2 for float32 norms; 3 for the other
    softmax pairs and 1 for float64 are odd)."""
    if not full_packs(src, dst, pack):
        return False
    if family == "norm":
        return ITEMSIZE[src] in (2, 4)
    return ITEMSIZE[src] == ITEMSIZE[dst] == 2


def block_threads(family: str, src: str, dst: str, pack: int) -> tuple[int, ...]:
    """Block sizes the block kernels of ``family`` for ``src -> dst`` with ``pack``-element
    packs may take: BLOCK_WARP_THREADS for full 16-byte packs (and BLOCK_WIDE_THREADS where
    :func:`block_wide`), else BLOCK_THREADS."""
    if not full_packs(src, dst, pack):
        return BLOCK_THREADS
    return BLOCK_WARP_THREADS + (BLOCK_WIDE_THREADS if block_wide(family, src, dst, pack) else ())


def block_config(cols: int, pack: int, cbytes: int, family: str = "softmax",
                 threads_options: tuple[int, ...] = BLOCK_THREADS) -> tuple[int, int] | None:
    """(threads, values per thread) for the block-register path, or None if the row does not
    fit in the registers of a block. Least padding first (idle lanes cost bandwidth: cols=3000
    fp16 on 256 threads x 16 values ran at 80% of copy) while it exceeds an eighth of the row,
    then values per thread nearest BLOCK_TARGET_VALUES, then the least padding, over the block
    sizes ``threads_options`` (:func:`block_threads`); blocks of more than 512 threads hold at
    most BLOCK_TARGET_VALUES a thread."""
    best = None
    for threads in threads_options:
        need = _cdiv(_cdiv(cols, threads), pack)
        k = next((k for k in BLOCK_PACKS_PER_THREAD if k >= need), None)
        if k is None or k * pack > value_cap(family, "block", cbytes, pack):
            continue
        if threads > BLOCK_THREADS[-1] and k * pack > BLOCK_TARGET_VALUES:
            continue
        waste = threads * k * pack - cols
        key = (waste > cols // 8, waste if waste > cols // 8 else 0,
               abs(k * pack - BLOCK_TARGET_VALUES), waste)
        if best is None or key < best[0]:
            best = (key, threads, k * pack)
    return None if best is None else (best[1], best[2])


def plan_rows(op: str, src: str, dst: str, rows: int, cols: int, align_elems: int,
              props: DeviceProps, occ: Occupancy, force: str | None = None,
              residual: bool = False, params: bool = True) -> LaunchPlan:
    """Plan a row-wise launch over a (rows, cols) view.

    Parameters
    ----------
    op : str
        ``"softmax"``, ``"log_softmax"``, ``"layer_norm"`` or ``"rms_norm"``.
    src, dst : str
        Input and output dtype names (``"float16"``, ``"bfloat16"``, ``"float32"``,
        ``"float64"``).
    rows, cols : int
        Problem shape (both >= 1).
    align_elems : int
        Elements of alignment shared by both pointers and both row strides (bounds the pack).
    props : DeviceProps
        Target device.
    occ : Occupancy
        Occupancy oracle.
    force : str, optional
        Path to force (one of ``ROW_PATHS``).
    residual : bool
        Norms only: the fused residual variant (normalizes and writes x + r).
    params : bool
        layer_norm only: weight and bias are both given; the warp rows that stage them need
        shared memory only then (:func:`warp_stage_bytes`).

    Returns
    -------
    LaunchPlan

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h100 = DeviceProps("fake", (9, 0), 132, 2048, 232448, 233472, 50 << 20)
    >>> plan_rows("softmax", "float32", "float32", 4096, 512, 4, h100,
    ...           lambda k, b, s: 2048 // b).path
    'warp'
    >>> plan_rows("layer_norm", "float16", "float16", 4096, 12288, 8, h100,
    ...           lambda k, b, s: 2048 // b).kernel
    'cunorm::norm_smem<cunorm::half_t, false, false, 8>'
    """
    family, head = kernel_head(op, src, dst, residual)
    # The pack moves PACK inputs and PACK outputs: the wider side bounds it to 16 bytes.
    pack = max_pack(cols, max(ITEMSIZE[src], ITEMSIZE[dst]), align_elems)
    cbytes = compute_bytes(src, dst)

    path = force
    if path is None:
        path = _choose_row_path(op, family, src, dst, rows, cols, pack, cbytes, props,
                                residual)
    if path == "warp":
        cfg = warp_config(cols, pack, cbytes, family,
                          narrow_groups(src, dst, pack, cols, residual))
        if cfg is None:
            raise ValueError(f"path 'warp' cannot hold cols={cols} in registers")
        per_thread, group, rows_per_group = cfg
        blocks = _cdiv(rows, WARP_BLOCK // group * rows_per_group)
        # the exact variant has no row loop: only where the grid covers every row
        exact = (warp_exact(op, src, dst, pack, cols, cfg, residual) and blocks <= MAX_GRID
                 and blocks >= warp_exact_min_blocks(op, src, cfg, props.sm_count, residual))
        return LaunchPlan("warp", warp_kernel(family, head, pack, cfg, exact),
                          min(blocks, MAX_GRID), WARP_BLOCK,
                          warp_stage_bytes(op, src, pack, cfg, residual, exact) if params else 0)
    if path == "block":
        if rows > BLOCK_MAX_ROWS:
            raise ValueError(f"path 'block' takes at most {BLOCK_MAX_ROWS} rows, got {rows}")
        cfg = None if force is not None else auto_block_config(op, src, dst, cols, pack,
                                                               props.arch, residual)
        cfg = cfg or block_config(cols, pack, cbytes, family,
                                  block_threads(family, src, dst, pack))
        if cfg is None:
            raise ValueError(f"path 'block' cannot hold cols={cols} in registers")
        threads, per_thread = cfg
        exact = block_exact(op, src, dst, pack, cols, cfg, residual)
        return LaunchPlan("block", block_kernel(family, head, pack, per_thread, exact),
                          min(rows, MAX_GRID), threads, 0)
    if path in ("smem", "cluster"):
        weight_bytes = cols * ITEMSIZE[src] if op == "rms_norm" and not residual else 0
        return _plan_smem(family, head, src, rows, cols, pack, props, occ, path == "cluster",
                          residual, weight_bytes)
    if path == "uncached":
        name = f"cunorm::{family}_uncached<{head}, {pack}>"
        per_sm = max(1, occ(name, UNCACHED_BLOCK, 0))
        cluster = _uncached_cluster(cols * ITEMSIZE[src], props)
        if cluster == 1:
            return LaunchPlan("uncached", name, min(rows, props.sm_count * per_sm),
                              UNCACHED_BLOCK, 0)
        name = f"cunorm::{family}_uncached_cluster<{head}, {pack}, {cluster}>"
        return LaunchPlan("uncached", name, min(rows, MAX_GRID // cluster) * cluster,
                          UNCACHED_BLOCK, 0)
    raise ValueError(f"unknown row path {path!r}; expected one of {ROW_PATHS}")


def _smem_capacity(props: DeviceProps) -> int:
    return props.smem_per_block_optin - STATIC_SMEM_RESERVE


def smem_config(cols: int, pack: int, itemsize: int, props: DeviceProps,
                clusters: tuple[int, ...], portable_first: bool = False) -> tuple[int, int] | None:
    """(cluster size, dynamic smem bytes per block) of the first cluster size in ``clusters``
    whose slice of the row is at most SMEM_SLICE_PREFERRED_BYTES, else at most
    SMEM_SLICE_MAX_BYTES, else the largest slice that fits; None if none fits in shared memory.
    With ``portable_first``, the portable sizes (1 and CLUSTER_SIZES) go through both limits
    before the others are tried."""
    cap = _smem_capacity(props)
    slices = [(c, _cdiv(cols // pack, c) * pack * itemsize) for c in clusters]
    fitting = [(c, b) for c, b in slices if b <= cap]
    tiers = [fitting]
    if portable_first:
        tiers.insert(0, [(c, b) for c, b in fitting if c == 1 or c in CLUSTER_SIZES])
    for candidates in tiers:
        for limit in (SMEM_SLICE_PREFERRED_BYTES, SMEM_SLICE_MAX_BYTES):
            for c, b in candidates:
                if b <= limit:
                    return c, b
    return fitting[-1] if fitting else None


def block_mid_config(op: str, src: str, dst: str, cols: int, pack: int, arch: int,
                     residual: bool = False,
                     values: tuple[int, ...] | None = None) -> tuple[int, int] | None:
    """(threads, values per thread) of a BLOCK_MID block holding the row (whole warps, at
    most 512 threads, padding at most an eighth of the row; the least padding, then the fewer
    values; of ``values`` a thread where given, else of BLOCK_MID's), or None where ``op`` on
    ``src -> dst`` rows in ``pack``-element packs has none on compute capability ``arch`` (the
    fused residual norms keep the other paths)."""
    entry = BLOCK_MID.get((op, ITEMSIZE[src], ITEMSIZE[dst]))
    if entry is None or residual or arch < BLOCK_MID_MIN_ARCH or not full_packs(src, dst, pack):
        return None
    allowed, fewest = values or entry[0], entry[1]
    best = None
    for per_thread in allowed:
        threads = _cdiv(_cdiv(cols, per_thread), 32) * 32
        waste = threads * per_thread - cols
        if fewest <= threads <= BLOCK_THREADS[-1] and waste <= cols // 8:
            key = (waste, per_thread)
            if best is None or key < best[0]:
                best = (key, threads, per_thread)
    return None if best is None else (best[1], best[2])


def auto_block_config(op: str, src: str, dst: str, cols: int, pack: int, arch: int,
                      residual: bool = False) -> tuple[int, int] | None:
    """(threads, values per thread) of the block-register path where the dispatcher takes it by
    itself (rows past the warp path's), else None: rows up to the family's BLOCK_MAX_COLS, or
    unpadded rows in full packs of at most BLOCK_TARGET_VALUES a thread on blocks of at most
    512 threads (past BLOCK_MID_PAST_COLS' column count, its BLOCK_MID block instead where one
    holds the row), else a BLOCK_MID block, else the same on BLOCK_WIDE_THREADS."""
    family = kernel_head(op, src, dst, residual)[0]
    isz, cbytes = ITEMSIZE[src], compute_bytes(src, dst)
    block_max = (NORM_BLOCK_MAX_COLS if family == "norm" else BLOCK_MAX_COLS)[isz]
    bcfg = block_config(cols, pack, cbytes, family, block_threads(family, src, dst, pack))
    if bcfg is not None and not (cols <= block_max or (
            full_packs(src, dst, pack) and cols <= BLOCK_UNPADDED_MAX_COLS[isz]
            and bcfg[1] <= BLOCK_TARGET_VALUES and bcfg[0] * bcfg[1] - cols <= cols // 8)):
        bcfg = None
    if bcfg is not None and bcfg[0] <= BLOCK_THREADS[-1]:
        rule = BLOCK_MID_PAST_COLS.get((op, isz, ITEMSIZE[dst]))
        if rule is not None and cols > rule[0]:
            return block_mid_config(op, src, dst, cols, pack, arch, residual, (rule[1],)) or bcfg
        return bcfg
    return block_mid_config(op, src, dst, cols, pack, arch, residual) or bcfg


def _choose_row_path(op: str, family: str, src: str, dst: str, rows: int, cols: int,
                     pack: int, cbytes: int, props: DeviceProps, residual: bool = False) -> str:
    isz = ITEMSIZE[src]
    narrow = narrow_groups(src, dst, pack, cols, residual)
    if cols <= WARP_MAX_COLS[isz] and warp_config(cols, pack, cbytes, family,
                                                  narrow) is not None:
        return "warp"
    if rows <= BLOCK_MAX_ROWS and auto_block_config(op, src, dst, cols, pack, props.arch,
                                                    residual) is not None:
        return "block"
    smem_max = (LAYER_NORM_SMEM_MAX_COLS if op == "layer_norm" else SMEM_MAX_COLS)[isz]
    if (cols <= smem_max or not props.has_clusters) and smem_config(
            cols, pack, isz, props, (1,)) is not None:
        return "smem"
    clusters = row_cluster_sizes(props)
    cfg = smem_config(cols, pack, isz, props, clusters) if clusters else None
    if cfg is not None and cfg[1] <= SMEM_SLICE_MAX_BYTES:
        return "cluster"
    return "uncached"  # the largest cluster with larger slices measured slower than reading twice


def row_cluster_sizes(props: DeviceProps) -> tuple[int, ...]:
    """Cluster sizes the row paths may use on ``props`` (none below sm_90)."""
    if not props.has_clusters:
        return ()
    return tuple(c for c in ROW_CLUSTER_SIZES if c <= props.max_cluster)


def _uncached_cluster(row_bytes: int, props: DeviceProps) -> int:
    """Blocks sharing one uncached row: 1, or on sm_90 the smallest cluster whose slices are at
    most UNCACHED_SLICE_MAX_BYTES, else the largest (row_cluster_sizes)."""
    clusters = row_cluster_sizes(props)
    if not clusters or row_bytes <= UNCACHED_SLICE_MAX_BYTES:
        return 1
    return next((c for c in clusters if _cdiv(row_bytes, c) <= UNCACHED_SLICE_MAX_BYTES),
                clusters[-1])


def _plan_smem(family: str, head: str, src: str, rows: int, cols: int, pack: int,
               props: DeviceProps, occ: Occupancy, want_cluster: bool,
               residual: bool = False, weight_bytes: int = 0) -> LaunchPlan:
    if want_cluster and not props.has_clusters:
        raise ValueError(f"path 'cluster' needs sm_90 or newer; device is sm_{props.arch}")
    cfg = smem_config(cols, pack, ITEMSIZE[src], props,
                      row_cluster_sizes(props) if want_cluster else (1,),
                      family == "norm" and ITEMSIZE[src] in NORM_PORTABLE_CLUSTER_ITEMSIZES)
    if cfg is None:
        path = "cluster" if want_cluster else "smem"
        raise ValueError(f"path {path!r} cannot cache cols={cols} of {src} in shared memory")
    cluster, smem = cfg
    name = (f"cunorm::{family}_smem<{head}, {pack}>" if cluster == 1 else
            f"cunorm::{family}_smem_cluster<{head}, {pack}, {cluster}>")
    # Occupancy is asked of the kernel that runs. A cluster kernel may need more registers than
    # the cluster-free one (nvcc 13, sm_90: bfloat16 softmax with 8-element packs, 40 alone and
    # 54 in a cluster of 8), and a block size sized for the smaller count left 64 KB slices
    # at 2 resident blocks per SM instead of 3.
    # A one-block residual row of 4- or 8-byte elements goes into shared memory through
    # registers (x + r formed and written to h on the way: rows.cuh rows_smem), two packs at a
    # time, so a thread with fewer packs waits fewer rounds: of two sizes with as many resident
    # threads, the larger. H200, weight and bias, one process (benchmarks/results/nvidia-h200-
    # 2026-11-26-staged-loads-profile.txt): layer_norm float32 (16384, 12288) 256 x 4 3777
    # GB/s against 512 x 2 4118, rms_norm 3885 / 4130 (unstaged, layer_norm 3825 / 3908); 16-bit
    # rows (half the packs) keep the smaller: layer_norm float16 (16384, 12288) 256 x 6 4071
    # against 512 x 3 4005.
    carveout = -1
    if family == "norm":
        larger = residual and cluster == 1 and ITEMSIZE[src] >= 4
        block, per_sm = pick_block_threads(name, smem, occ, larger)
        if cluster == 1 and weight_bytes and per_sm > 0:
            resident, carveout = weight_l1_residency(props, per_sm, smem, weight_bytes)
            if carveout >= 0:
                block, per_sm = pick_block_threads(
                    name, smem, lambda k, b, s: min(occ(k, b, s), resident), larger)
    else:
        block, per_sm = pick_block(name, smem, occ)
    if per_sm <= 0:
        raise ValueError(f"path 'smem' does not fit: {smem} bytes of shared memory per block")
    if cluster == 1:
        return LaunchPlan("smem", name, min(rows, MAX_GRID), block, smem, carveout=carveout)
    return LaunchPlan("cluster", name, min(rows, MAX_GRID // cluster) * cluster, block, smem)


# --- the weight of a one-block rms_norm row in L1 -------------------------------------------
# An SM's L1 and shared memory are one array, split by the driver at launch: left alone it
# takes the smallest shared-memory capacity that holds the resident blocks, and the rest is
# L1. A one-block rms_norm row reads its weight from global memory in the store loop, once a
# row; where the L1 left beside the blocks cannot hold the weight (and the row's own loads),
# every row fetches it from L2 again. Fewer resident blocks in a smaller split keep it. H200,
# 49152 rows, GB/s, tree (driver's split) -> 2 blocks under a 57% hint (132 KiB split, 124 KiB
# of L1), torch.compile alongside (.exp carve3; benchmarks/results/nvidia-h200-2026-11-26-
# l1-weight-profile.txt): float16 32768 cols (3 blocks in the 196 KiB split: 60 KiB of L1 for
# a 64 KB weight) 4052 -> 4305 (torch.compile 4297), bfloat16 4013 -> 4310 (4215); 30720
# 4186 -> 4314, 4165 -> 4310; 28672 4172 -> 4314, 4143 -> 4310; 26624 (3 blocks, 164 KiB
# split, 92 KiB of L1 for 52 KB) 4299 -> 4305, 4298 -> 4299. Splits larger than the driver's
# lost up to 3% (20480-24576 cols). Not for the residual form (float16 32768 on 2 blocks
# 4232 -> 3850: its rows read and write twice as much, and 3 blocks hide more of it) nor for
# layer_norm (weight and bias; float16 24576 on fewer blocks 3853 -> 3620), nor for rows held
# in registers (block path, no shared memory: any hint lost 12-17% at 16384 columns), nor for
# cluster slices (6 resident blocks of 32 KB in the 228 KiB split, 28 KiB of L1 for a 32 KB
# weight slice, beat 3 blocks under 57% by 6-10%: float16 65536 3914 -> 3698). A plan
# does not know whether the call passes a weight; without one, the same rows on 2 blocks ran
# 1% faster (float16 32768: 4270 -> 4315; with it 4101 -> 4320, the shipped plan, same
# process: .exp l1check). Since rms_norm's kernels lost their bias code and some registers
# (common.cuh kParamsNoBias), an SM may hold one more block of narrower rows than before, in a
# split that pushes the weight out; the rule keeps those rows on as many blocks as before,
# under a hint (tests/test_gpu_norm.py test_weight_l1_plans_in_any_order).
#: (unified L1 and shared memory, the shared-memory capacities it can be split into) per SM,
#: KiB, by compute capability (NVIDIA's Hopper tuning guide). Other architectures keep the
#: driver's split.
L1_SMEM_SPLITS_KIB = {90: (256, (0, 8, 16, 32, 64, 100, 132, 164, 196, 228))}
#: L1 the row's own loads want beside the weight: 28672 columns lost 3% with 4 KiB to spare
#: (60 KiB of L1 for 56 KB), 24576 columns none with 44 KiB (92 for 48).
L1_WEIGHT_MARGIN = 32 << 10


def weight_l1_residency(props: DeviceProps, per_sm: int, block_smem: int,
                        weight_bytes: int) -> tuple[int, int]:
    """(resident blocks, carveout percent) that keep a one-block row's weight in L1.

    Parameters
    ----------
    props : DeviceProps
        Target device (``L1_SMEM_SPLITS_KIB`` must list its compute capability).
    per_sm : int
        Resident blocks per SM the occupancy oracle allows.
    block_smem : int
        Dynamic shared memory of one block, bytes (the driver reserves
        ``smem_per_sm - smem_per_block_optin`` more a block).
    weight_bytes : int
        Bytes of the weight every row reads.

    Returns
    -------
    (int, int)
        ``(per_sm, -1)`` where the driver's own split keeps the weight, none of at least 2
        blocks does or the device is not listed; else the most blocks (at least 2) whose
        smallest split leaves ``weight_bytes + L1_WEIGHT_MARGIN`` of L1, and the hint that
        asks for that split (rounded down: the driver rounds a hint up to a split).

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h200 = DeviceProps("fake", (9, 0), 132, 2048, 232448, 233472, 140 << 20)
    >>> weight_l1_residency(h200, 3, 65536, 65536)  # float16 rows of 32768 columns
    (2, 57)
    >>> weight_l1_residency(h200, 3, 53248, 53248)  # 26624: 92 KiB of L1 beside 3 blocks
    (3, -1)
    """
    split = L1_SMEM_SPLITS_KIB.get(props.arch)
    if split is None:
        return per_sm, -1
    unified, capacities = split[0] << 10, [c << 10 for c in split[1]]
    footprint = block_smem + props.smem_per_sm - props.smem_per_block_optin

    def l1_left(blocks: int) -> tuple[int, int]:  # (L1 bytes, split) of the smallest split
        capacity = next(c for c in capacities if c >= blocks * footprint)
        return unified - capacity, capacity

    if per_sm * footprint > capacities[-1]:  # no split holds them: the oracle knows better
        return per_sm, -1
    if l1_left(per_sm)[0] >= weight_bytes + L1_WEIGHT_MARGIN:  # the driver's split keeps it
        return per_sm, -1
    for blocks in range(per_sm - 1, 1, -1):
        left, capacity = l1_left(blocks)
        if left >= weight_bytes + L1_WEIGHT_MARGIN:
            return blocks, capacity * 100 // capacities[-1]
    return per_sm, -1


# --- strided (outer, dim, inner) --------------------------------------------------------
def plan_strided(op: str, src: str, dst: str, outer: int, dim: int, inner: int,
                 align_elems: int, props: DeviceProps, occ: Occupancy,
                 force: str | None = None) -> LaunchPlan:
    """Plan a softmax over the middle axis of an (outer, dim, inner) view, inner > 1.

    A tile is ``tx_count * pack`` consecutive inner positions over the whole of dim, reduced by
    a block of STRIDED_BLOCK threads (on sm_90 a cluster of blocks, each owning a slice of
    dim). Cached, the tile's (dim, width) slab sits in shared memory: the first of
    (STRIDED_MIN_TILE_BYTES tiles, wider when dim is short, in slices of at most
    STRIDED_SLICE_PREFERRED_BYTES), (STRIDED_NARROW_TILE_BYTES tiles, the same), then both
    within STRIDED_SLICE_MAX_BYTES, on the smallest cluster that holds it; otherwise x is read
    twice in narrow tiles, dim split over the smallest cluster whose slices would fit.

    Examples
    --------
    >>> from cunorm._device import DeviceProps
    >>> h100 = DeviceProps("fake", (9, 0), 132, 2048, 232448, 233472, 50 << 20)
    >>> p = plan_strided("softmax", "float32", "float32", 32, 21, 65536, 4, h100,
    ...                  lambda k, b, s: 2)
    >>> p.path, p.tx_count
    ('strided-cached', 64)
    >>> plan_strided("softmax", "float16", "float16", 4, 8192, 512, 8, h100,
    ...              lambda k, b, s: 2).kernel
    'cunorm::softmax_strided_cluster<cunorm::half_t, cunorm::half_t, false, 8, true, 8, 2>'
    """
    if op not in SOFTMAX_OPS:
        raise ValueError(f"no strided kernel for {op}; expected one of {SOFTMAX_OPS}")
    _, head = kernel_head(op, src, dst)
    isz = ITEMSIZE[src]
    pack = max_pack(inner, max(isz, ITEMSIZE[dst]), align_elems)
    cbytes = compute_bytes(src, dst)
    tx_cap = min(STRIDED_BLOCK, _next_pow2(_cdiv(inner, pack)))

    def tx_for(tile_bytes: int) -> int:
        return min(tx_cap, max(1, tile_bytes // (pack * isz)))

    tx_want = STRIDED_BLOCK // min(STRIDED_BLOCK, _next_pow2(_cdiv(dim, STRIDED_ROWS_PER_THREAD)))
    tx_wide = min(tx_cap, max(tx_for(STRIDED_MIN_TILE_BYTES), tx_want))
    tx_narrow = min(tx_wide, tx_for(STRIDED_NARROW_TILE_BYTES))
    clusters = (1, *CLUSTER_SIZES) if props.has_clusters else (1,)

    def states_bytes(tx: int, c: int) -> int:
        # softmax_strided_impl: a MaxSum row per warp's worth of ty, the final row, and on a
        # cluster the mail rows
        state_row = tx * pack * 2 * cbytes
        return (STRIDED_BLOCK // max(tx, 32) + 1 + (c if c > 1 else 0)) * state_row

    def slice_bytes(tx: int, c: int) -> int:
        return _cdiv(dim, c) * tx * pack * isz

    def cached_bytes(tx: int, c: int) -> int:
        # a cluster block holds its first STRIDED_HELD_ROWS rows a thread in registers
        held = STRIDED_HELD_ROWS * (STRIDED_BLOCK // tx) if c > 1 else 0
        return max(0, _cdiv(dim, c) - held) * tx * pack * isz

    def fits(tx: int, c: int, limit: int) -> bool:
        return cached_bytes(tx, c) <= min(limit, _smem_capacity(props) - states_bytes(tx, c))

    cached = next(((tx, c) for limit in (STRIDED_SLICE_PREFERRED_BYTES, STRIDED_SLICE_MAX_BYTES)
                   for tx in dict.fromkeys((tx_wide, tx_narrow)) for c in clusters
                   if fits(tx, c, limit)), None)
    path = force or ("strided-cached" if cached is not None else "strided")
    if path == "strided-cached":
        if cached is None:
            raise ValueError(f"path 'strided-cached' cannot cache dim={dim} in shared memory")
        tx, cluster = cached
        smem = states_bytes(tx, cluster) + cached_bytes(tx, cluster)
        cache, held = "true", STRIDED_HELD_ROWS
    elif path == "strided":
        tx = tx_narrow
        cluster = next((c for c in clusters if slice_bytes(tx, c) <= STRIDED_SLICE_MAX_BYTES),
                       clusters[-1])
        smem = states_bytes(tx, cluster)
        cache, held = "false", 0
    else:
        raise ValueError(f"unknown strided path {path!r}; expected one of {STRIDED_PATHS}")
    name = (f"cunorm::softmax_strided<{head}, {pack}, {cache}>" if cluster == 1 else
            f"cunorm::softmax_strided_cluster<{head}, {pack}, {cache}, {cluster}, {held}>")
    if occ(name, STRIDED_BLOCK, smem) <= 0:
        raise ValueError(f"path {path!r} does not fit: {smem} bytes of shared memory per block")
    tiles = outer * _cdiv(inner, tx * pack)
    return LaunchPlan(path, name, min(tiles, MAX_GRID // cluster) * cluster, STRIDED_BLOCK,
                      smem, tx)


# --- every instantiation ----------------------------------------------------------------
def _row_heads() -> list[tuple[str, str, str, str, int, int, bool, str]]:
    """(family, head, src, dst, pack item size, compute bytes, residual, op) of every row-kernel
    head (softmax's two ops share the family, not the head)."""
    out = []
    for src, dst in KERNEL_DTYPE_PAIRS:
        for op in SOFTMAX_OPS:
            out.append((*kernel_head(op, src, dst), src, dst,
                        max(ITEMSIZE[src], ITEMSIZE[dst]), compute_bytes(src, dst), False, op))
    for src in CTYPE:
        for op in NORM_OPS:
            for residual in (False, True):
                out.append((*kernel_head(op, src, src, residual), src, src, ITEMSIZE[src],
                            compute_bytes(src, src), residual, op))
    return out


def all_kernel_names(arch: int) -> list[str]:
    """Every kernel name the planners above can emit for compute capability ``arch``, forced
    paths included (nvcc compile test, ``python -m cunorm.precompile``)."""
    names: set[str] = set()
    clusters = CLUSTER_SIZES if arch >= 90 else ()
    row_clusters = ROW_CLUSTER_SIZES if arch >= 90 else ()
    for family, head, src, dst, isz, cbytes, residual, op in _row_heads():
        for pack in (p for p in (1, 2, 4, 8) if p * isz <= 16):
            for cols in range(pack, 64 * pack * 32 + 1, pack):
                cfg = warp_config(cols, pack, cbytes, family,
                                  narrow_groups(src, dst, pack, cols, residual))
                if cfg is not None:
                    names.add(warp_kernel(family, head, pack, cfg, False))
                    if warp_exact(op, src, dst, pack, cols, cfg, residual):
                        names.add(warp_kernel(family, head, pack, cfg, True))
            threads = block_threads(family, src, dst, pack)
            top = max(BLOCK_THREADS[-1] * BLOCK_MAX_VALUES[cbytes],
                      BLOCK_WIDE_THREADS[-1] * BLOCK_TARGET_VALUES)
            for cols in range(BLOCK_THREADS[0], top + 1, pack * 32):
                bcfg = block_config(cols, pack, cbytes, family, threads)
                if bcfg is not None:
                    names.add(block_kernel(family, head, pack, bcfg[1], False))
                    # its exact variant, named by the row that fills these threads
                    if block_exact(op, src, dst, pack, bcfg[0] * bcfg[1], bcfg, residual):
                        names.add(block_kernel(family, head, pack, bcfg[1], True))
            for path in ("smem", "uncached"):
                names.add(f"cunorm::{family}_{path}<{head}, {pack}>")
                names.update(f"cunorm::{family}_{path}_cluster<{head}, {pack}, {c}>"
                             for c in row_clusters)
            if family == "softmax":
                for cache in ("true", "false"):
                    names.add(f"cunorm::softmax_strided<{head}, {pack}, {cache}>")
                    held = STRIDED_HELD_ROWS if cache == "true" else 0
                    names.update(f"cunorm::softmax_strided_cluster<{head}, {pack}, {cache}, {c}, "
                                 f"{held}>" for c in clusters)
    for (op, isz_src, isz_dst), (values, _) in BLOCK_MID.items():
        for src, dst in KERNEL_DTYPE_PAIRS if arch >= BLOCK_MID_MIN_ARCH else ():
            if (ITEMSIZE[src], ITEMSIZE[dst]) == (isz_src, isz_dst):
                family, head = kernel_head(op, src, dst)
                pack = 16 // max(isz_src, isz_dst)
                for v in values:
                    names.add(block_kernel(family, head, pack, v, False))
                    threads = BLOCK_THREADS[-1]  # BLOCK_MID blocks have at most these
                    if block_exact(op, src, dst, pack, threads * v, (threads, v)):
                        names.add(block_kernel(family, head, pack, v, True))
    from ._attn_dispatch import all_kernel_names as attention_kernel_names
    from ._grad_dispatch import all_grad_kernel_names, all_norm_grad_kernel_names

    names.update(attention_kernel_names(arch))
    names.update(all_grad_kernel_names(arch))
    names.update(all_norm_grad_kernel_names(arch))
    return sorted(names)
