"""The pure dispatcher (:mod:`cunorm._dispatch`) on fake devices with a fake occupancy oracle.

Every branch of ``plan_rows`` / ``plan_strided`` is exercised: warp (tiny rows and full warps),
the warp limit, block shared memory, clusters (sm_90), uncached rows, pack selection, forced
paths, and the guarantee that :func:`all_kernel_names` lists every kernel the planners emit
(what precompile and ``tests/test_nvcc.py`` rely on).
"""

from __future__ import annotations

import dataclasses
import doctest
import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from cunorm import _dispatch as d
from cunorm._device import DeviceProps

H100 = DeviceProps("fake H100", (9, 0), 132, 2048, 232448, 233472, 50 << 20)
A100 = DeviceProps("fake A100", (8, 0), 108, 2048, 166912, 167936, 40 << 20)
# Shared memory too small for long rows: they go uncached (or to a cluster on sm_90).
SMALL_80 = DeviceProps("fake small sm_80", (8, 0), 16, 2048, 16384, 16384, 4 << 20)
SMALL_90 = DeviceProps("fake small sm_90", (9, 0), 16, 2048, 16384, 16384, 4 << 20)
# The same sm_90 device allowing non-portable clusters of 16 blocks (H100 and H200 do).
H200 = DeviceProps("fake H200", (9, 0), 132, 2048, 232448, 233472, 50 << 20, max_cluster=16)
DEVICES = [H100, A100, SMALL_80, SMALL_90, H200]

PAIRS = list(d.KERNEL_DTYPE_PAIRS)
BAD_PAIRS = [("float32", "float16"), ("float32", "float64"), ("float16", "bfloat16"),
             ("bfloat16", "float16"), ("float64", "float32"), ("float16", "float64"),
             ("bfloat16", "float64"), ("float64", "float16")]
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def fake_occ(props: DeviceProps) -> Callable[[str, int, int], int]:
    """Resident blocks per SM limited by threads and shared memory only."""

    def occ(kernel: str, block: int, smem: int) -> int:
        assert kernel.startswith("cunorm::") and block > 0 and smem >= 0
        return min(props.max_threads_per_sm // block, props.smem_per_sm // max(smem, 1))

    return occ


def rows_plan(cols: int, src: str = "float32", dst: str | None = None, *, rows: int = 4096,
              align: int = 16, props: DeviceProps = H100, force: str | None = None,
              op: str = "softmax", occ=None) -> d.LaunchPlan:
    return d.plan_rows(op, src, dst or src, rows, cols, align, props, occ or fake_occ(props),
                       force)


def strided_plan(outer: int, dim: int, inner: int, src: str = "float32", dst: str | None = None,
                 *, align: int = 16, props: DeviceProps = H100, force: str | None = None,
                 op: str = "softmax", occ=None) -> d.LaunchPlan:
    return d.plan_strided(op, src, dst or src, outer, dim, inner, align, props,
                          occ or fake_occ(props), force)


def template_args(name: str) -> tuple[str, list[str]]:
    """``"cunorm::k<a, b, 3>"`` -> ``("cunorm::k", ["a", "b", "3"])``."""
    assert name.endswith(">"), name
    base, args = name[:-1].split("<", 1)
    return base, args.split(", ")


def block_values(name: str) -> int:
    """Values a thread of a block kernel: its last number (an exact variant's flag follows)."""
    return int([a for a in template_args(name)[1] if a.isdigit()][-1])


def warp_args(plan: d.LaunchPlan) -> tuple[int, int, int, int]:
    """(pack, values per thread, group width, rows per group) of a warp plan."""
    base, args = template_args(plan.kernel)
    assert plan.path == "warp" and base == "cunorm::softmax_warp", plan
    assert len(args) == 8 and args[7] in ("true", "false")
    return int(args[3]), int(args[4]), int(args[5]), int(args[6])


def pack_of(plan: d.LaunchPlan) -> int:
    return int(template_args(plan.kernel)[1][3])


def smem_capacity(props: DeviceProps) -> int:
    return props.smem_per_block_optin - d.STATIC_SMEM_RESERVE


# --- helpers ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cols", "itemsize", "align", "expected"),
    [
        (1024, 4, 16, 4), (1024, 2, 16, 8), (1024, 8, 16, 2), (1024, 2, 8, 8),
        (1020, 2, 16, 4), (1022, 2, 16, 2), (1021, 2, 16, 1), (1, 2, 16, 1),
        (1024, 2, 4, 4), (1024, 2, 2, 2), (1024, 2, 1, 1), (1024, 4, 2, 2),
        (1024, 2, 6, 2), (1024, 4, 12, 4), (24, 2, 16, 8), (12, 2, 16, 4),
    ],
)
def test_max_pack(cols: int, itemsize: int, align: int, expected: int) -> None:
    assert d.max_pack(cols, itemsize, align) == expected


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("align", [1, 2, 3, 4, 8, 16])
def test_max_pack_properties(itemsize: int, align: int) -> None:
    for cols in range(1, 300):
        pack = d.max_pack(cols, itemsize, align)
        assert pack * itemsize <= 16
        assert cols % pack == 0 and align % pack == 0
        wider = 2 * pack
        assert wider * itemsize > 16 or cols % wider or align % wider  # largest such pack


def test_pick_block_threads_most_resident_threads() -> None:
    """The norms' shared-memory plans, one block or a cluster: most resident threads, the
    smaller block on a tie, (block, 0) when nothing fits; softmax keeps pick_block."""
    assert d.pick_block_threads("k", 0, lambda k, b, s: {128: 8, 256: 6, 512: 3}[b]) == (256, 6)
    assert d.pick_block_threads("k", 0, lambda k, b, s: {128: 3, 256: 3, 512: 3}[b]) == (512, 3)
    assert d.pick_block_threads("k", 0, lambda k, b, s: 16 * 128 // b) == (128, 16)
    assert d.pick_block_threads("k", 0, lambda k, b, s: 0) == (128, 0)
    # the residual's one-block rows: the larger of two sizes with as many threads
    tie = {128: 8, 256: 4, 512: 2}
    assert d.pick_block_threads("k", 0, lambda k, b, s: tie[b]) == (128, 8)
    assert d.pick_block_threads("k", 0, lambda k, b, s: tie[b], larger_on_tie=True) == (512, 2)
    assert d.pick_block_threads("k", 0, lambda k, b, s: 0, larger_on_tie=True) == (128, 0)
    occ = lambda k, b, s: {128: 8, 256: 6, 512: 3}[b]  # noqa: E731
    assert rows_plan(12288, "float16", op="layer_norm", occ=occ).block == 256
    assert rows_plan(20480, "float16", op="softmax", occ=occ).block == 128
    assert rows_plan(12288, "float16", op="layer_norm", occ=occ, force="cluster").block == 256
    assert rows_plan(20480, "float16", op="softmax", occ=occ, force="cluster").block == 128


def test_pick_block_keeps_occupancy_of_smallest_block() -> None:
    table = {128: 8, 256: 8, 512: 4, 1024: 2}
    assert d.pick_block("cunorm::k", 0, lambda k, b, s: table[b]) == (256, 8)
    assert d.pick_block("cunorm::k", 0, lambda k, b, s: 16 * 128 // b) == (128, 16)
    assert d.pick_block("cunorm::k", 0, lambda k, b, s: 1) == (d.BLOCK_SIZES[-1], 1)
    assert d.pick_block("cunorm::k", 0, lambda k, b, s: 0) == (128, 0)


# --- warp path ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cols", "align", "pack", "group", "rows_per_group"),
    [
        (1, 16, 1, 1, 2), (2, 16, 2, 1, 2), (3, 16, 1, 4, 2), (4, 16, 4, 1, 2),
        (5, 16, 1, 8, 2), (6, 16, 2, 4, 2), (8, 16, 4, 2, 2), (12, 16, 4, 4, 2),
        (17, 16, 1, 32, 1), (31, 16, 1, 32, 1), (32, 1, 1, 32, 1), (32, 2, 2, 16, 2),
        (64, 2, 2, 32, 1), (9, 16, 1, 16, 2),
    ],
)
def test_warp_tiny_rows_float32(cols: int, align: int, pack: int, group: int,
                                rows_per_group: int) -> None:
    """float32 rows below WARP_GROUP_MIN_PACKS full packs, or in narrower packs: a pack a
    lane (test_warp_groups_narrow has the rest)."""
    plan = rows_plan(cols, align=align)
    assert warp_args(plan) == (pack, pack, group, rows_per_group)
    assert (plan.block, plan.smem, plan.tx_count) == (d.WARP_BLOCK, 0, 0)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_warp_tiny_rows_every_group_width(src: str, dst: str) -> None:
    """Rows up to 32 packs that the warp path does not narrow (WARP_GROUP_PACKS): one pack per
    lane, the narrowest power-of-two group that covers the row, two rows per group below a
    full warp."""
    widths = set()
    for align in (1, 16):
        for cols in range(1, 257):
            plan = rows_plan(cols, src, dst, align=align)
            pack, per_thread, group, rpg = warp_args(plan)
            narrowed = d.narrow_groups(src, dst, pack, cols) and (
                cols >= d.WARP_GROUP_MIN_PACKS["softmax"] * pack) and (
                (pack, -(-cols // pack)) not in d.WARP_GROUP_KEEP_TINY["softmax"])
            if cols > 32 * pack or narrowed:
                continue
            widths.add(group)
            assert per_thread == pack
            assert group * pack >= cols > group // 2 * pack
            assert rpg == (2 if group < 32 else 1)
    assert widths == {1, 2, 4, 8, 16, 32}


def _warp_row_config(op: str, src: str, cols: int, align: int = 16,
                     residual: bool = False) -> tuple[int, int, int, int]:
    """(pack, values per thread, group width, rows per group) of a warp plan of any op."""
    plan = d.plan_rows(op, src, src, 4096, cols, align, H100, fake_occ(H100), "warp", residual)
    args = template_args(plan.kernel)[1]
    return int(args[-5]), int(args[-4]), int(args[-3]), int(args[-2])


@pytest.mark.parametrize(("op", "residual"), [("softmax", False), ("log_softmax", False),
                                               ("layer_norm", False), ("rms_norm", False),
                                               ("layer_norm", True), ("rms_norm", True)])
@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32", "float64"])
def test_warp_exact_variant(op: str, src: str, residual: bool) -> None:
    """The warp path takes its exact kernel (rows.cuh rows_warp EXACT: no column predicates,
    no row loop) exactly where the row fills the lane group's full 16-byte packs, and only in
    a grid that covers every row, except the rows that load their parameters early without a
    residual in layer_norm (but 16-bit rows of 256 columns) and float64 rms_norm; the kernels
    it names are compiled (:func:`cunorm._dispatch.all_kernel_names`)."""
    listed = set(d.all_kernel_names(90))
    full = 16 // ITEMSIZE[src]
    exact_cols = set()
    for cols in range(1, 64 * full * 32 + 1):
        for align in (1, full):
            try:  # (no grid too small for the exact kernel: test_warp_exact_min_blocks)
                with d.override_constants({"WARP_EXACT_EARLY_SM_BLOCKS": 0}):
                    plan = d.plan_rows(op, src, src, 4096, cols, align, H100, fake_occ(H100),
                                       "warp", residual)
            except ValueError:  # the row does not fit the warp path's registers
                continue
            args = template_args(plan.kernel)[1]
            pack, per_thread, group = int(args[-5]), int(args[-4]), int(args[-3])
            exact = args[-1] == "true"
            # rows that load their parameters early keep the general kernel in layer_norm
            # (bias included; 16-bit rows of 256 columns excepted) and float64, not in
            # rms_norm's other dtypes
            early = (op == "layer_norm" or (op == "rms_norm" and src == "float64")) and (
                not residual and d.warp_early_params((per_thread, group, int(args[-2])))) and (
                not (op == "layer_norm" and ITEMSIZE[src] == 2 and per_thread * group == 256))
            assert exact == (pack == full and per_thread * group == cols and not early), (
                cols, align, plan)
            assert plan.kernel in listed, plan.kernel
            if exact:
                exact_cols.add(cols)
                assert pack == align
    assert {512, 1024} <= exact_cols  # the powers of two ML rows take
    if op == "layer_norm" and not residual:  # early parameters: 256 only, in 16-bit
        assert (256 in exact_cols) == (ITEMSIZE[src] == 2) and 128 not in exact_cols
    # A grid that cannot cover every row keeps the row loop.
    cols = 512
    with d.override_constants({"MAX_GRID": 16}):
        plan = d.plan_rows(op, src, src, 4096, cols, full, H100, fake_occ(H100), "warp",
                           residual)
    assert plan.grid == 16 and template_args(plan.kernel)[1][-1] == "false", plan



@pytest.mark.parametrize("src", ["float16", "bfloat16"])
def test_warp_exact_min_blocks(src: str) -> None:
    """16-bit layer_norm rows of 256 columns (16 lanes of 16 values, 4 rows a 64-thread
    block) take the exact kernel from WARP_EXACT_EARLY_SM_BLOCKS blocks an SM on; rms_norm's,
    the residual forms' and 512-column rows at any grid."""
    per_block = d.WARP_BLOCK // 16  # rows a block: groups of 16 lanes
    for dev in (H100, dataclasses.replace(H100, sm_count=78)):  # floor scales with the SMs
        edge = d.WARP_EXACT_EARLY_SM_BLOCKS * dev.sm_count * per_block  # smallest exact grid
        for op, cols, residual, rows, exact in [
                ("layer_norm", 256, False, edge - per_block, False),
                ("layer_norm", 256, False, edge, True), ("layer_norm", 256, False, 4 * edge, True),
                ("layer_norm", 256, True, 64, True), ("rms_norm", 256, False, 64, True),
                ("layer_norm", 512, False, 64, True), ("layer_norm", 128, False, 4 * edge, False)]:
            plan = d.plan_rows(op, src, src, rows, cols, 8, dev, fake_occ(dev), "warp", residual)
            assert (template_args(plan.kernel)[1][-1] == "true") == exact, (op, cols, rows, plan)
            if op == "layer_norm" and cols == 256 and not residual:
                assert per_block * plan.grid >= rows > per_block * (plan.grid - 1)


def test_warp_early_params_rule() -> None:
    """Groups of one row load a norm's parameters with the row from 64 to 256 columns, up to
    1024 for 16-bit rms_norm without a residual in full 16-byte packs, and from 32 for the
    16-bit norms in full packs on exact kernels (rows.cuh warp_early_params, norm.cu
    norm_warp_wide_early and norm_warp_tiny_early, whose numbers these mirror)."""
    assert d.warp_wide_early("rms_norm", "float16", 8)
    assert d.warp_wide_early("rms_norm", "bfloat16", 8)
    for op, src, pack, residual in [("rms_norm", "float16", 8, True),
                                    ("layer_norm", "float16", 8, False),
                                    ("rms_norm", "float16", 4, False),  # not full packs
                                    ("rms_norm", "bfloat16", 1, False),
                                    ("rms_norm", "float32", 4, False),
                                    ("rms_norm", "float64", 2, False),
                                    ("softmax", "bfloat16", 8, False)]:
        assert not d.warp_wide_early(op, src, pack, residual), (op, src, pack, residual)
    for cfg, narrow, wide in [((2, 32, 1), True, True), ((8, 32, 1), True, True),
                              ((16, 32, 1), False, True), ((32, 32, 1), False, True),
                              ((8, 32, 2), False, False), ((1, 32, 1), False, False),
                              ((40, 32, 1), False, False)]:
        assert d.warp_early_params(cfg) == narrow and d.warp_early_params(cfg, True) == wide, cfg
    # 32 columns (two lanes of 16 values): only where tiny
    for cfg, tiny in [((16, 2, 1), True), ((8, 4, 1), True), ((16, 2, 2), False),
                      ((8, 2, 1), False)]:
        assert not d.warp_early_params(cfg) and d.warp_early_params(cfg, tiny=True) == tiny, cfg
    for op, src, pack in [("rms_norm", "float16", 8), ("rms_norm", "bfloat16", 8),
                          ("layer_norm", "float16", 8), ("layer_norm", "bfloat16", 8)]:
        assert d.warp_tiny_early(op, src, pack), (op, src, pack)
    for op, src, pack in [("rms_norm", "float16", 4),  # not full packs
                          ("rms_norm", "float32", 4), ("layer_norm", "float64", 2),
                          ("softmax", "bfloat16", 8)]:
        assert not d.warp_tiny_early(op, src, pack), (op, src, pack)
    assert not d.warp_tiny_early("rms_norm", "float16", 8, exact=False)  # rows of 17-31 cols
    assert not d.warp_tiny_early("layer_norm", "float16", 8, exact=False)  # staged instead
    # the kernels' own rule, as written in the sources
    rows_cuh = (Path(d.__file__).parent.parent / "cuda_src" / "rows.cuh").read_text()
    assert ("rows == 1 && group * cols >= (tiny ? 32 : 64) && group * cols <= (wide ? 1024 : "
            "256)") in rows_cuh
    norm_cu = (Path(d.__file__).parent.parent / "cuda_src" / "norm.cu").read_text()
    assert "return rms && !residual && src_bytes == 2 && pack * src_bytes == 16;" in norm_cu
    assert "return src_bytes == 2 && pack * src_bytes == 16 && exact;" in norm_cu


def test_warp_stage_params_rule() -> None:
    """Warp-path blocks of 16-bit layer_norm rows without a residual, in full packs, one row a
    group and outside the early-parameter rows (group columns < 64 or > 256, or < 32 on the
    exact kernel, which loads them early from 32: norm.cu norm_warp_tiny_early), get the
    shared memory in which their kernel stages weight and bias (rows.cuh rows_warp STAGE): a
    block's threads x 2 parameters x values a lane x 2 bytes; every other warp plan gets none.
    The kernels' own rule (norm.cu norm_warp_stages_params) is checked as written."""
    staged = {}
    for op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
        for src in ("float16", "bfloat16", "float32", "float64"):
            for residual in ((False, True) if op in ("layer_norm", "rms_norm") else (False,)):
                for cols in (32, 48, 64, 200, 256, 264, 300, 512, 520, 768, 1000, 1024):
                    # 4096 rows: one grid covers them (exact kernels where the row fills its
                    # packs); MAX_GRID x 64 rows: the general kernel's row loop
                    for rows, align in itertools.product((4096, d.MAX_GRID * 64), (1, 2, 8)):
                        plan = d.plan_rows(op, src, src, rows, cols, align, H100,
                                           fake_occ(H100), "warp", residual)
                        args = template_args(plan.kernel)[1]
                        pack = int(args[-5])
                        cfg = (int(args[-4]), int(args[-3]), int(args[-2]))
                        exact = args[-1] == "true"
                        want = (op == "layer_norm" and not residual and src in ("float16",
                                "bfloat16") and pack == 8 and cfg[2] == 1
                                and not (32 if exact else 64) <= cfg[0] * cfg[1] <= 256)
                        assert plan.smem == (d.WARP_BLOCK * 2 * cfg[0] * 2 if want else 0), (
                            op, src, residual, cols, align, plan)
                        if want:
                            staged[(src, cols, exact)] = plan.smem
    assert staged[("float16", 1024, True)] == staged[("bfloat16", 1000, False)] == 8192
    assert staged[("float16", 512, True)] == 4096 and ("float16", 256, False) not in staged
    assert staged[("bfloat16", 32, False)] == 64 * 2 * 16 * 2
    assert ("bfloat16", 32, True) not in staged and ("float16", 48, False) not in staged
    with d.override_constants({"WARP_BLOCK": 128}):
        plan = d.plan_rows("layer_norm", "float16", "float16", 4096, 1024, 8, H100,
                           fake_occ(H100), "warp")
    assert plan.block == 128 and plan.smem == 16384, plan
    # layer_norm without both weight and bias stages nothing (norm.py keys its plans so)
    plan = d.plan_rows("layer_norm", "float16", "float16", 4096, 1024, 8, H100, fake_occ(H100),
                       "warp", params=False)
    assert plan.smem == 0 and plan.kernel.startswith("cunorm::norm_warp<"), plan
    norm_cu = (Path(d.__file__).parent.parent / "cuda_src" / "norm.cu").read_text()
    assert ("return !rms && !residual && src_bytes == 2 && pack * src_bytes == 16 && rows == 1 "
            "&&\n         !warp_early_params(cols, group, rows, false,\n"
            "                            norm_warp_tiny_early(src_bytes, pack, exact));"
            in norm_cu)


@pytest.mark.parametrize(("op", "residual"), [("softmax", False), ("layer_norm", False),
                                               ("rms_norm", False), ("layer_norm", True),
                                               ("rms_norm", True)])
@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32"])
def test_block_exact_variant(op: str, src: str, residual: bool) -> None:
    """The block path takes its kernel without column tests (rows.cuh rows_block EXACT)
    exactly where the row fills the block's full 16-byte packs at values a thread that
    BLOCK_EXACT lists for the op and dtype (layer_norm: bfloat16 at 16 values, float16 at 32);
    the kernels it names are compiled (:func:`cunorm._dispatch.all_kernel_names`)."""
    listed = set(d.all_kernel_names(90))
    full = 16 // ITEMSIZE[src]
    exact_cols = set()
    for cols in range(1024, 16384 + 1, 8):
        for align in (1, full):
            plan = d.plan_rows(op, src, src, 4096, cols, align, H100, fake_occ(H100), None,
                               residual)
            if plan.path != "block":
                continue
            args = template_args(plan.kernel)[1]
            exact = args[-1] == "true"
            per_thread = block_values(plan.kernel)
            assert exact == (not residual and per_thread in d.BLOCK_EXACT.get((op, src), ())
                             and align == full and plan.block * per_thread == cols), (
                cols, align, plan)
            assert plan.kernel in listed, plan.kernel
            if exact:
                exact_cols.add(cols)
    want = {"bfloat16": {2048, 4096, 5120, 8192}, "float16": {16384}}.get(src, set())
    if op == "layer_norm" and not residual:
        assert want <= exact_cols and bool(exact_cols) == bool(want), sorted(exact_cols)
    else:
        assert not exact_cols


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32", "float64"])
def test_warp_groups_narrow(op: str, src: str) -> None:
    """Rows of full packs from WARP_GROUP_MIN_PACKS packs on take the narrowest group whose
    lanes hold at most WARP_GROUP_PACKS packs (one row a group), except the norms' rows of
    WARP_SPREAD_PACKS packs in float compute, which take a lane a pack and WARP_SPREAD_ROWS
    rows a group, and the WARP_GROUP_KEEP_TINY rows, which keep a pack a lane and two
    rows a group; from 32 x WARP_GROUP_PACKS packs on, 32 lanes as before. Scalar packs
    never narrow; the residual norms' rows longer than RESIDUAL_NARROW_MAX_PACKS packs neither
    (:func:`test_residual_norms_narrow_short_rows_only`)."""
    family = "softmax" if op in d.SOFTMAX_OPS else "norm"
    most, least = d.WARP_GROUP_PACKS[family], d.WARP_GROUP_MIN_PACKS[family]
    full = 16 // ITEMSIZE[src]
    spread = d.WARP_SPREAD_PACKS.get(family, ()) if src != "float64" else ()
    seen = set()
    for npacks in range(least, 32 * most + 1):
        pack, per_thread, group, rpg = _warp_row_config(op, src, npacks * full)
        if (full, npacks) in d.WARP_GROUP_KEEP_TINY.get(family, ()):
            assert (pack, per_thread, group, rpg) == (full, full, npacks, 2), npacks
            continue
        if npacks in spread:
            assert (pack, per_thread, group) == (full, full, npacks)
            assert rpg == d.WARP_SPREAD_ROWS, rpg
            continue
        k = per_thread // pack
        assert pack == full and rpg == 1 and k <= most and group * k >= npacks, npacks
        assert group == 1 or (group // 2) * most < npacks, npacks  # the narrowest
        seen.add(group)
    assert seen == {g for g in (1, 2, 4, 8, 16, 32) if g * most >= least}
    # below the minimum, with scalar packs and with a residual: the groups of every other row
    with d.override_constants({"WARP_GROUP_PACKS": {}}):
        legacy = {(cols, align, res): _warp_row_config(op, src, cols, align, res)
                  for cols in (full * max(1, least - 1), 16 * full, 32 * full, 33)
                  for align in (1, 16) for res in ((False, True) if family == "norm" else (False,))}
    for (cols, align, res), cfg in legacy.items():
        pack = cfg[0]
        if pack == full and not res and cols >= least * pack:
            continue
        assert _warp_row_config(op, src, cols, align, res) == cfg, (cols, align, res)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32", "float64"])
def test_residual_norms_narrow_short_rows_only(op: str, src: str) -> None:
    """With a residual, rows of full packs up to RESIDUAL_NARROW_MAX_PACKS packs take the
    plain norm's narrowed groups; longer rows, and any row with the limit at 0, take the
    groups the dispatcher gives a row that may not narrow."""
    full = 16 // ITEMSIZE[src]
    limit = d.RESIDUAL_NARROW_MAX_PACKS
    narrowed_any = False
    for npacks in range(1, 33):
        cols = npacks * full
        with_residual = _warp_row_config(op, src, cols, residual=True)
        plain = _warp_row_config(op, src, cols)
        with d.override_constants({"WARP_GROUP_PACKS": {}}):
            unnarrowed = _warp_row_config(op, src, cols)
        with d.override_constants({"RESIDUAL_NARROW_MAX_PACKS": 0}):
            assert _warp_row_config(op, src, cols, residual=True) == unnarrowed, npacks
        assert with_residual == (plain if npacks <= limit else unnarrowed), npacks
        narrowed_any |= plain != unnarrowed and npacks <= limit
    assert narrowed_any  # the rule changes some row of every dtype


@pytest.mark.parametrize(
    ("src", "dst", "cols", "align", "pack", "per_thread"),
    [
        ("float32", "float32", 33, 16, 1, 2),
        ("float32", "float32", 132, 16, 4, 8),
        ("float32", "float32", 288, 16, 4, 12),
        ("float32", "float32", 288, 1, 1, 10),  # 9 packs per lane round up to 10
        ("float32", "float32", 900, 16, 4, 32),
        ("float32", "float32", 1023, 16, 1, 32),
        ("float32", "float32", 1024, 16, 4, 32),
        ("float16", "float16", 264, 16, 8, 16),
        ("float16", "float16", 1024, 16, 8, 32),
        ("float16", "float32", 1024, 16, 4, 32),  # the float32 output bounds the pack
        ("bfloat16", "bfloat16", 1000, 16, 8, 32),
        ("float64", "float64", 511, 16, 1, 16),
        ("float64", "float64", 512, 16, 2, 16),
        ("float64", "float64", 66, 16, 2, 4),
        ("float64", "float64", 330, 16, 2, 12),  # 11 values per lane, 6 packs
    ],
)
def test_warp_full_rows(src: str, dst: str, cols: int, align: int, pack: int,
                        per_thread: int) -> None:
    plan = rows_plan(cols, src, dst, align=align, force="warp")
    assert warp_args(plan) == (pack, per_thread, 32, 1)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_warp_full_rows_round_values_per_thread(src: str, dst: str) -> None:
    """Full warps hold ceil(cols / 32) values per lane rounded up to the next allowed
    pack count, never more than fits in registers."""
    cbytes = d.compute_bytes(src, dst)
    for align in (1, 2, 16):
        for cols in range(1, d.WARP_MAX_COLS[ITEMSIZE[src]] + 1):
            pack, per_thread, group, _ = warp_args(rows_plan(cols, src, dst, align=align))
            if cols <= 32 * pack:
                continue
            k = per_thread // pack
            assert per_thread % pack == 0 and k in d.WARP_PACKS_PER_THREAD and group == 32
            assert 32 * per_thread >= cols
            smaller = [j for j in d.WARP_PACKS_PER_THREAD if j < k]
            assert not smaller or 32 * smaller[-1] * pack < cols  # the smallest that covers
            assert per_thread <= d.WARP_MAX_VALUES_PER_THREAD[cbytes]


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", [H100, A100], ids=["sm90", "sm80"])
@pytest.mark.parametrize("align", [1, 16])
def test_warp_limit(src: str, dst: str, props: DeviceProps, align: int) -> None:
    limit = d.WARP_MAX_COLS[ITEMSIZE[src]]
    assert rows_plan(limit - 1, src, dst, align=align, props=props).path == "warp"
    assert rows_plan(limit, src, dst, align=align, props=props).path == "warp"
    assert rows_plan(limit + 1, src, dst, align=align, props=props).path != "warp"


def test_warp_grid_is_one_block_per_row_groups() -> None:
    assert d.WARP_BLOCK == 64
    # group 1, 2 rows per group: 64 / 1 * 2 = 128 rows per block
    assert rows_plan(1, rows=1000).grid == 8
    # group 32 (scalar packs), 1 row per group: 2 rows per block
    assert rows_plan(68, rows=1000, align=1).grid == 500
    assert rows_plan(68, rows=10**7, align=1).grid == 5_000_000
    assert rows_plan(68, rows=2**40, align=1).grid == d.MAX_GRID  # the kernel loops beyond it
    # group 16 (a float32 row of 128 cols on 2 packs a lane): 4 rows per block
    assert rows_plan(128, rows=1000).grid == 250


def test_forced_warp_too_long_raises() -> None:
    with pytest.raises(ValueError, match="warp.*cols=5000"):
        rows_plan(5000, force="warp")


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_forced_warp_up_to_register_budget(src: str, dst: str) -> None:
    """Forcing warp works while a row fits WARP_MAX_VALUES_PER_THREAD values per lane."""
    most = 32 * d.WARP_MAX_VALUES_PER_THREAD[d.compute_bytes(src, dst)]
    plan = rows_plan(most, src, dst, force="warp", align=1)
    assert warp_args(plan)[1] * 32 >= most
    with pytest.raises(ValueError, match=f"warp.*cols={most + 1}"):
        rows_plan(most + 1, src, dst, force="warp", align=1)


# --- block of registers -------------------------------------------------------------------
def block_args(plan: d.LaunchPlan) -> tuple[int, int]:
    """(pack, values per thread) of a block-register plan."""
    base, args = template_args(plan.kernel)
    assert plan.path == "block" and base == "cunorm::softmax_block" and len(args) == 5, plan
    return int(args[3]), int(args[4])


@pytest.mark.parametrize(
    ("src", "dst", "cols", "align", "threads", "pack", "per_thread"),
    [
        ("float32", "float32", 769, 16, 128, 1, 8),  # scalar packs: power-of-two blocks only
        ("float32", "float32", 1000, 16, 128, 4, 8),
        ("float32", "float32", 2048, 16, 128, 4, 16),
        ("float32", "float32", 2052, 16, 192, 4, 12),  # pads 252; 160 x 16 would pad 508
        ("float32", "float32", 4095, 16, 256, 1, 16),
        ("float32", "float32", 4096, 16, 256, 4, 16),
        ("float32", "float32", 8192, 16, 512, 4, 16),
        ("float32", "float32", 12288, 16, 512, 4, 24),  # float32 softmax: no 1024 threads
        ("float16", "float16", 4096, 16, 256, 8, 16),
        ("float16", "float16", 12288, 16, 512, 8, 24),  # 1024 x 16 would pad a third
        ("float16", "float16", 16384, 16, 1024, 8, 16),
        ("bfloat16", "bfloat16", 16384, 16, 1024, 8, 16),
        ("float16", "float32", 4096, 16, 256, 4, 16),
        ("bfloat16", "bfloat16", 3000, 16, 192, 8, 16),  # whole warps: 6 of them, pads 72
        ("float32", "float32", 5120, 16, 320, 4, 16),  # not 512 x 12 padding a fifth
        ("float64", "float64", 2000, 16, 128, 2, 16),
        ("float64", "float64", 8192, 16, 512, 2, 16),
    ],
)
def test_block_config_forced(src: str, dst: str, cols: int, align: int, threads: int,
                             pack: int, per_thread: int) -> None:
    """Least padding first, then values per thread nearest BLOCK_TARGET_VALUES."""
    plan = rows_plan(cols, src, dst, align=align, force="block", rows=77)
    assert (plan.block, *block_args(plan)) == (threads, pack, per_thread)
    assert plan.block * per_thread >= cols and plan.smem == 0 and plan.grid == 77


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_block_config_properties(src: str, dst: str) -> None:
    """Every (threads, values) choice covers the row within the register budget on a block
    size block_threads allows (whole warps for full 16-byte packs, powers of two otherwise;
    more than 512 threads only where block_wide allows them, at most BLOCK_TARGET_VALUES a
    thread), and pads at most 1/8 of the row whenever some choice does."""
    cbytes = d.compute_bytes(src, dst)
    isz = max(ITEMSIZE[src], ITEMSIZE[dst])
    for cols in range(64, d.BLOCK_WIDE_THREADS[-1] * d.BLOCK_TARGET_VALUES + 1, 7):
        for pack in (p for p in (1, 2, 4, 8) if p * isz <= 16 and cols % p == 0):
            sizes = d.block_threads("softmax", src, dst, pack)
            cfg = d.block_config(cols, pack, cbytes, "softmax", sizes)
            options = []
            for t in sizes:
                cap = d.BLOCK_MAX_VALUES[cbytes] if t <= 512 else d.BLOCK_TARGET_VALUES
                k = next((k for k in d.BLOCK_PACKS_PER_THREAD if k * pack * t >= cols), None)
                if k is not None and k * pack <= cap:
                    options.append((t, k * pack))
            if not options:
                assert cfg is None, (cols, pack)
                continue
            assert cfg in options, (cols, pack, cfg)
            threads, per_thread = cfg
            if any(t * v - cols <= cols // 8 for t, v in options):
                assert threads * per_thread - cols <= cols // 8, (cols, pack, cfg)


def test_block_threads_by_pack() -> None:
    """Whole warps from 128 to 512 threads for full 16-byte packs (plus 1024 where block_wide),
    128 / 256 / 512 for narrower ones."""
    assert d.block_threads("softmax", "float16", "float16", 8) == (*range(128, 513, 32), 1024)
    assert d.block_threads("softmax", "float32", "float32", 4) == tuple(range(128, 513, 32))
    assert d.block_threads("softmax", "float16", "float32", 4) == tuple(range(128, 513, 32))
    assert d.block_threads("norm", "float32", "float32", 4) == (*range(128, 513, 32), 1024)
    for family, src, pack in (("softmax", "float32", 1), ("norm", "float16", 4),
                              ("softmax", "float64", 1)):
        assert d.block_threads(family, src, src, pack) == (128, 256, 512)


def test_block_wide_pairs() -> None:
    """1024-thread blocks for 16-byte packs of the kernels written for an even number of
    resident 512-thread blocks (rows.cuh CUNORM_BLOCK_BOUNDS): 16-bit softmax, 16-bit and
    float32 norms; not the other softmax pairs, float64, or narrower packs."""
    assert d.block_wide("softmax", "float16", "float16", 8)
    assert d.block_wide("softmax", "bfloat16", "bfloat16", 8)
    assert not d.block_wide("softmax", "float16", "float16", 4)
    assert not d.block_wide("softmax", "float16", "float32", 4)
    assert not d.block_wide("softmax", "float32", "float32", 4)
    assert not d.block_wide("softmax", "float64", "float64", 2)
    for src, pack in (("float16", 8), ("bfloat16", 8), ("float32", 4)):
        assert d.block_wide("norm", src, src, pack)
        assert not d.block_wide("norm", src, src, pack // 2)
    assert not d.block_wide("norm", "float64", "float64", 2)
    with pytest.raises(ValueError, match="block.*cols=16384"):
        rows_plan(16384, "float16", "float32", force="block")


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_forced_block_beyond_registers_raises(src: str, dst: str) -> None:
    most = 512 * d.BLOCK_MAX_VALUES[d.compute_bytes(src, dst)]
    assert rows_plan(most, src, dst, force="block", align=1).path == "block"
    with pytest.raises(ValueError, match=f"block.*cols={most + 1}"):
        rows_plan(most + 1, src, dst, force="block", align=1)


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_block_path_rows_fit_32_bits(op: str) -> None:
    """The block kernels count rows in 32 bits: past BLOCK_MAX_ROWS a block-path row goes to
    the next path, and forcing the block path raises."""
    most = d.BLOCK_MAX_ROWS
    assert most + d.MAX_GRID < 2**32  # row + gridDim.x does not wrap
    assert rows_plan(2048, "float16", rows=most, op=op).path == "block"
    plan = rows_plan(2048, "float16", rows=most + 1, op=op)
    assert plan.path == "smem"
    assert plan.grid <= d.MAX_GRID
    assert rows_plan(2048, "float16", rows=most, op=op, force="block").path == "block"
    with pytest.raises(ValueError, match=f"block.*at most {most} rows, got {most + 1}"):
        rows_plan(2048, "float16", rows=most + 1, op=op, force="block")


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", DEVICES, ids=lambda p: p.name)
def test_block_path_between_warp_and_block_limits(src: str, dst: str,
                                                  props: DeviceProps) -> None:
    isz = ITEMSIZE[src]
    lo, hi = d.WARP_MAX_COLS[isz], d.BLOCK_MAX_COLS[isz]
    for cols in range(lo + 1, max(hi, lo) + 2):
        for align in (1, 16):
            plan = rows_plan(cols, src, dst, props=props, align=align)
            if cols <= hi:
                assert plan.path == "block", (cols, plan)
                _, per_thread = block_args(plan)
                assert per_thread <= d.BLOCK_MAX_VALUES[d.compute_bytes(src, dst)]
                assert plan.block * per_thread >= cols
            else:
                assert plan.path in ("smem", "cluster", "uncached"), (cols, plan)


def _register_max(isz: int) -> int:
    """Longest softmax row a register path may take."""
    return max(d.WARP_MAX_COLS[isz], d.BLOCK_MAX_COLS[isz], d.BLOCK_UNPADDED_MAX_COLS[isz])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_block_path_unpadded_rows(dtype: str) -> None:
    """Past BLOCK_MAX_COLS softmax keeps a row in registers only when the block pads it by at
    most an eighth with at most BLOCK_TARGET_VALUES a thread in full 16-byte packs (the kernels
    compiled for several resident blocks), up to BLOCK_UNPADDED_MAX_COLS (16384 cols in
    1024-thread blocks for 16-bit rows, 8192 for float32), and so do the norms (BLOCK_MID
    off here: test_block_mid_rows)."""
    with d.override_constants({"BLOCK_MID": {}}):
        _check_unpadded_rows(dtype)


def _check_unpadded_rows(dtype: str) -> None:
    isz = ITEMSIZE[dtype]
    plan = rows_plan(8192, dtype)
    assert plan.path == "block" and plan.block == 512 and block_args(plan)[1] == 16, plan
    for cols in range(d.BLOCK_MAX_COLS[isz] + 1, d.BLOCK_UNPADDED_MAX_COLS[isz] + 64, 61):
        plan = rows_plan(cols, dtype)
        pack = 16 // isz if cols % (16 // isz) == 0 else 1
        sizes = d.block_threads("softmax", dtype, dtype, pack)
        cfg = d.block_config(cols, pack, 4, "softmax", sizes)
        unpadded = (pack * isz == 16 and cfg is not None and cfg[1] <= d.BLOCK_TARGET_VALUES
                    and cfg[0] * cfg[1] - cols <= cols // 8)
        want = "block" if cols <= d.BLOCK_UNPADDED_MAX_COLS[isz] and unpadded else "smem"
        assert plan.path == want, (cols, plan)
    plan = rows_plan(5120, dtype)  # 320 x 16, where 512 x 12 would pad a fifth
    assert plan.path == "block" and plan.block == 320 and block_args(plan)[1] == 16, plan
    assert rows_plan(5121, dtype).path == "smem"  # scalar packs
    assert rows_plan(12288, dtype).path == "smem"  # 512 x 24 values, or 1024 x 16 padding 1/3
    wide16 = "block" if isz == 2 else "smem"  # float32 softmax has no 1024-thread blocks
    assert rows_plan(16384, dtype).path == wide16
    for op in ("layer_norm", "rms_norm"):  # the same rule for the norms
        assert rows_plan(8192, dtype, op=op).path == "block"
        plan = rows_plan(16384, dtype, op=op)
        assert plan.path == wide16 and (isz == 4 or plan.block == 1024), plan
        if 5121 > d.NORM_BLOCK_MAX_COLS[isz]:  # float32 norms take any row up to 8192
            assert rows_plan(5121, dtype, op=op).path == "smem"


# --- block shared memory and clusters -----------------------------------------------------
def _cluster_of(plan: d.LaunchPlan) -> int:
    """Blocks per row of an smem / cluster / uncached plan."""
    base, args = template_args(plan.kernel)
    expected = {"smem": ("cunorm::softmax_smem", 4), "uncached": ("cunorm::softmax_uncached", 4)}
    if (base, len(args)) == expected.get(plan.path):
        return 1
    assert (plan.path, base) in (("cluster", "cunorm::softmax_smem_cluster"),
                                 ("uncached", "cunorm::softmax_uncached_cluster")), plan
    assert len(args) == 5, plan
    return int(args[4])


def _slice_bytes(cols: int, pack: int, cluster: int, isz: int) -> int:
    return -(-(cols // pack) // cluster) * pack * isz


def _check_cached_plan(plan: d.LaunchPlan, cols: int, src: str, props: DeviceProps,
                       rows: int) -> None:
    """An smem / cluster plan caches its slice of the row in the input type, within the
    opt-in limit, one block (cluster) per row."""
    cluster = _cluster_of(plan)
    slice_ = _slice_bytes(cols, pack_of(plan), cluster, ITEMSIZE[src])
    assert plan.smem == slice_ <= smem_capacity(props)
    assert plan.block in d.BLOCK_SIZES
    assert plan.grid == min(rows, d.MAX_GRID // cluster) * cluster


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_smem_above_register_paths(src: str, dst: str) -> None:
    isz = ITEMSIZE[src]
    cols = 2 * _register_max(isz)
    plan = rows_plan(cols, src, dst, rows=50)
    isz_pack = max(ITEMSIZE[src], ITEMSIZE[dst])
    assert plan.path == "smem"
    assert template_args(plan.kernel)[1] == [d.CTYPE[src], d.CTYPE[dst], "false",
                                             str(16 // isz_pack)]
    _check_cached_plan(plan, cols, src, H100, 50)


@pytest.mark.parametrize(
    ("dtype", "cols", "block"),
    # rows of 24 KB, 40 KB, 80 KB: 9, 5, 2 resident blocks of 128 threads
    [("float64", 3000, 128), ("float32", 10001, 256), ("float32", 20000, 512)],
)
def test_smem_block_from_occupancy(dtype: str, cols: int, block: int) -> None:
    plan = rows_plan(cols, dtype, rows=10**6)
    assert (plan.path, plan.block, plan.smem, plan.grid) == (
        "smem", block, ITEMSIZE[dtype] * cols, 10**6)
    if cols % 4 == 1:  # scalar packs: no BLOCK_MID block; 10000 in full packs takes one
        assert rows_plan(cols - 1, dtype).path == "block"


def expected_cluster(cols: int, pack: int, isz: int, cap: int,
                     props: DeviceProps = H100) -> int | None:
    """The slice rule, restated: the smallest cluster (of those ``props`` allows) whose slices
    are at most the preferred size, else at most the maximum size (both bounded by the opt-in
    limit)."""
    for limit in (d.SMEM_SLICE_PREFERRED_BYTES, d.SMEM_SLICE_MAX_BYTES):
        for k in d.row_cluster_sizes(props):
            if _slice_bytes(cols, pack, k, isz) <= min(cap, limit):
                return k
    return None


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", [H100, H200], ids=lambda p: p.name)
def test_sm90_row_size_regimes(src: str, dst: str, props: DeviceProps) -> None:
    """sm_90: one block up to SMEM_MAX_COLS, then clusters by the slice rule, then uncached;
    every boundary hit exactly, one pack either side."""
    isz = ITEMSIZE[src]
    pack = 16 // max(isz, ITEMSIZE[dst])
    cap = smem_capacity(props)
    sizes = d.row_cluster_sizes(props)
    smem_max = d.SMEM_MAX_COLS[isz] // pack * pack
    points = {smem_max, smem_max + pack}
    for limit in (d.SMEM_SLICE_PREFERRED_BYTES, d.SMEM_SLICE_MAX_BYTES):
        full = limit // isz // pack * pack  # cols of one full slice
        for c in sizes:
            points |= {c * full, c * full + pack}
    for cols in sorted(p for p in points if p > smem_max - pack):
        plan = rows_plan(cols, src, dst, rows=9, props=props)
        want = expected_cluster(cols, pack, isz, cap, props)
        if cols <= smem_max:
            assert plan.path == "smem", (cols, plan)
        elif want is None:
            assert plan.path == "uncached", (cols, plan)
            continue
        else:
            assert plan.path == "cluster", (cols, plan)
            assert _cluster_of(plan) == want, (cols, plan)
        _check_cached_plan(plan, cols, src, props, 9)
    full_max = d.SMEM_SLICE_MAX_BYTES // isz // pack * pack
    assert rows_plan(sizes[-1] * full_max + pack, src, dst, props=props).path == "uncached"


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", [A100, SMALL_80], ids=lambda p: p.name)
def test_no_clusters_single_block_up_to_optin_then_uncached(src: str, dst: str,
                                                            props: DeviceProps) -> None:
    isz = ITEMSIZE[src]
    last = smem_capacity(props) // isz
    registers = last <= _register_max(isz)
    plan = rows_plan(last, src, dst, props=props, align=1, rows=5,
                     force="smem" if registers else None)
    assert plan.path == "smem"
    _check_cached_plan(plan, last, src, props, 5)
    if not registers:
        assert rows_plan(last + 1, src, dst, props=props, align=1).path == "uncached"
    assert rows_plan(10**6, src, dst, props=props).path == "uncached"
    with pytest.raises(ValueError, match="smem.*cannot cache"):
        rows_plan(last + 1, src, dst, props=props, force="smem")


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", DEVICES, ids=lambda p: p.name)
def test_cached_plans_follow_the_slice_rules(src: str, dst: str, props: DeviceProps) -> None:
    isz = ITEMSIZE[src]
    cap = smem_capacity(props)
    start = _register_max(isz) + 1
    for cols in range(start, 2**20, 1009):
        for align in (1, 16):
            plan = rows_plan(cols, src, dst, props=props, align=align, rows=3)
            pack = pack_of(plan)
            if plan.path == "block":  # a BLOCK_MID block (test_block_mid_rows)
                assert d.block_mid_config("softmax", src, dst, cols, pack, props.arch) == (
                    plan.block, block_args(plan)[1]), (cols, plan)
                continue
            if plan.path == "uncached":
                if props.has_clusters:  # no cluster of small slices fits
                    biggest = d.row_cluster_sizes(props)[-1]
                    assert cols > d.SMEM_MAX_COLS[isz] or _slice_bytes(cols, pack, 1, isz) > cap
                    assert _slice_bytes(cols, pack, biggest, isz) > min(
                        cap, d.SMEM_SLICE_MAX_BYTES), (cols, plan)
                else:
                    assert _slice_bytes(cols, pack, 1, isz) > cap, (cols, plan)
                continue
            _check_cached_plan(plan, cols, src, props, 3)
            if plan.path == "cluster":
                assert props.has_clusters
                assert plan.smem <= d.SMEM_SLICE_MAX_BYTES
                assert _cluster_of(plan) == expected_cluster(cols, pack, isz, cap, props), (
                    cols, plan)


def test_layer_norm_16bit_rows_past_registers_take_clusters() -> None:
    """LAYER_NORM_SMEM_MAX_COLS: 16-bit layer_norm rows too long for the registers go to a
    cluster on sm_90 where rms_norm keeps one block; without clusters both keep one block."""
    for src in ("float16", "bfloat16"):
        for cols in (d.LAYER_NORM_SMEM_MAX_COLS[2] + 8, 32768, d.SMEM_MAX_COLS[2]):
            assert rows_plan(cols, src, op="layer_norm", props=H100).path == "cluster", cols
            assert rows_plan(cols, src, op="rms_norm", props=H100).path == "smem", cols
        assert rows_plan(32768, src, op="layer_norm", props=A100).path == "smem"


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "rms_norm"])
def test_16bit_rows_past_64kb_take_clusters(op: str) -> None:
    """SMEM_MAX_COLS: 16-bit rows of up to 32768 columns (64 KB) stay on one block; longer
    ones (vocabulary-sized rows of 40960-49152 columns ran up to 22% faster there) go to a
    cluster on sm_90, and stay on one block without clusters."""
    for src in ("float16", "bfloat16"):
        assert rows_plan(32768, src, op=op, props=H100).path == "smem"
        for cols in (32776, 40960, 49152):
            assert rows_plan(cols, src, op=op, props=H100).path == "cluster", cols
            assert rows_plan(cols, src, op=op, props=A100).path == "smem", cols


def register_occ(props: DeviceProps, registers: int) -> Callable[[str, int, int], int]:
    """fake_occ with the register file (64K) bounding blocks of ``registers`` a thread too, and
    the driver's per-block reserve added to each block's shared memory."""
    reserve = props.smem_per_sm - props.smem_per_block_optin

    def occ(kernel: str, block: int, smem: int) -> int:
        return min(props.max_threads_per_sm // block, 65536 // (registers * block),
                   props.smem_per_sm // (smem + reserve))

    return occ


@pytest.mark.parametrize("src", ["float16", "bfloat16"])
def test_rms_norm_one_block_rows_keep_the_weight_in_l1(src: str) -> None:
    """weight_l1_residency: 16-bit rms_norm rows of 28672-32768 columns (56-64 KB weights, 3
    resident 512-thread blocks at 39 registers, so a 196 KiB split and 60 KiB of L1) run 2
    blocks under a hint for the 132 KiB split; shorter rows, the residual form, layer_norm and
    devices without a listed split keep the driver's split."""
    occ = register_occ(H200, 40)

    def plan(cols: int, op: str = "rms_norm", props: DeviceProps = H200, residual=False):
        return d.plan_rows(op, src, src, 49152, cols, 8, props, occ, residual=residual)

    for cols in (28672, 30720, 32768):
        p = plan(cols)
        assert (p.path, p.block, p.carveout) == ("smem", 512, 57), cols
        assert min(occ(p.kernel, p.block, p.smem), 2) == 2
        # the hint asks for the split that just holds 2 blocks: 57% of 228 KiB rounds up to 132
        assert 100 < H200.smem_per_sm * p.carveout / 100 / 1024 <= 132
        assert 2 * (p.smem + 1024) <= 132 * 1024
        for other in (plan(cols, residual=True), plan(cols, "layer_norm", H200),
                      plan(cols, props=A100)):
            assert other.carveout == -1, (cols, other)
    for cols in (20480, 24576, 26624):
        assert plan(cols).carveout == -1, cols
    assert plan(16384).path == "block" and plan(16384).carveout == -1


def test_weight_l1_residency_keeps_two_blocks() -> None:
    # 80 KB float32 rows: 2 blocks leave 60 KiB of L1, one block would keep the weight but
    # gives up the overlap of two rows
    assert d.weight_l1_residency(H200, 2, 81920, 81920) == (2, -1)
    assert d.weight_l1_residency(H200, 3, 65536, 65536) == (2, 57)
    assert d.weight_l1_residency(H200, 6, 24576, 16384) == (6, -1)
    assert d.weight_l1_residency(A100, 3, 65536, 65536) == (3, -1)
    # 8 blocks of 24 KB fill the 228 KiB split; 5 fit in 132 KiB (124 KiB of L1 for 80 KB)
    assert d.weight_l1_residency(H200, 8, 24576, 81920) == (5, 57)


def test_small_device_long_rows_uncached() -> None:
    for cols in (8193, 10**4, 10**5):
        assert rows_plan(cols, props=SMALL_80).path == "uncached"
    last = smem_capacity(SMALL_80) // 4  # float32 columns one block can cache
    assert rows_plan(last, props=SMALL_80, force="smem").path == "smem"
    with pytest.raises(ValueError, match="smem.*cannot cache"):
        rows_plan(last + 1, props=SMALL_80, force="smem")
    assert rows_plan(1500, "float64", props=SMALL_80).path == "smem"  # 12 KB


def test_smem_occupancy_zero_raises() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        rows_plan(8192, force="smem", occ=lambda k, b, s: 0)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", [H100, H200], ids=lambda p: p.name)
def test_forced_cluster_sizes(src: str, dst: str, props: DeviceProps) -> None:
    """Forced onto clusters, a short row takes the smallest cluster; past the largest
    cluster's small slices, the largest cluster up to the opt-in limit; past that the cluster
    path refuses."""
    isz = ITEMSIZE[src]
    pack = 16 // max(isz, ITEMSIZE[dst])
    biggest = d.row_cluster_sizes(props)[-1]
    plan = rows_plan(2048, src, dst, force="cluster", rows=7, props=props)
    assert plan.path == "cluster" and _cluster_of(plan) == d.CLUSTER_SIZES[0]
    _check_cached_plan(plan, 2048, src, props, 7)
    s = d.SMEM_SLICE_MAX_BYTES // isz // pack * pack
    plan = rows_plan(biggest * s + pack, src, dst, force="cluster", props=props)
    assert _cluster_of(plan) == biggest and plan.smem > d.SMEM_SLICE_MAX_BYTES
    last = smem_capacity(props) * biggest // isz // pack * pack
    assert _cluster_of(rows_plan(last, src, dst, force="cluster", props=props)) == biggest
    with pytest.raises(ValueError, match="cluster.*cannot cache"):
        rows_plan(last + pack, src, dst, force="cluster", props=props)


def test_clusters_of_16_where_the_device_allows_them() -> None:
    """float32 rows of 262144 columns (1 MB) stay cached as 16 x 64 KB slices where clusters
    of 16 are allowed, and are read twice (uncached, clusters of 8) where not; longer rows
    split over 16 uncached blocks; the strided path and the kernel list follow."""
    plan = rows_plan(262144, props=H200, rows=768)
    assert (plan.path, _cluster_of(plan), plan.smem, plan.grid) == ("cluster", 16, 65536,
                                                                     768 * 16)
    plan = rows_plan(262144, props=H100, rows=768)
    assert (plan.path, _cluster_of(plan)) == ("uncached", 8)
    assert _cluster_of(rows_plan(262144, "float16", props=H200)) == 16  # 16 x 32 KB
    assert _cluster_of(rows_plan(131072, "bfloat16", props=H200)) == 8  # 8 x 32 KB first
    assert (rows_plan(2**19 + 4, props=H200).path, _cluster_of(rows_plan(2**19 + 4,
                                                                          props=H200))) == (
        "uncached", 16)
    assert d.row_cluster_sizes(H200) == (2, 4, 8, 16) and d.row_cluster_sizes(H100) == (2, 4, 8)
    assert d.row_cluster_sizes(A100) == ()
    names = d.all_kernel_names(90)
    assert "cunorm::softmax_smem_cluster<float, float, false, 4, 16>" in names
    assert "cunorm::norm_uncached_cluster<float, false, true, 4, 16>" in names
    assert not any(n.startswith("cunorm::softmax_strided_cluster") and n.endswith(", 16>")
                   for n in names)
    assert not any("_cluster<" in n for n in d.all_kernel_names(80))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_float32_norms_prefer_portable_clusters(op: str, residual: bool) -> None:
    """NORM_PORTABLE_CLUSTER_ITEMSIZES: float32 norm rows that 16 x 32 KB or 8 x 64 KB slices
    can cache take the 8 x 64 KB (softmax and 16-bit norms keep 16 x 32 KB); rows only 16
    blocks can cache still take 16."""
    def cluster(cols: int, src: str, rows: int = 9, which: str = op) -> tuple[str, str, int]:
        plan = d.plan_rows(which, src, src, rows, cols, 16, H200, fake_occ(H200),
                           residual=residual and which != "softmax")
        base, args = template_args(plan.kernel)
        assert plan.grid == rows * int(args[-1])
        return base, args[-1], plan.smem

    norm = "cunorm::norm_smem_cluster"
    assert cluster(131072, "float32") == (norm, "8", 65536)
    assert cluster(98304, "float32") == (norm, "8", 49152)
    assert cluster(65536, "float32") == (norm, "8", 32768)  # preferred slices on 8 blocks
    assert cluster(262144, "float32") == (norm, "16", 65536)  # no portable cluster holds it
    assert cluster(262144, "float16") == (norm, "16", 32768)
    assert cluster(131072, "float32", which="softmax") == ("cunorm::softmax_smem_cluster", "16",
                                                          32768)
    with d.override_constants({"NORM_PORTABLE_CLUSTER_ITEMSIZES": ()}):
        assert cluster(131072, "float32") == (norm, "16", 32768)


def test_cluster_grid_is_one_cluster_per_row() -> None:
    cols = 4 * d.SMEM_SLICE_PREFERRED_BYTES // 4  # four full preferred float32 slices
    assert cols > d.SMEM_MAX_COLS[4]
    for rows in (1, 3, 10**6):
        plan = rows_plan(cols, rows=rows)
        assert _cluster_of(plan) == 4 and plan.grid == 4 * rows
    assert rows_plan(cols, rows=2**40).grid == d.MAX_GRID // 4 * 4


def test_cluster_block_size_from_the_cluster_kernel() -> None:
    """The block size of a cluster plan comes from the occupancy of the cluster kernel, not
    the cluster-free one: here the cluster kernel keeps 3 blocks of 64 KB per SM only at 256
    threads (register-limited at 512), while the cluster-free one would allow 512."""
    cols = 8 * d.SMEM_SLICE_MAX_BYTES // 2  # bfloat16: eight 64 KB slices

    def occ(kernel: str, block: int, smem: int) -> int:
        by_smem = H100.smem_per_sm // smem
        if "_cluster<" in kernel:  # 56 registers a thread
            return min(by_smem, 65536 // (56 * block))
        return min(by_smem, 65536 // (40 * block))

    plan = rows_plan(cols, "bfloat16", rows=64, occ=occ)
    assert plan.path == "cluster" and _cluster_of(plan) == 8, plan
    assert plan.smem == d.SMEM_SLICE_MAX_BYTES and plan.block == 256, plan
    assert d.pick_block(plan.kernel, plan.smem, occ) == (256, 3)


def test_cluster_never_chosen_without_clusters() -> None:
    for props in (A100, SMALL_80):
        for cols in range(1000, 2_000_000, 9973):
            plan = rows_plan(cols, props=props)
            assert plan.path != "cluster" and _cluster_of(plan) == 1 if plan.path in (
                "smem", "uncached") else True


def test_forced_cluster_on_sm80_raises() -> None:
    with pytest.raises(ValueError, match="sm_90"):
        rows_plan(4096, force="cluster", props=A100)


def test_forced_cluster_too_long_raises() -> None:
    with pytest.raises(ValueError, match="cluster.*cannot cache"):
        rows_plan(10**7, force="cluster")


def test_cluster_on_small_sm90_device() -> None:
    """16 KB of shared memory: slices up to 15 KB."""
    assert rows_plan(1500, "float64", props=SMALL_90).path == "smem"  # 12 KB: one block
    plan = rows_plan(2050, "float64", props=SMALL_90, rows=5)  # 16.4 KB: 2 slices of ~8 KB
    assert (plan.path, _cluster_of(plan), plan.smem, plan.grid) == ("cluster", 2, 8208, 10)
    plan = rows_plan(20000, props=SMALL_90)  # 80 KB of float32: 8 slices of 10 KB
    assert (_cluster_of(plan), plan.smem) == (8, 10000)
    assert rows_plan(40000, props=SMALL_90).path == "uncached"  # 8 slices of 20 KB: too big


# --- uncached -----------------------------------------------------------------------------
@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", [A100, SMALL_80], ids=lambda p: p.name)
def test_uncached_long_rows_single_block(src: str, dst: str, props: DeviceProps) -> None:
    cols = 2**24 + 16
    plan = rows_plan(cols, src, dst, rows=5000, props=props)
    isz = max(ITEMSIZE[src], ITEMSIZE[dst])
    assert plan.path == "uncached"
    assert template_args(plan.kernel) == (
        "cunorm::softmax_uncached", [d.CTYPE[src], d.CTYPE[dst], "false", str(16 // isz)])
    assert (plan.block, plan.smem) == (d.UNCACHED_BLOCK, 0)
    per_sm = props.max_threads_per_sm // d.UNCACHED_BLOCK
    assert plan.grid == min(5000, props.sm_count * per_sm)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", [H100, SMALL_90], ids=lambda p: p.name)
def test_uncached_rows_split_over_clusters_on_sm90(src: str, dst: str,
                                                   props: DeviceProps) -> None:
    """Long uncached rows on sm_90: the smallest cluster whose slices are at most
    UNCACHED_SLICE_MAX_BYTES (8 at most), one cluster per row."""
    isz = ITEMSIZE[src]
    pack = 16 // max(isz, ITEMSIZE[dst])
    limit = d.UNCACHED_SLICE_MAX_BYTES
    for cols, cluster in [(limit // isz, 1), (limit // isz + pack, 2), (2 * limit // isz, 2),
                          (2 * limit // isz + pack, 4), (8 * limit // isz, 8),
                          (8 * limit // isz + pack, 8), (2**24, 8)]:
        plan = rows_plan(cols, src, dst, rows=3, props=props, force="uncached")
        assert plan.path == "uncached" and _cluster_of(plan) == cluster, (cols, plan)
        assert (plan.block, plan.smem) == (d.UNCACHED_BLOCK, 0)
        if cluster > 1:
            assert template_args(plan.kernel)[0] == "cunorm::softmax_uncached_cluster"
            assert plan.grid == 3 * cluster
    plan = rows_plan(2**24, src, dst, rows=2**40, props=props)
    assert plan.grid == d.MAX_GRID // 8 * 8


@pytest.mark.parametrize("cols", [1, 2, 3, 31, 32, 33, 1000, 1025, 28929, 10**6])
def test_forced_uncached_any_cols(cols: int) -> None:
    plan = rows_plan(cols, rows=3, force="uncached")
    assert plan.path == "uncached" and cols % pack_of(plan) == 0
    assert plan.grid == 3 * _cluster_of(plan)


# --- packs, dtypes, ops -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "dst", "cols", "align", "pack"),
    [
        ("float16", "float16", 4096, 16, 8), ("float16", "float16", 4096, 4, 4),
        ("float16", "float16", 4098, 16, 2), ("float16", "float16", 4097, 16, 1),
        ("float16", "float32", 4096, 16, 4), ("bfloat16", "float32", 4096, 16, 4),
        ("bfloat16", "bfloat16", 4096, 16, 8), ("float32", "float32", 4096, 16, 4),
        ("float32", "float32", 4096, 2, 2), ("float32", "float32", 4094, 16, 2),
        ("float64", "float64", 4096, 16, 2), ("float64", "float64", 4096, 1, 1),
        ("float64", "float64", 4095, 16, 1),
    ],
)
@pytest.mark.parametrize("force", [None, "uncached", "smem", "block"])
def test_pack_by_cols_and_alignment(src: str, dst: str, cols: int, align: int, pack: int,
                                    force: str | None) -> None:
    assert pack_of(rows_plan(cols, src, dst, align=align, force=force)) == pack


@pytest.mark.parametrize(("src", "dst"), BAD_PAIRS)
def test_rows_dtype_pair_without_kernel_raises(src: str, dst: str) -> None:
    with pytest.raises(ValueError, match=f"no kernel for {src} -> {dst}"):
        rows_plan(100, src, dst)


@pytest.mark.parametrize(("src", "dst"), BAD_PAIRS)
def test_strided_dtype_pair_without_kernel_raises(src: str, dst: str) -> None:
    with pytest.raises(ValueError, match=f"no kernel for {src} -> {dst}"):
        strided_plan(4, 16, 64, src, dst)


@pytest.mark.parametrize(("op", "flag"), [("softmax", "false"), ("log_softmax", "true")])
def test_op_selects_log_flag(op: str, flag: str) -> None:
    for plan in (rows_plan(100, op=op), rows_plan(5000, op=op), rows_plan(10**6, op=op),
                 rows_plan(40000, op=op), strided_plan(4, 8, 64, op=op),
                 strided_plan(4, 10**5, 64, op=op)):
        assert template_args(plan.kernel)[1][2] == flag


# --- forcing ------------------------------------------------------------------------------
def test_force_path_context() -> None:
    assert d.forced_path() is None
    with d.force_path("smem"):
        assert d.forced_path() == "smem"
        with d.force_path("uncached"):
            assert d.forced_path() == "uncached"
        assert d.forced_path() == "smem"
        with d.force_path(None):
            assert d.forced_path() is None
    assert d.forced_path() is None


def test_force_path_restored_after_exception() -> None:
    with pytest.raises(RuntimeError), d.force_path("warp"):
        raise RuntimeError("boom")
    assert d.forced_path() is None


def test_override_constants_replans_and_restores() -> None:
    """Plans made inside see the overridden constants; the values (and plans made under
    them) are gone after the block, also after an exception."""
    assert rows_plan(16384, "float16").block == 512
    with d.override_constants({"BLOCK_MID": {}}):
        assert d.BLOCK_MID == {}
        assert rows_plan(16384, "float16").block == 1024
    assert d.BLOCK_MID and rows_plan(16384, "float16").block == 512
    with pytest.raises(RuntimeError), d.override_constants({"BLOCK_TARGET_VALUES": 12}):
        raise RuntimeError("boom")
    assert d.BLOCK_TARGET_VALUES == 16
    with pytest.raises(ValueError, match="no dispatcher constant named \\['NOPE', 'plan_rows'\\]"):
        with d.override_constants({"NOPE": 1, "plan_rows": None}):
            pass


@pytest.mark.parametrize("bad", ["bogus", "Warp", "", "strided_cached"])
def test_force_path_unknown_raises(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown path"), d.force_path(bad):
        pass
    assert d.forced_path() is None


def test_force_path_is_per_thread() -> None:
    seen = []
    with d.force_path("uncached"):
        t = threading.Thread(target=lambda: seen.append(d.forced_path()))
        t.start()
        t.join()
    assert seen == [None]


@pytest.mark.parametrize("path", [*d.ROW_PATHS, *d.STRIDED_PATHS])
def test_every_forceable_path_is_accepted(path: str) -> None:
    with d.force_path(path):
        assert d.forced_path() == path


def test_planner_rejects_path_of_the_other_family() -> None:
    for path in (*d.STRIDED_PATHS, "bogus"):
        with pytest.raises(ValueError, match="unknown row path"):
            rows_plan(100, force=path)
    for path in (*d.ROW_PATHS, "bogus"):
        with pytest.raises(ValueError, match="unknown strided path"):
            strided_plan(4, 16, 64, force=path)


# --- strided (outer, dim, inner) ----------------------------------------------------------
def strided_args(plan: d.LaunchPlan) -> tuple[int, int, bool]:
    """(pack, cluster size, cached) of a strided plan."""
    base, args = template_args(plan.kernel)
    if base == "cunorm::softmax_strided_cluster":  # <head, pack, cache, cluster, held>
        assert len(args) == 7 and args[4] in ("true", "false"), plan
        cluster = int(args[5])
        assert cluster > 1, plan
        held = d.STRIDED_HELD_ROWS if args[4] == "true" else 0
        assert int(args[6]) == held, plan
    else:
        assert base == "cunorm::softmax_strided" and len(args) == 5, plan
        assert args[4] in ("true", "false"), plan
        cluster = 1
    assert (args[4] == "true") == (plan.path == "strided-cached"), plan
    return int(args[3]), cluster, args[4] == "true"


def cached_slice_bytes(dim: int, cluster: int, tx: int, pack: int, isz: int) -> int:
    """Shared memory of a cached (dim slice, tile) slab: a cluster block's threads hold their
    first STRIDED_HELD_ROWS rows in registers."""
    held = d.STRIDED_HELD_ROWS * (d.STRIDED_BLOCK // tx) if cluster > 1 else 0
    return max(0, -(-dim // cluster) - held) * tx * pack * isz


def _check_strided(plan: d.LaunchPlan, outer: int, dim: int, inner: int, src: str,
                   dst: str, props: DeviceProps) -> None:
    """Invariants of every strided plan, whatever the tile heuristics."""
    isz = ITEMSIZE[src]
    pack, cluster, cached = strided_args(plan)
    assert pack == d.max_pack(inner, max(isz, ITEMSIZE[dst]), 16) or inner % pack == 0
    tx = plan.tx_count
    assert tx >= 1 and tx & (tx - 1) == 0 and d.STRIDED_BLOCK % tx == 0, plan
    width = tx * pack
    assert tx == 1 or (tx // 2) * pack < inner, f"tile wider than inner needs: {plan}"
    assert plan.block == d.STRIDED_BLOCK
    tiles = outer * -(-inner // width)
    assert plan.grid == min(tiles, d.MAX_GRID // cluster) * cluster, plan
    assert cluster == 1 or props.has_clusters
    slab = cached_slice_bytes(dim, cluster, tx, pack, isz) if cached else 0
    assert slab <= d.STRIDED_SLICE_MAX_BYTES
    assert plan.smem > slab and plan.smem <= props.smem_per_block_optin
    # softmax_strided_impl's layout: a state row per warp, the final row, the mail rows
    state_row = width * 2 * d.compute_bytes(src, dst)
    rows = d.STRIDED_BLOCK // max(tx, 32) + 1 + (cluster if cluster > 1 else 0)
    assert plan.smem == rows * state_row + slab, plan
    smaller = [c for c in (1, *d.CLUSTER_SIZES) if c < cluster]
    if cached:  # the smallest cluster whose slice of this tile fits beside the partials
        limit = (d.STRIDED_SLICE_PREFERRED_BYTES if slab <= d.STRIDED_SLICE_PREFERRED_BYTES
                 else d.STRIDED_SLICE_MAX_BYTES)
        for c in smaller:
            states = (rows - cluster + (c if c > 1 else 0)) * state_row
            bound = min(limit, props.smem_per_block_optin - d.STATIC_SMEM_RESERVE - states)
            assert cached_slice_bytes(dim, c, tx, pack, isz) > bound, (plan, c)
    else:  # read twice: one-sector tiles, dim split while a slice would not be cached
        assert tx == 1 or (tx // 2) * pack * isz < d.STRIDED_NARROW_TILE_BYTES, plan
        assert all(-(-dim // c) * width * isz > d.STRIDED_SLICE_MAX_BYTES for c in smaller)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("props", [H100, A100, SMALL_80, SMALL_90], ids=lambda p: p.name)
def test_strided_plans_invariants(src: str, dst: str, props: DeviceProps) -> None:
    """On the 16 KB fake devices a 256-thread block's partial states for 16-byte packs need
    16 KB themselves: only there may planning fail, and only with 'does not fit'."""
    for outer in (1, 3, 1000):
        for dim in (1, 2, 7, 64, 300, 1000, 5000, 40000, 10**6):
            for inner in (2, 3, 4, 6, 8, 64, 100, 4096, 65536):
                for align in (1, 16):
                    try:
                        plan = strided_plan(outer, dim, inner, src, dst, props=props, align=align)
                    except ValueError as err:
                        assert props.smem_per_block_optin < 48 * 1024, err
                        assert "does not fit" in str(err)
                        continue
                    _check_strided(plan, outer, dim, inner, src, dst, props)
                    forced = strided_plan(outer, dim, inner, src, dst, props=props,
                                          align=align, force="strided")
                    assert forced.path == "strided"
                    _check_strided(forced, outer, dim, inner, src, dst, props)
                    if plan.path == "strided-cached":
                        assert strided_plan(outer, dim, inner, src, dst, props=props,
                                            align=align, force="strided-cached") == plan


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_strided_cached_short_dim_single_block(src: str, dst: str) -> None:
    plan = strided_plan(32, 21, 65536, src, dst)
    assert plan.path == "strided-cached" and strided_args(plan)[1:] == (1, True)
    _check_strided(plan, 32, 21, 65536, src, dst, H100)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_strided_long_dim_cluster_on_sm90_uncached_on_sm80(src: str, dst: str) -> None:
    """A dim whose slab is too big for one block is split over a cluster on sm_90 and read
    twice on sm_80; far too big, it is read twice everywhere, split over a cluster on sm_90."""
    isz = ITEMSIZE[src]
    for dim in range(2, 10**6, 4999):
        plan90 = strided_plan(4, dim, 4096, src, dst)
        width = plan90.tx_count * strided_args(plan90)[0]
        one_block = dim * width * isz <= d.STRIDED_SLICE_MAX_BYTES
        if not one_block and plan90.path == "strided-cached":
            assert strided_args(plan90)[1] > 1
            plan80 = strided_plan(4, dim, 4096, src, dst, props=A100)
            assert strided_args(plan80)[1] == 1
    huge = strided_plan(4, 10**7, 4096, src, dst)
    assert huge.path == "strided" and strided_args(huge)[1:] == (d.CLUSTER_SIZES[-1], False)
    huge80 = strided_plan(4, 10**7, 4096, src, dst, props=A100)
    assert huge80.path == "strided" and strided_args(huge80)[1:] == (1, False)
    with pytest.raises(ValueError, match="strided-cached"):
        strided_plan(4, 10**7, 4096, src, dst, force="strided-cached")
    assert any(strided_args(strided_plan(4, dim, 4096, src, dst))[1] > 1
               for dim in (2**k for k in range(4, 20))), "no strided cluster on sm_90"


def test_strided_long_dim_takes_narrow_tiles_before_reading_twice() -> None:
    """float16 (4, 8192, 512): 64-byte tiles need 64 KB slices on 8 blocks, 32-byte ones
    32 KB: the narrow tile is cached; a dim 8 times longer is read twice in narrow tiles."""
    plan = strided_plan(4, 8192, 512, "float16")
    assert strided_args(plan) == (8, 8, True) and plan.tx_count * 8 * 2 == 32
    plan = strided_plan(4, 8192, 512, "float16", props=A100)  # no clusters: read twice
    assert strided_args(plan) == (8, 1, False) and plan.tx_count == 2
    plan = strided_plan(1, 65536, 512, "float16")
    assert strided_args(plan) == (8, 8, False) and plan.tx_count == 2


@pytest.mark.parametrize(
    ("inner", "align", "pack"),
    [(2, 16, 2), (3, 16, 1), (5, 16, 1), (8, 16, 4), (64, 16, 4), (64, 1, 1), (4096, 16, 4),
     (4096, 2, 2), (6, 16, 2)],
)
def test_strided_pack(inner: int, align: int, pack: int) -> None:
    for dim in (5, 5000):
        plan = strided_plan(2, dim, inner, align=align)
        assert pack_of(plan) == pack
        _check_strided(plan, 2, dim, inner, "float32", "float32", H100)


def test_strided_tiny_inner_tile_is_one_pack_wide() -> None:
    plan = strided_plan(2, 5, 2, align=16)  # inner 2 = one pack of 2: one column of threads
    assert (pack_of(plan), plan.tx_count, plan.grid) == (2, 1, 2)


def test_strided_half_to_float_pack_bounded_by_output() -> None:
    assert pack_of(strided_plan(2, 5, 4096, "float16", "float32")) == 4
    assert pack_of(strided_plan(2, 5, 4096, "float16", "float16")) == 8


def test_strided_occupancy_zero_raises() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        strided_plan(2, 5, 64, occ=lambda k, b, s: 0)


# --- launch-shape invariants over a sweep -------------------------------------------------
_SWEEP_COLS = sorted({*range(1, 70), *range(1000, 1100, 7), 767, 768, 769, 1536, 1537, 2047,
                      2048, 4096, 4097, 5000, 24576, 24580, 32768, 32772, 131072, 131076,
                      12288, 28928, 28929, 57856, 65537, 115712, 262144, 462848, 10**6})


@pytest.mark.parametrize("props", DEVICES, ids=lambda p: p.name)
@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_grid_shapes(props: DeviceProps, src: str, dst: str) -> None:
    """Register and cached paths launch one block (row group, cluster) per row, capped at
    MAX_GRID, strided plans one per tile; single-block uncached plans are persistent grids
    within sm_count x occupancy. No grid is ever 0."""
    occ = fake_occ(props)
    for rows in (1, 3, 1000, 10**6, 2**40):
        for cols in _SWEEP_COLS:
            for align in (1, 16):
                plan = rows_plan(cols, src, dst, rows=rows, props=props, align=align)
                assert 1 <= plan.grid <= d.MAX_GRID, (rows, cols, plan)
                assert plan.block in (d.WARP_BLOCK, d.UNCACHED_BLOCK, *d.BLOCK_SIZES,
                                      *d.BLOCK_WARP_THREADS, *d.BLOCK_WIDE_THREADS)
                assert 0 <= plan.smem <= smem_capacity(props), (cols, plan)
                if plan.path == "warp":
                    _, _, group, rpg = warp_args(plan)
                    assert plan.grid == min(-(-rows // (plan.block // group * rpg)), d.MAX_GRID)
                elif plan.path == "block":
                    assert plan.grid == min(rows, d.MAX_GRID) and plan.smem == 0
                elif plan.path == "uncached" and _cluster_of(plan) == 1:
                    per_sm = max(1, occ(plan.kernel, plan.block, plan.smem))
                    assert plan.grid == min(rows, props.sm_count * per_sm)
                else:
                    c = _cluster_of(plan)
                    assert plan.grid == min(rows, d.MAX_GRID // c) * c, (rows, cols, plan)
    if props.smem_per_block_optin < 48 * 1024:
        return  # see test_strided_plans_invariants
    for outer, dim, inner in [(1, 1, 2), (1, 5, 3), (7, 21, 1000), (1000, 3, 64),
                              (10**5, 1000, 4096), (2, 10**6, 8), (2**20, 2, 2**20)]:
        for align in (1, 16):
            plan = strided_plan(outer, dim, inner, src, dst, props=props, align=align)
            _check_strided(plan, outer, dim, inner, src, dst, props)
            assert 1 <= plan.grid <= d.MAX_GRID


def test_launch_plan_is_frozen_and_hashable() -> None:
    plan = rows_plan(100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.grid = 1  # type: ignore[misc]
    assert plan == rows_plan(100) and hash(plan) == hash(rows_plan(100))
    assert len({plan, rows_plan(100), rows_plan(101)}) == 2


def test_docstring_examples() -> None:
    result = doctest.testmod(d, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# --- every emitted kernel is listed by all_kernel_names ------------------------------------
_LONG_COLS = (1025, 2047, 4096, 12288, 28929, 57856, 115712, 262144, 462848, 462852, 2**20)


def _emitted(props: DeviceProps, dense: bool) -> set[str]:
    """Kernel names of every plan over a sweep: cols 1..5000 (``dense``) or a sparse set, four
    alignments (every pack), both ops, every dtype pair, normal and forced paths."""
    occ = fake_occ(props)
    names: set[str] = set()
    cols_sweep = range(1, 5001) if dense else sorted({*range(1, 5001, 97), *_LONG_COLS})
    cases = [(op, src, dst, False) for src, dst in PAIRS for op in d.SOFTMAX_OPS]
    cases += [(op, src, src, res) for src in ITEMSIZE for op in d.NORM_OPS for res in (0, 1)]
    for op, src, dst, residual in cases:
        for align in (1, 2, 4, 8):
            for cols in (*cols_sweep, *_LONG_COLS):
                forces: tuple[str | None, ...] = (None,)
                if cols > d.WARP_MAX_COLS[ITEMSIZE[src]] or op in d.NORM_OPS:
                    forces += ("warp", "block")  # softmax below the limit: the same plans
                if cols % 97 == 1 or cols in _LONG_COLS:
                    forces += ("block", "smem", "cluster", "uncached")
                for force in forces:
                    try:
                        plan = d.plan_rows(op, src, dst, 1, cols, align, props, occ, force,
                                           residual=bool(residual))
                    except ValueError:
                        continue
                    names.add(plan.kernel)
    for src, dst in PAIRS:
        for op in d.SOFTMAX_OPS:
            for align in (1, 2, 4, 8):
                for dim in (1, 7, 300, 5000, 40000, 10**6):
                    for inner in (2, 3, 4, 6, 8, 64, 4096):
                        for force in (None, *d.STRIDED_PATHS):
                            try:
                                plan = d.plan_strided(op, src, dst, 2, dim, inner, align, props,
                                                      occ, force)
                            except ValueError:
                                continue
                            names.add(plan.kernel)
    return names


@pytest.mark.parametrize(("arch", "dense", "sparse"),
                         [(80, A100, SMALL_80), (90, H100, SMALL_90)], ids=["sm80", "sm90"])
def test_all_kernel_names_cover_every_plan(arch: int, dense: DeviceProps,
                                           sparse: DeviceProps) -> None:
    listed = set(d.all_kernel_names(arch))
    assert len(listed) == len(d.all_kernel_names(arch))  # no duplicates
    emitted = _emitted(dense, True) | _emitted(sparse, False)
    missing = sorted(emitted - listed)
    assert not missing, f"{len(missing)} emitted kernels not in all_kernel_names({arch}): " \
                        f"{missing[:10]}"
    kinds = {template_args(n)[0] for n in emitted}
    expected = {"cunorm::softmax_warp", "cunorm::softmax_block", "cunorm::softmax_smem",
                "cunorm::softmax_uncached", "cunorm::softmax_strided", "cunorm::norm_warp",
                "cunorm::norm_block", "cunorm::norm_block_capped", "cunorm::norm_smem",
                "cunorm::norm_uncached"}
    sm90 = {"cunorm::softmax_smem_cluster", "cunorm::softmax_uncached_cluster",
            "cunorm::softmax_strided_cluster", "cunorm::norm_smem_cluster",
            "cunorm::norm_uncached_cluster"}
    assert kinds == expected | (sm90 if arch >= 90 else set())


def test_all_kernel_names_by_arch() -> None:
    n80, n90 = set(d.all_kernel_names(80)), set(d.all_kernel_names(90))
    assert n80 < n90
    assert not any("cluster" in n for n in n80)
    assert {template_args(n)[0] for n in n90 - n80} == {
        "cunorm::softmax_smem_cluster", "cunorm::softmax_uncached_cluster",
        "cunorm::softmax_strided_cluster", "cunorm::norm_smem_cluster",
        "cunorm::norm_uncached_cluster", "cunorm::norm_grad_rows_cluster",
        "cunorm::softmax_grad_cluster", "cunorm::attn_wg", "cunorm::attn_ws",
        "cunorm::attn_tc_cluster", "cunorm::attn_tc",  # attn_tc: decoding's 128-key tiles
        "cunorm::softmax_block", "cunorm::norm_block"}
    mid = {n for n in n90 - n80 if "_block<" in n}
    assert mid and all(block_values(n) == 32 for n in mid)  # BLOCK_MID, sm_90
    for name in n90:
        base, args = template_args(name)
        if base.startswith("cunorm::attn_"):
            assert d.kernel_file(name) == "attention.cu"
            continue
        if base.startswith(("cunorm::softmax_grad", "cunorm::norm_grad_")):
            # tests/test_cpu_softmax_grad.py, tests/test_cpu_norm_grad.py
            assert d.kernel_file(name) == "grad.cu"
            continue
        if base.startswith("cunorm::norm_"):
            assert args[0] in d.CTYPE.values(), name
            assert args[1] in ("true", "false") and args[2] in ("true", "false"), name
            assert d.kernel_file(name) == "norm.cu"
            continue
        assert (args[0], args[1]) in {(d.CTYPE[s], d.CTYPE[t]) for s, t in PAIRS}, name
        assert args[2] in ("true", "false")
        assert d.kernel_file(name) == "softmax.cu"


# --- norms ----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", d.NORM_OPS)
@pytest.mark.parametrize("src", list(ITEMSIZE))
@pytest.mark.parametrize("residual", [False, True])
def test_norm_plans_use_norm_kernels(op: str, src: str, residual: bool) -> None:
    """Norms run on the same row paths as softmax, through their own kernels (norm.cu), with
    the RMS and RESIDUAL flags in the name; every path can be forced."""
    rms, res = ("true" if op == "rms_norm" else "false"), ("true" if residual else "false")
    for cols in (1, 33, 512, 1000, 3000, 8192, 20000, 70000, 300000):
        plan = d.plan_rows(op, src, src, 4096, cols, 16, H100, fake_occ(H100),
                           residual=residual)
        base, args = template_args(plan.kernel)
        assert base == f"cunorm::norm_{plan.path}" or (
            plan.path == "block" and base == "cunorm::norm_block_capped") or (
            plan.path == "cluster" and base == "cunorm::norm_smem_cluster") or (
            plan.path == "uncached" and base == "cunorm::norm_uncached_cluster"), plan
        assert args[:3] == [d.CTYPE[src], rms, res]
    for path in d.ROW_PATHS:
        try:
            plan = d.plan_rows(op, src, src, 64, 2000, 16, H100, fake_occ(H100), path,
                               residual=residual)
        except ValueError:
            assert path == "warp"  # 2000 values do not fit a warp's registers for the norms
            continue
        assert plan.path == path


@pytest.mark.parametrize("src", list(ITEMSIZE))
def test_norm_value_caps(src: str) -> None:
    """The norm kernels hold as many values per thread as softmax's, except on the block path
    with scalar packs (NORM_BLOCK_MAX_VALUES_SCALAR); longer rows go to the next path."""
    cb = 8 if src == "float64" else 4
    for pack in (1, 2, 4, 8):
        if pack * ITEMSIZE[src] > 16:
            continue
        cap = d.value_cap("norm", "warp", cb, pack)
        assert cap == d.value_cap("softmax", "warp", cb, pack) == d.WARP_MAX_VALUES_PER_THREAD[cb]
        cfg = d.warp_config(32 * cap, pack, cb, "norm")
        assert cfg is not None and cfg[0] <= cap
        assert d.warp_config(32 * cap + 32 * pack, pack, cb, "norm") is None
        cap = d.value_cap("norm", "block", cb, pack)
        assert cap == (d.NORM_BLOCK_MAX_VALUES_SCALAR if pack == 1 else d.BLOCK_MAX_VALUES)[cb]
        for cols in range(pack * 128, 512 * cap + 1, pack * 61):
            bcfg = d.block_config(cols, pack, cb, "norm")
            assert bcfg is None or bcfg[1] <= cap
        if pack == 1:
            assert cap < d.value_cap("softmax", "block", cb, pack)
            bcfg = d.block_config(512 * (cap + 1), 1, cb, "softmax")
            assert bcfg is not None and d.block_config(512 * (cap + 1), 1, cb, "norm") is None
    plan = d.plan_rows("layer_norm", src, src, 4096, 1536, 16, H100, fake_occ(H100))
    # 48 values per lane fit a warp at 16 bits; float32 rows that long take the block path
    # (float64: none, it goes to shared memory)
    assert plan.path == {"float16": "warp", "bfloat16": "warp", "float32": "block",
                         "float64": "smem"}[src]


@pytest.mark.parametrize(("op", "src", "dst", "residual", "message"), [
    ("layer_norm", "float16", "float32", False, "output has the input's dtype"),
    ("rms_norm", "int8", "int8", False, "output has the input's dtype"),
    ("softmax", "float32", "float32", True, "no residual variant"),
    ("attention", "float32", "float32", False, "unknown op"),
])
def test_kernel_head_rejects(op: str, src: str, dst: str, residual: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        d.kernel_head(op, src, dst, residual)


def test_norms_have_no_strided_path() -> None:
    with pytest.raises(ValueError, match="no strided kernel for layer_norm"):
        d.plan_strided("layer_norm", "float32", "float32", 2, 8, 16, 4, H100, fake_occ(H100))


@pytest.mark.parametrize(("op", "src", "cols", "path"), [
    ("layer_norm", "float32", 8192, "block"), ("softmax", "float32", 20480, "smem"),
    ("rms_norm", "float16", 3000, "block"), ("layer_norm", "float16", 5121, "smem"),
    ("softmax", "float16", 4096, "block"), ("layer_norm", "bfloat16", 3072, "block"),
])
def test_norm_block_limits(op: str, src: str, cols: int, path: str) -> None:
    """The norms keep rows in registers up to their own measured limits (NORM_BLOCK_MAX_COLS),
    which differ from softmax's."""
    assert d.plan_rows(op, src, src, 4096, cols, 16, H100, fake_occ(H100)).path == path


@pytest.mark.parametrize("props", [H100, H200], ids=lambda p: p.name)
def test_block_mid_rows(props: DeviceProps) -> None:
    """Rows past the 16-value block kernels stay in registers on BLOCK_MID blocks (24 or 32
    values a thread, at most 512 threads, compiled for 2 resident blocks) where measured: not
    for the residual norms, nor before sm_90."""
    def plan(op: str, dtype: str, cols: int, residual: bool = False, p=props):
        return d.plan_rows(op, dtype, dtype, 4096, cols, 16, p, fake_occ(p), residual=residual)

    def shape(pl: d.LaunchPlan) -> tuple[str, int, int]:
        return pl.path, pl.block, block_values(pl.kernel) if pl.path == "block" else 0

    assert shape(plan("layer_norm", "float32", 12288)) == ("block", 512, 24)
    assert shape(plan("layer_norm", "float32", 16384)) == ("block", 512, 32)
    assert shape(plan("rms_norm", "float32", 12288)) == ("block", 512, 24)
    assert plan("rms_norm", "float32", 16384).path == "smem"  # 32 values measured slower
    for op in ("softmax", "log_softmax"):
        assert shape(plan(op, "float32", 12288)) == ("block", 512, 24)
        assert plan(op, "float32", 16384).path == "smem"  # 32 values spill
        for dtype in ("float16", "bfloat16"):
            if op == "softmax":
                assert shape(plan(op, dtype, 12288)) == ("block", 384, 32)
            else:  # 384 x 32 measured slower for log_softmax
                assert plan(op, dtype, 12288).path == "smem"
            assert shape(plan(op, dtype, 16384)) == ("block", 512, 32)
    for op in ("layer_norm", "rms_norm"):
        for dtype in ("float16", "bfloat16"):
            assert plan(op, dtype, 12288).path == "smem"  # 384 x 32 measured slower
            assert shape(plan(op, dtype, 16384)) == ("block", 512, 32)
            assert shape(plan(op, dtype, 16384, residual=True))[1] == 1024  # not BLOCK_MID
        assert plan(op, "float32", 12288, residual=True).path == "smem"
    assert plan("softmax", "float32", 12289).path == "smem"  # scalar packs
    assert plan("softmax", "float16", 16384 + 64).path == "smem"  # past 512 x 32
    # BLOCK_MID_PAST_COLS: float32 layer_norm rows past 6656 columns, before the 16-value blocks
    assert d.BLOCK_MID_PAST_COLS == {("layer_norm", 4, 4): (6656, 32)}
    for key, (_, values) in d.BLOCK_MID_PAST_COLS.items():  # kernels all_kernel_names builds
        assert values in d.BLOCK_MID[key][0], key
    assert shape(plan("layer_norm", "float32", 7168)) == ("block", 224, 32)
    assert shape(plan("layer_norm", "float32", 8192)) == ("block", 256, 32)
    assert shape(plan("layer_norm", "float32", 6660)) == ("block", 224, 32)  # 508 padding
    assert shape(plan("layer_norm", "float32", 6656)) == ("block", 416, 16)  # not past
    assert shape(plan("layer_norm", "float32", 6144)) == ("block", 384, 16)
    assert shape(plan("layer_norm", "float32", 5120)) == ("block", 320, 16)
    assert shape(plan("layer_norm", "float32", 7172)) == ("block", 480, 16)  # 256 x 32 pads
    assert shape(plan("layer_norm", "float32", 7280)) == ("block", 480, 16)  # 256 x 32 pads
    assert shape(plan("layer_norm", "float32", 7284)) == ("block", 256, 32)
    assert shape(plan("rms_norm", "float32", 8192)) == ("block", 512, 16)  # not listed
    assert shape(plan("layer_norm", "float32", 8192, residual=True)) == ("block", 512, 16)
    assert plan("layer_norm", "float32", 8190).kernel.startswith(
        "cunorm::norm_block<float, false, false, 2, ")  # 8-byte packs: no BLOCK_MID block
    with d.override_constants({"BLOCK_MID_PAST_COLS": {}}):
        assert shape(plan("layer_norm", "float32", 8192)) == ("block", 512, 16)
    sm80 = DeviceProps("fake sm_80", (8, 0), 108, 2048, 166912, 167936, 40 << 20)
    assert plan("layer_norm", "float32", 12288, p=sm80).path == "smem"
    assert shape(plan("layer_norm", "float32", 8192, p=sm80)) == ("block", 512, 16)
    for op, src, dst in (("softmax", "float16", "float32"), ("layer_norm", "float64", "float64")):
        assert d.block_mid_config(op, src, dst, 12288, 16 // d.ITEMSIZE[dst], 90) is None


def test_block_capped_rows() -> None:
    """float32 layer_norm rows without a residual in 16-byte packs of 16 values a thread run on
    norm.cu's norm_block_capped (48 registers, no launch bounds: 1024-thread blocks too); every
    other block row keeps norm_block."""
    ln32 = d.kernel_head("layer_norm", "float32", "float32")[1]
    assert d.block_capped("norm", ln32, 4, 16)
    for family, head, pack, values in (
            ("norm", ln32, 4, 12), ("norm", ln32, 4, 32), ("norm", ln32, 2, 16),
            ("norm", d.kernel_head("rms_norm", "float32", "float32")[1], 4, 16),
            ("norm", d.kernel_head("layer_norm", "float32", "float32", True)[1], 4, 16),
            ("softmax", d.kernel_head("softmax", "float32", "float32")[1], 4, 16)):
        assert not d.block_capped(family, head, pack, values), (family, head, pack, values)
    capped = "cunorm::norm_block_capped<float, false, false, 4, 16>"
    for cols, block in ((2048, 128), (5120, 320), (6656, 416), (7200, 480)):
        plan = d.plan_rows("layer_norm", "float32", "float32", 4096, cols, 16, H200,
                           fake_occ(H200))
        assert (plan.kernel, plan.block) == (capped, block), plan
    forced = d.plan_rows("layer_norm", "float32", "float32", 64, 16384, 16, H200, fake_occ(H200),
                         "block")
    assert (forced.kernel, forced.block) == (capped, 1024)
    for kwargs in ({"residual": True}, {}):
        op = "layer_norm" if kwargs else "rms_norm"
        plan = d.plan_rows(op, "float32", "float32", 4096, 5120, 16, H200, fake_occ(H200),
                           **kwargs)
        assert plan.kernel.startswith("cunorm::norm_block<"), plan
    assert capped in d.all_kernel_names(80) and capped in d.all_kernel_names(90)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_residual_one_block_rows_take_the_larger_block_on_a_tie(op: str) -> None:
    """A one-block shared-memory row of float32 with a residual: of the block sizes keeping as
    many threads resident, the larger (its row reaches shared memory through registers, a few
    packs a thread at a time); without one, on clusters and for 16-bit rows, the smaller."""
    def occ(kernel: str, block: int, smem: int) -> int:  # registers: 1024 threads an SM
        return 1024 // block

    def block(cols: int, residual: bool, force: str = "smem", src: str = "float32") -> int:
        plan = d.plan_rows(op, src, src, 4096, cols, 16, H200, occ, force, residual=residual)
        return plan.block

    assert block(12288, True) == 512
    assert block(12288, True, src="float64") == 512
    assert block(12288, False) == 128
    assert block(65536, True, "cluster") == 128
    assert block(12288, True, src="float16") == 128
