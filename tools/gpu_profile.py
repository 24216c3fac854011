"""Host overhead and per-kernel profiles for the row paths (run on the GPU machine).

``python tools/gpu_profile.py overhead`` prints the host time per call of a small softmax;
``ncu ... python tools/gpu_profile.py kernels`` runs one launch of each representative shape;
``python tools/gpu_profile.py norms`` times layer_norm / rms_norm on every path that can take a
shape (GB/s, L2 flushed) and ``ncu ... python tools/gpu_profile.py norm-kernels`` runs one launch
of the short-row norm and softmax kernels for comparison; ``python tools/gpu_profile.py attention``
compares attention with torch's FlashAttention-2 backend (``attention-groups``: with one- and
two-warpgroup blocks forced, ``attention-grids``: each also on a block per row tile and on the
planner's grid) and ``ncu ... python tools/gpu_profile.py attention-kernels`` runs
one bf16 forward per head dim (``short-kernels``: forwards on short rows); ``decode-kernels``
one decoding call per KV length (for ncu), ``decode-stages`` decoding at each K/V pipeline
depth of the key-split kernel, ``decode-parts`` a decoding call against a read-only kernel over the
same bytes, ``decode-dependent`` decoding with the split-KV merge launched as a programmatic
dependent of the attention kernel and as an ordinary launch after it, ``decode-timeline``
the blocks and the merge of a decoding call placed in time by globaltimer stamps (built into
a copy of the sources); ``attention-overhead``
gives the host and GPU time of a decoding call with a cProfile of it, ``launch-cost`` the
host time of a CuPy launch by argument list;
``norm-variants`` times the norms' block kernels built with other resident-block counts;
``wide-blocks`` the 12288- and 16384-column rows on 768- and 1024-thread blocks,
``block-sizes`` rows on blocks of any whole number of warps against power-of-two blocks,
``smem-blocks`` the smem path at fixed block sizes;
``carveout`` the smem path under other L1 / shared-memory carveouts, ``affine-cost`` the norms
there with and without weight and bias (``affine-kernels``: one launch each, for ncu),
``compile-kernels`` short norm rows against torch.compile (GB/s, then one launch each for ncu;
``compile-long-kernels``: long rows),
``warp-groups`` short rows on narrower warp-path lane groups (``warp-blocks``: on smaller blocks,
``warp-packs``: on lanes of 4 packs, ``softmax-narrow``: softmax rows of 4-31 packs narrowed
or not, ``residual-narrow``: the residual norms' short rows narrowed or not,
``spread-rows``: norm rows of 8 packs on 2 or 4 rows a group or narrowed),
``fixed-cost`` the time a row-op call takes beyond its bytes (two sizes, a device copy of the
same bytes, and with its code and parameters brought back into L2 first), ``l2-keep`` every
bench cell with the row paths' x loads plain and under the L2 evict_last
policy (common.cuh load_pack_l2), ``ln32-cluster`` float32 layer_norm's cluster rows built
as before and after their resident-block change (cuda_src/norm.cu norm_cluster_blocks),
``prefetch-distance`` the rows whose stores prefetch parameters ahead at several distances,
``param-cost`` the same on the register paths' rows (49152 rows of 2048-12288 columns),
``long-affine-cost`` on 24576 rows of 1024-32768 columns;
``mid-blocks`` rows of 12288 and 16384 columns on 512-thread blocks of 24 or 32 values a
thread; ``long-row-variants`` the rows of 65536+ columns on forced paths and dispatcher variants
(``long-row-kernels``: one launch each, for ncu), ``cluster-blocks`` the norms' cluster
kernels built for other resident-block counts, ``uncached-rows`` rows of 4096-32768 columns
on the uncached path with a block per row, ``ln-long-slices`` layer_norm's rows of 32768+
columns on one block, 64 KB cluster slices and the uncached path, ``cluster-sizes`` rows of
512 KB on clusters of 16 first or portable ones only, ``norm-grad-clusters`` the norm
gradients on their cluster path, without it, and built without and with the L2 prefetch of
the next row everywhere, ``norm-grad-prefetch`` that prefetch over the shorter rows'
kernels and cluster layouts of float32 rows of 12288 and 24576 columns,
``softmax-grad-clusters`` the softmax gradients' cluster path in its layouts against the
block and uncached paths,
``row-sources`` the norms built from this checkout's kernel sources against those in folder
$CUNORM_BASE_SOURCES
(``short-block-sources``: the same for float32 rows of up to 8 values a thread on the block
path, ``short-blocks``: those rows on other block sizes, ``warp-edge-blocks``: 16-bit rows
of 1000-1536 columns on the block path against the warp path, ``warp-norm-sources``: the
norms' warp-path rows against $CUNORM_BASE_SOURCES, ``convert-sources``: bfloat16 rows,
``block-row-sources``: block-path rows of every row op, ``warp-row-sources``: warp-path
rows, ``residual-row-sources``: the fused residual norms' warp-path rows,
``smem-store-sources``: the norms' shared-memory and cluster rows);
``attention-tiles`` the D = 64 attention kernel with other key tiles, ``attention-sources``
attention built from this checkout's kernel sources against those in folder
$CUNORM_BASE_SOURCES
(``attention-persistent``: both on a block per row tile, then this checkout's on the planner's
persistent grid). The commands live in
profile_rows.py, profile_norms.py, profile_attention.py, profile_long_rows.py,
profile_grads.py and decode_timeline.py, helpers in profile_common.py.
"""

from __future__ import annotations

import os
import sys

import decode_timeline
import profile_attention as attn
import profile_grads as grads
import profile_long_rows as long
import profile_norms as norms
import profile_rows as rows
from profile_common import block_variants


def _against_base(**kwargs):
    """A command timing the row ops built from this checkout's sources against those in folder
    $CUNORM_BASE_SOURCES (profile_norms.row_sources with ``kwargs``)."""
    return lambda: norms.row_sources(os.environ["CUNORM_BASE_SOURCES"], **kwargs)


COMMANDS = {
    "overhead": rows.overhead, "kernels": rows.kernels, "strided": rows.strided,
    "strided-launch": lambda: rows.strided(True), "gaps": rows.gaps,
    "gap-kernels": rows.gap_kernels,
    "placement": rows.placement, "peer-kernels": rows.peer_kernels,
    "norms": norms.norms, "norm-kernels": norms.norm_kernels,
    "norm-variants": norms.norm_variants, "store-batch": norms.store_batch,
    "wide-blocks": lambda: block_variants(norms.WIDE_BLOCK_CASES, norms.WIDE_BLOCK_VARIANTS,
                                          24576),
    "block-sizes": lambda: block_variants(norms.BLOCK_SIZE_CASES, norms.BLOCK_SIZE_VARIANTS,
                                          49152),
    "smem-blocks": lambda: block_variants(norms.SMEM_BLOCK_CASES, norms.SMEM_BLOCK_VARIANTS,
                                          24576),
    "carveout": norms.carveout, "affine-cost": norms.affine_cost,
    "affine-kernels": norms.affine_kernels,
    "compile-kernels": norms.compile_kernels, "warp-groups": norms.warp_groups,
    "compile-long-kernels": lambda: norms.compile_kernels(cases=norms.LONG_COMPILE_CASES),
    "warp-blocks": lambda: norms.warp_groups(norms.WARP_BLOCK_VARIANTS),
    "warp-packs": lambda: norms.warp_groups(norms.WARP_PACK_VARIANTS, rounds=3,
                                            cases=norms.WARP_PACK_CASES),
    "param-cost": lambda: norms.affine_cost(49152, norms.PARAM_COST_CASES),
    "softmax-narrow": lambda: norms.warp_groups(norms.SOFTMAX_NARROW_VARIANTS,
                                                cases=norms.SOFTMAX_NARROW_CASES),
    "residual-narrow": lambda: norms.warp_groups(norms.RESIDUAL_NARROW_VARIANTS,
                                                 cases=norms.RESIDUAL_NARROW_CASES),
    "spread-rows": lambda: norms.warp_groups(norms.SPREAD_VARIANTS, cases=norms.SPREAD_CASES),
    "fixed-cost": rows.fixed_cost, "l2-keep": rows.l2_keep, "ln32-cluster": rows.ln32_cluster,
    "prefetch-distance": rows.prefetch_distance,
    "attention": attn.attention, "attention-kernels": attn.attention_kernels,
    "attention-groups": attn.attention_groups,
    "attention-grids": lambda: attn.attention_groups((512, 1024, 2048, 4096), (0, None)),
    "attention-tiles": attn.attention_tiles,
    "attention-sources": lambda: attn.attention_sources(os.environ["CUNORM_BASE_SOURCES"]),
    "row-sources": _against_base(),
    "short-block-sources": _against_base(cases=norms.SHORT_BLOCK_CASES),
    "short-blocks": lambda: block_variants(norms.SHORT_BLOCK_SIZE_CASES,
                                           norms.SHORT_BLOCK_VARIANTS, 49152),
    "warp-norm-sources": _against_base(cases=norms.WARP_NORM_CASES),
    "convert-sources": _against_base(cases=norms.CONVERT_CASES),
    "block-row-sources": _against_base(cases=norms.BLOCK_ROW_CASES),
    "warp-row-sources": _against_base(rounds=3, cases=norms.WARP_ROW_CASES),
    "residual-row-sources": _against_base(rounds=3, cases=norms.RESIDUAL_ROW_CASES),
    "smem-store-sources": _against_base(cases=norms.SMEM_STORE_CASES),
    "long-affine-cost": lambda: norms.affine_cost(24576, norms.LONG_AFFINE_CASES),
    "warp-edge-blocks": lambda: block_variants(norms.WARP_EDGE_CASES, norms.WARP_EDGE_VARIANTS,
                                               49152),
    "attention-persistent": lambda: attn.attention_sources(
        os.environ["CUNORM_BASE_SOURCES"], seqs=(512, 1024, 2048, 4096, 8192, 16384),
        persistent=True),
    "short-kernels": attn.short_kernels,
    "attention-overhead": attn.attention_overhead, "launch-cost": attn.launch_cost,
    "decode": attn.decode, "decode-kernels": attn.decode_kernels,
    "decode-stages": attn.decode_stages, "decode-parts": attn.decode_parts,
    "decode-dependent": attn.decode_dependent, "decode-timeline": decode_timeline.main,
    "mid-blocks": lambda: block_variants(norms.MID_BLOCK_CASES, norms.MID_BLOCK_VARIANTS),
    "long-row-variants": long.long_row_variants,
    "long-row-kernels": long.long_row_kernels, "cluster-blocks": long.cluster_blocks,
    "uncached-rows": long.uncached_rows, "ln-long-slices": long.ln_long_slices,
    "cluster-sizes": long.cluster_sizes, "norm-grad-clusters": grads.norm_grad_clusters,
    "norm-grad-prefetch": grads.norm_grad_prefetch,
    "softmax-grad-clusters": grads.softmax_grad_clusters,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python tools/gpu_profile.py COMMAND; COMMAND one of {sorted(COMMANDS)}")
    COMMANDS[sys.argv[1]]()
