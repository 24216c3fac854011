"""The attention planner (:mod:`cunorm._attn_dispatch`) on fake devices: kernel choice per
dtype and head dim, shared memory, grid, split-KV choice and forcing, bad plans."""

from __future__ import annotations

import dataclasses

import pytest

from cunorm import _attn_dispatch as a
from cunorm import _dispatch
from cunorm._device import DeviceProps

H100 = DeviceProps("fake H100", (9, 0), 132, 2048, 232448, 233472, 50 << 20)
A100 = DeviceProps("fake A100", (8, 0), 108, 2048, 166912, 167936, 40 << 20)
SMALL = DeviceProps("fake small", (8, 0), 16, 2048, 49152, 65536, 4 << 20)


def occ2(kernel: str, block: int, smem: int) -> int:
    return 2


@pytest.mark.parametrize(("d", "dp"), [(1, 32), (32, 32), (33, 64), (64, 64), (80, 96),
                                       (128, 128), (129, 160), (256, 256)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_kernel_per_head_dim(dtype: str, d: int, dp: int) -> None:
    """mma.sync kernel (attn_tc) on sm_80 for every head dim."""
    p = a.plan_attention(dtype, d, d, 1000, 1000, 2, 8, 1, A100, occ2, splits=1)
    bn, mw = a.TC_TILES[dp]
    assert p.kernel == f"cunorm::attn_tc<{_dispatch.CTYPE[dtype]}, {dp}, {bn}, {mw}, 1, 2>"
    assert p.block == a.TC_THREADS and p.smem == (64 * mw + 4 * bn) * dp * 2
    assert p.row_tiles == -(-1000 // (64 * mw)) and p.grid == (p.row_tiles * 16, 1, 1)
    assert p.kernel in a.all_kernel_names(80) and p.combine in a.all_kernel_names(80)
    assert "attn_wg" not in " ".join(a.all_kernel_names(80))


@pytest.mark.parametrize(("d", "dv", "dp", "groups"), [
    (33, 33, 64, 1), (64, 64, 64, 1), (80, 80, 128, 2), (128, 128, 128, 2), (64, 129, 192, 2),
    (256, 256, 256, 2)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_warpgroup_kernel_on_sm90(dtype: str, d: int, dv: int, dp: int, groups: int) -> None:
    """attn_wg: one-warpgroup blocks at head dim 64, two above (non-causal)."""
    p = a.plan_attention(dtype, d, dv, 1000, 1000, 2, 8, 1, H100, occ2, splits=1)
    bn = a.WG_TILES[dp, groups]
    assert p.kernel == f"cunorm::attn_wg<{_dispatch.CTYPE[dtype]}, {dp}, {bn}, {groups}>"
    assert p.block == 128 * groups
    assert p.smem == (64 * groups + 4 * bn) * dp * 2 + 1024 <= H100.smem_per_block_optin
    if groups == 1:  # two blocks per SM
        assert 2 * (p.smem + 1024) <= H100.smem_per_sm
    assert p.row_tiles == -(-1000 // (64 * groups)) and p.grid == (p.row_tiles * 16, 1, 1)
    assert p.kernel in a.all_kernel_names(90)


@pytest.mark.parametrize(("dp", "lk", "causal", "groups"), [
    (64, 512, False, 1), (64, 65536, False, 1), (64, 1024, True, 1), (64, 1025, True, 1),
    (128, 512, False, 2), (128, 512, True, 1), (128, 513, True, 2), (192, 512, True, 2),
    (256, 100, True, 2)])
def test_warpgroups_per_block(dp: int, lk: int, causal: bool, groups: int) -> None:
    """One warpgroup at D = 64 and on short causal rows, two otherwise; no one-warpgroup
    kernel past D = 128."""
    assert a.wg_groups(dp, lk, causal) == groups
    with a.force_warp_specialized(False):
        p = a.plan_attention("bfloat16", dp, dp, lk, lk, 1, 4, 2, H100, occ2, causal=causal)
    assert p.kernel.endswith(f", {groups}>") and p.block == 128 * groups


@pytest.mark.parametrize(("dp", "lk", "causal", "persistent"), [
    (64, 512, False, False),   # one warpgroup, non-causal: the co-resident block covers
    (64, 512, True, True), (64, 4096, True, True), (64, 4097, True, False),
    (128, 513, False, True), (128, 4096, False, True), (128, 4097, False, False),
    (128, 512, True, True),    # one warpgroup, causal
    (192, 1024, False, True), (256, 1024, True, False)])  # no persistent loop at 256
def test_persistent_grids(dp: int, lk: int, causal: bool, persistent: bool) -> None:
    """A grid of the resident blocks for two-warpgroup blocks or causal rows up to
    WG_PERSISTENT_MAX_KEYS keys, when the row tiles outnumber them; a block per row tile
    otherwise, for split-KV launches and where fewer row tiles than resident blocks exist."""
    with a.force_warp_specialized(False):
        p = a.plan_attention("bfloat16", dp, dp, lk, lk, 8, 8, 1, H100, occ2, causal=causal)
    assert p.items == p.row_tiles * 64 and p.splits == 1
    resident = H100.sm_count * 2
    assert p.grid == ((resident if persistent else p.items), 1, 1)
    few = a.plan_attention("bfloat16", dp, dp, lk, lk, 1, 1, 1, H100, occ2, causal=causal)
    assert few.grid == (few.items, 1, few.splits)
    with a.force_split(2):
        split = a.plan_attention("bfloat16", dp, dp, lk, lk, 8, 8, 1, H100, occ2, causal=causal)
    assert split.grid == (split.items, 1, 2)


def test_persistent_dims_match_the_kernel_source() -> None:
    """The planner's WG_PERSISTENT_MAX_DIM is the head dim up to which attn_wg compiles its
    persistent loop (attention.cu kPersistent): past it a persistent grid would leave row
    tiles undone."""
    import re
    from pathlib import Path

    src = (Path(__file__).parents[1] / "cuda_src" / "attention.cu").read_text()
    found = re.findall(r"constexpr bool kPersistent = DP <= (\d+);", src)
    assert found == [str(a.WG_PERSISTENT_MAX_DIM)]


def test_forced_persistent() -> None:
    """force_persistent sets the grid of warpgroup plans (never above the row tiles, never
    for split-KV launches or past WG_PERSISTENT_MAX_DIM, never on sm_80), is part of the plan
    memo key, and refuses anything but None or an int >= 0."""
    with a.force_persistent(3):
        assert a.forced_choices() == (None, None, 3, None, None)
        assert a.plan_attention("float16", 64, 64, 1000, 1000, 2, 8, 1, H100, occ2).grid \
            == (3, 1, 1)
        assert a.plan_attention("float16", 64, 64, 64, 64, 1, 2, 1, H100, occ2).grid \
            == (2, 1, 1)
        for dp, dev in ((256, H100), (64, A100)):
            p = a.plan_attention("float16", dp, dp, 1000, 1000, 2, 8, 1, dev, occ2)
            assert p.grid == (p.items, 1, p.splits)
    with a.force_persistent(0):
        assert a.plan_attention("float16", 64, 64, 4096, 4096, 8, 8, 1, H100, occ2,
                                causal=True).grid == (4096, 1, 1)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="blocks must be an int >= 0 or None"):
            with a.force_persistent(bad):
                pass


def test_forced_warpgroups() -> None:
    """force_warpgroups overrides the rule where the kernel exists and is part of the plan
    memo key; bad counts are refused."""
    assert a.forced_choices() == (None, None, None, None, None)
    for forced in (1, 2):
        with a.force_warpgroups(forced), a.force_split(3):
            assert a.forced_choices() == (3, forced, None, None, None)
            for dp in (64, 128):
                p = a.plan_attention("float16", dp, dp, 512, 512, 1, 4, 1, H100, occ2)
                assert p.kernel.endswith(f", {forced}>")
            p = a.plan_attention("float16", 256, 256, 512, 512, 1, 4, 1, H100, occ2)
            assert p.kernel.endswith(", 2>")
    assert a.forced_choices() == (None, None, None, None, None)
    with pytest.raises(ValueError, match="groups must be 1, 2 or None"):
        with a.force_warpgroups(3):
            pass


def occ1(kernel: str, block: int, smem: int) -> int:
    return 1


@pytest.mark.parametrize(("dtype", "d", "dp"), [("bfloat16", 128, 128), ("float16", 80, 128),
                                                ("bfloat16", 64, 64), ("float16", 40, 64)])
def test_warp_specialized_kernel(dtype: str, d: int, dp: int) -> None:
    """attn_ws: head dims 64 and 128 (padded) on sm_90 whose row tiles fill the SMs, for any
    row length; a persistent grid but for long causal rows; never with a forced split,
    warpgroup count or grid, never on sm_80, past D = 128 or on rows too few to fill the GPU;
    force_warp_specialized overrides the rule."""
    bn, stages, cw, q_stages = a.WS_TILES[dp]
    ws = f"cunorm::attn_ws<{_dispatch.CTYPE[dtype]}, {dp}, {bn}, {stages}, {cw}, {q_stages}>"
    for lk, causal in ((512, False), (4096, False), (16384, False), (512, True), (16384, True)):
        p = a.plan_attention(dtype, d, d, lk, lk, 16384 // lk, 2048 // dp, 1, H100, occ1,
                             causal=causal)
        assert p.kernel == ws and ws in a.all_kernel_names(90) and ws not in a.all_kernel_names(80)
        assert p.block == 128 * (cw + 1) and p.splits == 1 and p.cluster == 1
        assert p.row_tiles == -(-lk // (64 * cw))
        assert p.items == p.row_tiles * (16384 // lk) * (2048 // dp)
        assert p.smem == ((64 * cw * q_stages + 2 * stages * bn) * dp * 2 + 1024
                          + 8 * (2 * q_stages + 4 * stages))
        assert p.smem <= H100.smem_per_block_optin
        persistent = not (causal and lk > a.WG_PERSISTENT_MAX_KEYS)
        assert p.grid == ((H100.sm_count if persistent else p.items), 1, 1), (lk, causal)
    # rows that cannot fill the SMs (4 x 128-row tiles), forced choices, other head dims / archs
    few = a.plan_attention(dtype, d, d, 512, 16384, 1, 1, 1, H100, occ1)
    assert few.kernel.startswith("cunorm::attn_wg<") and few.splits > 1
    for force in (a.force_split(1), a.force_warpgroups(2), a.force_persistent(0),
                  a.force_warp_specialized(False)):
        with force:
            assert "attn_ws" not in a.plan_attention(dtype, d, d, 16384, 16384, 1, 16, 1, H100,
                                                     occ1).kernel
    assert "attn_ws" not in a.plan_attention(dtype, d, d, 16384, 16384, 1, 16, 1, A100, occ1).kernel
    assert "attn_ws" not in a.plan_attention(dtype, 256, 256, 16384, 16384, 1, 16, 1, H100,
                                             occ1).kernel
    with a.force_warp_specialized(True):
        assert a.forced_choices() == (None, None, None, True, None)
        assert a.plan_attention(dtype, d, d, 512, 512, 1, 1, 1, H100, occ1).kernel == ws
    with pytest.raises(ValueError, match="enabled must be True, False or None"):
        with a.force_warp_specialized(1):
            pass


@pytest.mark.parametrize(("lq", "heads", "groups"), [(16384, 16, None), (512, 1, 2), (512, 1, 1)])
@pytest.mark.parametrize("dp", [64, 128])
def test_explicit_mask_picks_the_masked_build(lq: int, heads: int, groups: int | None,
                                              dp: int) -> None:
    """An explicit mask takes the same plan but the kernel built with the mask's code (trailing
    template argument ``true``), listed for sm_90; without one, the default build. attn_tc and
    attn_simt have one build for both."""
    def plan(masked: bool):
        with a.force_warpgroups(groups):
            return a.plan_attention("float16", dp, dp, lq, lq, 1, heads, 1, H100, occ1,
                                    masked=masked)

    plain, masked = plan(False), plan(True)
    assert plain.kernel.startswith(("cunorm::attn_ws<", "cunorm::attn_wg<"))
    assert not plain.kernel.endswith(", true>")
    assert masked.kernel == plain.kernel[:-1] + ", true>"
    assert dataclasses.replace(masked, kernel=plain.kernel) == plain
    assert masked.kernel in a.all_kernel_names(90) and plain.kernel in a.all_kernel_names(90)
    for arch_props in (A100, H100):
        small = a.plan_attention("float16", 32, 32, 512, 512, 1, 8, 1, arch_props, occ1,
                                 masked=True, causal=True)
        assert small.kernel.startswith("cunorm::attn_tc<") and "true" not in small.kernel


@pytest.mark.parametrize("dp", [64, 128, 256])
def test_zero_or_negative_scale_takes_attn_tc(dp: int) -> None:
    """The warpgroup kernels fold the scale into the exponent after the row max of the
    unscaled scores, right for a positive scale only: a zero or negative one plans attn_tc,
    whatever is forced."""
    def plan(positive: bool):
        return a.plan_attention("bfloat16", dp, dp, 4096, 4096, 4, 16, 1, H100, occ1,
                                scale_positive=positive)

    assert plan(True).kernel.startswith(("cunorm::attn_ws<", "cunorm::attn_wg<"))
    assert plan(False).kernel.startswith("cunorm::attn_tc<")
    assert not a.uses_wgmma("bfloat16", dp, dp, 4096, 90, scale_positive=False)
    with a.force_warp_specialized(True), a.force_warpgroups(2):
        assert plan(False).kernel.startswith("cunorm::attn_tc<")


@pytest.mark.parametrize(("d", "lq", "group", "kernel"), [
    (128, 1, 8, "attn_tc"),     # decoding: 8 rows per KV head
    (128, 16, 4, "attn_wg"),    # 64 rows per KV head
    (128, 63, 1, "attn_tc"),
    (32, 1000, 1, "attn_wg"),   # small head dims run padded to 64
    (1, 64, 1, "attn_wg"),
])
def test_warpgroup_or_mma_sync_on_sm90(d: int, lq: int, group: int, kernel: str) -> None:
    p = a.plan_attention("bfloat16", d, d, lq, 4096, 1, 8, group, H100, occ2, splits=1)
    assert p.kernel.startswith(f"cunorm::{kernel}<")
    if kernel == "attn_wg":
        assert p.kernel.startswith(f"cunorm::attn_wg<cunorm::bf16_t, {max(64, d)},")


@pytest.mark.parametrize("d", [1, 16, 32])
@pytest.mark.parametrize(("lk", "causal", "kernel"), [
    (512, True, "attn_tc"),      # short causal rows keep mma.sync at small head dims
    (513, True, "attn_ws"),
    (512, False, "attn_ws"),
    (16384, True, "attn_ws"),
])
def test_small_head_dims_padded_but_short_causal_rows(d: int, lk: int, causal: bool,
                                                      kernel: str) -> None:
    """Head dims up to WG_MAX_SMALL_DIM run the warpgroup kernels padded to 64 (they are bound
    by the softmax there, not by the MMAs), but causal rows of at most WG_CAUSAL_SHORT_KEYS
    keys stay on attn_tc; past the small dims the causal rule does not apply."""
    def plan(dim: int, masked: bool = False):
        return a.plan_attention("float16", dim, dim, lk, lk, 16384 // lk, 32, 1, H100, occ1,
                                causal=causal, masked=masked)

    assert plan(d).kernel.startswith(f"cunorm::{kernel}<")
    if kernel == "attn_ws":
        assert plan(d).kernel == plan(64).kernel
        assert plan(d, masked=True).kernel == plan(64).kernel[:-1] + ", true>"
    else:
        assert plan(d, masked=True).kernel == plan(d).kernel  # attn_tc: one build
    assert plan(33).kernel.startswith("cunorm::attn_ws<")
    assert a.uses_wgmma("float16", d, d, lk, 90, causal=causal, lk=lk) == (kernel != "attn_tc")


@pytest.mark.parametrize(("dtype", "dv", "per_lane"), [("float32", 64, 2), ("float64", 256, 8),
                                                       ("float32", 33, 2), ("float64", 1, 1)])
def test_simt_kernel(dtype: str, dv: int, per_lane: int) -> None:
    p = a.plan_attention(dtype, 40, dv, 9, 70, 1, 2, 3, H100, occ2, splits=1)
    assert p.kernel == f"cunorm::attn_simt<{_dispatch.CTYPE[dtype]}, {per_lane}>"
    assert p.row_tiles == -(-27 // a.SIMT_ROWS) and p.smem == a.simt_smem(40, dv, 8)


@pytest.mark.parametrize(("d", "lq", "group", "ks"), [
    (128, 1, 4, 4),    # decoding, 4 query heads per KV head: 4 rows
    (64, 2, 8, 4),     # 16 rows: still one m16 tile
    (128, 17, 1, 1),   # 17 rows: 64-row tiles
    (160, 1, 4, 1),    # 32-key tiles cannot split into k16 steps 4 ways
    (32, 1, 1, 4),
])
def test_key_split_for_decoding(d: int, lq: int, group: int, ks: int) -> None:
    """At most 16 query rows per KV head: the 4 warps share one 16-row tile and split each
    key tile (attn_tc's KS = 4), with a 16-row Q tile in shared memory."""
    for dev in (A100, H100):
        p = a.plan_attention("float16", d, d, lq, 4096, 2, 8, group, dev, occ2, splits=1)
        dp = a.padded_head_dim(d, d)
        stages = a.TC_KEY_SPLIT_STAGES if ks > 1 else 2
        assert p.kernel == a.tc_kernel("cunorm::half_t", dp, ks, dev.arch)
        assert p.kernel.endswith(f", {ks}, {stages}>")
        assert p.smem == ((64 // ks) + 2 * stages * a.tc_block_n(dp, ks, dev.arch)) * dp * 2
        assert p.row_tiles == -(-lq * group // (64 // ks))
        assert p.kernel in a.all_kernel_names(dev.arch)


def test_decoding_key_tiles() -> None:
    """The key-split kernel takes TC_KEY_SPLIT_TILES' 128-key tiles at head dim 128 on sm_90
    only: not at other head dims, not without the key split, not on other parts."""
    assert a.tc_block_n(128, a.TC_KEY_SPLIT, 90) == 128
    assert a.tc_block_n(64, a.TC_KEY_SPLIT, 90) == a.tc_block_n(128, 1, 90) == 64
    assert a.tc_block_n(128, a.TC_KEY_SPLIT, 80) == a.tc_block_n(128, a.TC_KEY_SPLIT, 100) == 64
    assert a.tc_smem(128, a.TC_KEY_SPLIT, arch=90) == (16 + 2 * 2 * 128) * 128 * 2  # 131 KB + Q


def test_grouped_query_rows_are_flattened() -> None:
    """G query heads x Lq rows per KV head share a row tile: decoding with 8 query heads per
    KV head is one tile per (batch, KV head)."""
    p = a.plan_attention("bfloat16", 128, 128, 1, 64, 4, 4, 8, H100, occ2, splits=1)
    assert p.row_tiles == 1 and p.grid == (16, 1, 1)


def test_split_kv_when_rows_cannot_fill_the_gpu() -> None:
    decode = a.plan_attention("float16", 128, 128, 1, 131072, 1, 8, 4, H100, occ2)
    # 128-key tiles (TC_KEY_SPLIT_TILES) on sm_90
    assert decode.splits == a.choose_splits(8, 131072 // 128, 264) == 32
    assert decode.kernel == "cunorm::attn_tc<cunorm::half_t, 128, 128, 1, 4, 2>"
    prefill = a.plan_attention("float16", 128, 128, 4096, 4096, 4, 16, 1, H100, occ2)
    assert prefill.splits == 1
    short = a.plan_attention("float16", 64, 64, 1, 100, 1, 1, 1, H100, occ2)
    assert short.splits == 1  # 2 key tiles: not worth splitting
    assert a.choose_splits(1, 12_800, 10_000) == a.MAX_SPLITS
    assert a.choose_splits(1, 7, 100) == 7 // a.MIN_TILES_PER_SPLIT


@pytest.mark.parametrize(("row_blocks", "key_tiles", "resident", "splits"), [
    (8, 2048, 396, 49),   # 50 would leave 4 blocks of 41 tiles for a second wave
    (8, 256, 396, 43),    # 43 x 6 tiles: the fewest splits at 6 tiles a block
    (32, 2048, 396, 12),  # 13 would overflow the 396 slots
    (100, 1000, 396, 3),
    (300, 1000, 396, 1),  # 2 splits: two waves of half the tiles, no faster
    (8, 2048, 132, 16),
])
def test_splits_fit_one_wave(row_blocks: int, key_tiles: int, resident: int,
                             splits: int) -> None:
    """The split count minimizes waves x key tiles per block, so no second wave of a few
    blocks runs alone, and takes the fewest splits at that cost."""
    s = a.choose_splits(row_blocks, key_tiles, resident)
    assert s == splits
    assert row_blocks * s <= resident or s == 1
    assert -(-key_tiles // s) < -(-key_tiles // max(1, s - 1)) or s == 1


def test_cluster_merges_decoding_splits(monkeypatch) -> None:
    """Decoding rows that would take at least TC_CLUSTER key splits of at most
    TC_CLUSTER_MAX_TILES key tiles take exactly that many, as one cluster that merges them
    (attn_tc_cluster): no workspace, no attn_combine. Not where the device's clusters are
    smaller, the split is forced, the rows are longer or fill the GPU, or the path is another
    kernel's."""
    h200 = DeviceProps("fake H200", (9, 0), 132, 2048, 232448, 233472, 50 << 20, max_cluster=16)
    decode = a.plan_attention("bfloat16", 128, 128, 1, 4096, 1, 8, 4, h200, occ2)
    assert decode.kernel == a.tc_cluster_kernel("cunorm::bf16_t", 128)
    assert decode.kernel == ("cunorm::attn_tc_cluster<cunorm::bf16_t, 128, 64, "
                             f"{a.TC_CLUSTER_STAGES}, 16>")
    assert decode.grid == (8, 1, 16) and decode.splits == decode.cluster == 16
    assert not decode.needs_combine
    assert decode.smem == a.tc_smem(128, a.TC_KEY_SPLIT, a.TC_CLUSTER_STAGES)
    assert decode.kernel in a.all_kernel_names(90)
    assert decode.kernel not in a.all_kernel_names(80)
    unsplit = a.plan_attention("bfloat16", 128, 128, 1, 4096, 1, 8, 4, H100, occ2)
    assert unsplit.cluster == 1 and unsplit.needs_combine
    assert unsplit.kernel == a.tc_kernel("cunorm::bf16_t", 128, a.TC_KEY_SPLIT, 90)
    with a.force_split(16):
        forced = a.plan_attention("bfloat16", 128, 128, 1, 4096, 1, 8, 4, h200, occ2)
    assert forced.cluster == 1 and forced.kernel == a.tc_kernel("cunorm::bf16_t", 128, 4, 90)
    long = a.plan_attention("bfloat16", 128, 128, 1, 4160, 1, 8, 4, h200, occ2)  # 65 tiles
    assert long.cluster == 1 and long.needs_combine
    batched = a.plan_attention("bfloat16", 128, 128, 1, 4096, 32, 8, 4, h200, occ2)
    assert batched.cluster == 1 and batched.splits < a.TC_CLUSTER
    assert a.plan_attention("float32", 128, 128, 1, 4096, 1, 8, 4, h200, occ2).cluster == 1
    assert a.plan_attention("bfloat16", 160, 160, 1, 4096, 1, 8, 4, h200, occ2).cluster == 1
    # Blocks an SM by shared memory, as on an H200: the cluster rule is asked with the 64-key
    # kernel's three blocks an SM, not the 128-key kernel's one, so every decoding row it
    # took before the wide tiles it still takes; longer rows take the wide tiles.
    def occ_by_smem(kernel, block, smem):
        return 1 if smem > 116 * 1024 else 3

    for lk, batch in ((2048, 1), (3000, 1), (4096, 1), (2048, 2), (4096, 3)):
        p = a.plan_attention("bfloat16", 128, 128, 1, lk, batch, 8, 4, h200, occ_by_smem)
        assert p.cluster == 16 and p.kernel == a.tc_cluster_kernel("cunorm::bf16_t", 128), lk
    wide = a.plan_attention("bfloat16", 128, 128, 1, 8192, 1, 8, 4, h200, occ_by_smem)
    assert wide.cluster == 1 and wide.splits == 16 and wide.smem == a.tc_smem(128, 4, arch=90)
    assert wide.kernel == "cunorm::attn_tc<cunorm::bf16_t, 128, 128, 1, 4, 2>"
    monkeypatch.setattr(a, "TC_CLUSTER", 0)
    assert a.plan_attention("bfloat16", 128, 128, 1, 4096, 1, 8, 4, h200, occ2).cluster == 1


def test_kv_stream_where_one_block_reads_each_kv_tile() -> None:
    """attn_tc with tiles of 64 keys or more on one row tile a (batch, KV head) (decoding: the
    key-split kernels, and KS = 1 rows up to 64; each K/V tile read by one block) reads K/V
    under L2 evict_first up
    to KV_STREAM_MAX_L2 times the L2's bytes of K/V (batch, KV heads and both head dims
    counted); no other plan does; force_kv_stream overrides the limit but not the kernel, is
    part of the plan memo key, and refuses non-bools."""
    h200 = DeviceProps("fake H200", (9, 0), 132, 2048, 232448, 233472, 50 << 20, max_cluster=16)

    def limit_keys(dev=H100) -> int:  # B = 1, 8 KV heads, D = 128, 2 bytes
        return a.KV_STREAM_MAX_L2 * dev.l2_bytes // (8 * 2 * 128 * 2)

    def plan(lk: int, dev=H100, dtype="bfloat16", lq=1, batch=1, d=128, dv=128):
        return a.plan_attention(dtype, d, dv, lq, lk, batch, 8, 4, dev, occ2)

    for dev in (H100, h200, A100):
        assert plan(16384, dev).kv_stream and plan(limit_keys(dev), dev).kv_stream
        assert not plan(limit_keys(dev) + 1, dev).kv_stream and not plan(65536, dev).kv_stream
    assert plan(4096, h200).cluster > 1 and plan(4096, h200).kv_stream
    assert not plan(16384, batch=4).kv_stream  # 4 x 67 MB
    assert plan(limit_keys() // 4, batch=4).kv_stream
    assert plan(2 * limit_keys(), d=64, dv=64).kv_stream  # half the bytes a key
    assert not plan(2 * limit_keys() + 1, d=64, dv=64).kv_stream
    unequal = limit_keys() * 256 // (128 + 96)  # D = 128 and Dv = 96 both counted
    assert plan(unequal, dv=96).kv_stream and not plan(unequal + 1, dv=96).kv_stream
    assert not plan(16384, lq=1024).kv_stream  # 64-row tiles on warpgroup MMA
    assert not plan(16384, dtype="float32").kv_stream  # the SIMT kernel
    assert not plan(16384, A100, lq=17).kv_stream  # 68 rows a KV head: two 64-row tiles
    assert plan(16384, A100, lq=17).kernel == a.tc_kernel("cunorm::bf16_t", 128)
    for dev in (H100, A100):  # one 64-row tile of attn_tc with KS = 1; not on 32-key tiles
        assert plan(16384, dev, lq=8).kv_stream and not plan(16384, dev, d=256, dv=256).kv_stream
        assert plan(16384, dev, lq=8).kernel == a.tc_kernel("cunorm::bf16_t", 128)
    assert not plan(16384, lq=1024).kv_stream and not plan(16384, A100, lq=1024).kv_stream
    with a.force_kv_stream(True):
        assert a.forced_choices() == (None, None, None, None, True)
        assert plan(65536).kv_stream and not plan(16384, A100, lq=17).kv_stream
    with a.force_kv_stream(False):
        assert not plan(16384).kv_stream and not plan(4096, h200).kv_stream
    assert a.forced_choices() == (None, None, None, None, None)
    with pytest.raises(ValueError, match="enabled must be True, False or None"):
        with a.force_kv_stream(1):
            pass


def test_force_split() -> None:
    with a.force_split(5):
        assert a.forced_split() == 5
        assert a.plan_attention("float32", 8, 8, 4, 4, 1, 1, 1, H100, occ2).splits == 5
        with a.force_split(None):
            assert a.plan_attention("float32", 8, 8, 4, 4, 1, 1, 1, H100, occ2).splits == 1
    assert a.forced_split() is None
    for bad in (0, a.MAX_SPLITS + 1, 2.0):
        with pytest.raises(ValueError, match="force_split"), a.force_split(bad):
            pass


@pytest.mark.parametrize(("args", "message"), [
    (("int8", 64, 64), "no attention kernel for int8"),
    (("float16", 0, 64), "head dims must be in"),
    (("float16", 64, 257), "head dims must be in"),
])
def test_bad_plans(args, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        a.plan_attention(*args, 8, 8, 1, 1, 1, H100, occ2)


def test_shared_memory_limit() -> None:
    with pytest.raises(ValueError, match="shared memory"):
        a.plan_attention("float64", 256, 256, 8, 8, 1, 1, 1, SMALL, occ2)


def test_kernel_files_and_names() -> None:
    for arch in (80, 90):
        names = a.all_kernel_names(arch)
        # attn_wg / attn_ws: two dtypes, each built without and with the explicit mask's code
        wg = 2 * 2 * (len(a.WG_TILES) + len(a.WS_TILES)) if arch == 90 else 0
        key_split = sum(bn == 64 for bn, _ in a.TC_TILES.values())  # attn_tc KS = 4
        # attn_tc_cluster: the key-split head dims a cluster's blocks divide (sm_90)
        cluster = 2 * sum(bn == 64 and dp % a.TC_CLUSTER == 0
                          for dp, (bn, _) in a.TC_TILES.items()) if arch == 90 else 0
        # attn_tc KS = 4 with TC_KEY_SPLIT_TILES' wider tiles (sm_90)
        wide = 2 * len(a.TC_KEY_SPLIT_TILES) if arch == 90 else 0
        assert len(names) == len(set(names)) == 2 * (len(a.TC_TILES) + key_split) + wg \
            + cluster + wide + 2 * 8 + 4
        assert all(_dispatch.kernel_file(n) == "attention.cu" for n in names)
        assert set(names) <= set(_dispatch.all_kernel_names(arch))


@pytest.mark.parametrize(("struct", "name"), [("CombineArgs", "COMBINE_ARGS"),
                                              ("AttnArgs", "ATTN_ARGS")])
def test_argument_structs_match_the_kernel_source(struct: str, name: str) -> None:
    """The NumPy dtype the launcher passes by value has the C struct's fields, offsets and
    size (C layout: each field at its natural alignment)."""
    import re
    from pathlib import Path

    import numpy as np

    from cunorm import _attn_launch

    src = (Path(__file__).parents[1] / "cuda_src" / "attention.cu").read_text()
    body = re.search(r"struct " + struct + r" \{(.*?)\};", src, re.S)
    assert body is not None, struct
    sizes = {"i64": 8, "double": 8, "int": 4}
    fields, offset, align = [], 0, 1
    for decl in body.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        ctype, names = decl.split(None, 1)
        for field in (n.strip() for n in names.split(",")):
            size = sizes[ctype]
            offset = -(-offset // size) * size
            fields.append((field, offset, size))
            offset += size
            align = max(align, size)
    dtype = getattr(_attn_launch, name)
    assert [f[0] for f in fields] == list(dtype.names)
    for field, off, size in fields:
        assert dtype.fields[field][1] == off and dtype.fields[field][0].itemsize == size, field
    assert dtype.itemsize == -(-offset // align) * align
    assert np.zeros((), dtype)[()].nbytes == dtype.itemsize


def test_dependent_launch_structs_and_availability(monkeypatch) -> None:
    """cunorm._driver_launch's ctypes mirrors of cuda.h's CUlaunchAttribute and
    CUlaunchConfig have the C layout (64-bit host), and dependent launches are used from sm_90
    on, where the driver library has cuLaunchKernelEx."""
    import ctypes

    from cunorm import _driver_launch as _dl

    assert ctypes.sizeof(_dl.LaunchAttribute) == 72 and _dl.LaunchAttribute.value.offset == 8
    offsets = {f[0]: getattr(_dl.LaunchConfig, f[0]).offset for f in _dl.LaunchConfig._fields_}
    assert offsets == {"grid": 0, "block": 12, "shared_mem": 24, "stream": 32, "attrs": 40,
                       "num_attrs": 48}
    assert ctypes.sizeof(_dl.LaunchConfig) == 56
    monkeypatch.setattr(_dl, "_driver", lambda: object())
    assert _dl.available(90) and not _dl.available(80)
    monkeypatch.setattr(_dl, "_driver", lambda: None)  # no libcuda, or one before CUDA 12
    assert not _dl.available(90)


def test_dependent_launch_passes_its_arguments(monkeypatch) -> None:
    """A dependent KernelLaunch's fire hands cuLaunchKernelEx the grid, block, stream, the
    attribute and a parameter array whose entries point at each call's pointers and struct
    bytes (a stand-in driver reads them back as the real one would)."""
    import ctypes
    import types

    from cunorm import _attn_launch
    from cunorm import _driver_launch as _dl

    seen = []

    def launch(config, function, params, extra):
        cfg = config._obj
        attr = cfg.attrs[0]
        ptrs = [ctypes.c_uint64.from_address(params[i]).value for i in range(2)]
        struct = ctypes.string_at(params[2], _attn_launch.COMBINE_ARGS.itemsize)
        seen.append((tuple(cfg.grid), tuple(cfg.block), cfg.stream, cfg.num_attrs, attr.id,
                     attr.value.flag, function.value, ptrs, struct, extra))
        return 0

    monkeypatch.setattr(_dl, "_driver", lambda: types.SimpleNamespace(cuLaunchKernelEx=launch))
    monkeypatch.setattr(_dl, "_function", lambda kernel, device: kernel.kernel.ptr)
    kernel = types.SimpleNamespace(name="k", kernel=types.SimpleNamespace(ptr=0xABC))
    dep = _dl.KernelLaunch(kernel, 0, 32, 256,
                           (_dl.POINTER, _dl.POINTER, _attn_launch.COMBINE_ARGS.itemsize),
                           dependent=True)
    structs = {n: (_attn_launch._record(_attn_launch.COMBINE_ARGS, part_rows=32, splits=n,
                                        dv=128).tobytes(),) for n in (3, 7)}
    for n in (3, 3, 7, 3):  # the same tuple again, another, the first again
        dep.fire(0x77, (0x1000 * n, 0x2000 * n), structs[n])
        assert seen[-1] == ((32, 1, 1), (256, 1, 1), 0x77, 1,
                            _dl.PROGRAMMATIC_STREAM_SERIALIZATION, 1, 0xABC,
                            [0x1000 * n, 0x2000 * n], structs[n][0], None)


def test_kernel_launch_passes_its_arguments(monkeypatch) -> None:
    """An ordinary KernelLaunch hands cuLaunchKernel (CuPy's binding) its grid, block, shared
    memory, stream and a parameter array in the layout's order: pointers and by-value
    arguments interleaved (the norm kernels' layout), bound bytes kept, each call's values
    copied in (and read back as the driver would)."""
    import ctypes
    import types

    import numpy as np

    from cunorm import _driver_launch as _dl

    seen = []

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        entries = (ctypes.c_void_p * 5).from_address(params)
        words = [ctypes.c_uint64.from_address(entries[i]).value for i in (0, 1, 3)]
        seen.append((f, (gx, gy, gz), (bx, by, bz), smem, stream, words,
                     ctypes.string_at(entries[2], 4), ctypes.string_at(entries[4], 8), extra))

    monkeypatch.setattr(_dl, "_cupy_driver", lambda: types.SimpleNamespace(
        launchKernel=launch_kernel))
    monkeypatch.setattr(_dl, "_function", lambda kernel, device: kernel.kernel.ptr)
    kernel = types.SimpleNamespace(name="k", kernel=types.SimpleNamespace(ptr=0xDEF))
    bound = np.int32(-7).tobytes()
    launch = _dl.KernelLaunch(kernel, 0, (6, 2), 128, (_dl.POINTER, _dl.POINTER, bound, 8, 8),
                              shared_mem=4096)
    values = {n: (np.int64(n).tobytes(), np.float64(n / 4).tobytes()) for n in (3, 9)}
    for n in (3, 3, 9, 3):  # the same tuple again, another, the first again
        launch.fire(0x55, (0x100 * n, 0x200 * n), values[n])
        assert seen[-1] == (0xDEF, (6, 2, 1), (128, 1, 1), 4096, 0x55,
                            [0x100 * n, 0x200 * n, n], bound, values[n][1], 0)
    with pytest.raises(ValueError):
        launch.fire(0x55, (1, 2), values[3][:1])  # a value missing


def test_packed_arguments_by_kernel() -> None:
    """attn_tc and attn_simt take the AttnArgs struct; attn_wg and attn_ws plain parameters."""
    for arch in (80, 90):
        for name in a.all_kernel_names(arch):
            if "attn_combine" in name:
                continue
            assert a.packed_args(name) == ("attn_wg<" not in name and "attn_ws<" not in name), name
