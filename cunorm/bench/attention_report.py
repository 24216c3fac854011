"""The attention report: screen tables, markdown, JSON and a plot of TFLOP/s against L.

Targets are the Done-when of the attention issue: at least 1.0x torch SDPA's FLASH_ATTENTION
backend on every forward point (bfloat16 and float16, D = 64 and 128, L = 512 ... 16384, causal
and not), reported also against the cuDNN backend; decoding reads K/V at 70% or more of the copy
bandwidth for Lk >= 16k; the peak extra memory at L = 64k is within a few MB.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from .attention import DECODE_HKV, DECODE_HQ, HIDDEN, SHORT_DTYPE, TOKENS
from .attention_run import AttnCell, AttnRun
from .ops import OPS
from .report import (
    MISSING,
    base_name,
    figure_legend,
    fmt_gbps,
    fmt_pct,
    fmt_ratio,
    header_lines,
    import_pyplot,
    log2_axis,
    md_table,
    save_figure,
    text_table,
    to_json,
)

FORWARD_TARGET = 1.0  # cunorm / flash, every point
DECODE_TARGET, DECODE_MIN_LK = 0.70, 16384  # cunorm K/V GB/s / copy bandwidth
MEMORY_TARGET_MB = 8.0  # "within a few MB of q, k, v and out"
TARGET_DTYPES, TARGET_DIMS, TARGET_L = ("bfloat16", "float16"), (64, 128), (512, 16384)


# -- cells and tables -------------------------------------------------------------------------
def show(cell: AttnCell, r: Any) -> str:
    """What a table shows for one implementation: its metric, or MISMATCH / ERROR / —."""
    if r is None or r.status == "n/a":
        return MISSING
    if r.status != "ok":
        return str(r.status)
    return fmt_gbps(cell.value(r))  # same formatting for TFLOP/s and GB/s


def shown_peers(run: AttnRun, cells: list[AttnCell]) -> list[str]:
    """Peers that cover at least one of ``cells`` (no all-'—' columns)."""
    return [
        p
        for p in run.peers
        if any(c.peers.get(p) is not None and c.peers[p].status != "n/a" for c in cells)
    ]


def forward_table(run: AttnRun) -> tuple[list[str], list[list[str]]]:
    """dtype | D | L | B×H | causal | cunorm | peers | best peer | cunorm/best, /FA2, /cuDNN."""
    peers = shown_peers(run, run.forward)
    headers = [
        "dtype",
        "D",
        "L",
        "B×H",
        "causal",
        "cunorm",
        *peers,
        "best peer",
        "cunorm/best",
        "cunorm/FA2",
        "cunorm/cuDNN",
    ]
    rows = []
    for c in run.forward:
        s, best = c.shape, c.best_peer()
        rows.append(
            [
                s.dtype,
                str(s.d),
                str(s.lq),
                f"{s.batch}×{s.hq}",
                "yes" if s.causal else "no",
                show(c, c.cunorm),
                *(show(c, c.peers.get(p)) for p in peers),
                best[0] if best else MISSING,
                fmt_ratio(c.ratio()),
                fmt_ratio(c.ratio("flash")),
                fmt_ratio(c.ratio("cudnn")),
            ]
        )
    return headers, rows


def forward_right(headers: list[str]) -> set[int]:
    return set(range(len(headers))) - {0, 4, headers.index("best peer")}


def decode_table(run: AttnRun, copy_gbps: float) -> tuple[list[str], list[list[str]]]:
    """dtype | B | Lk | K/V MB | cunorm µs | cunorm GB/s | peers | best | /best | /copy."""
    peers = shown_peers(run, run.decode)
    headers = [
        "dtype",
        "B",
        "Lk",
        "K/V MB",
        "cunorm µs",
        "cunorm GB/s",
        *peers,
        "best peer",
        "cunorm/best",
        "cunorm/copy",
    ]
    rows = []
    for c in run.decode:
        s, best = c.shape, c.best_peer()
        mine = c.value(c.cunorm)
        us = MISSING if c.cunorm.ms is None or not c.cunorm.usable else f"{1e3 * c.cunorm.ms:.1f}"
        rows.append(
            [
                s.dtype,
                str(s.batch),
                str(s.lk),
                f"{s.kv_bytes / 1e6:.0f}",
                us,
                show(c, c.cunorm),
                *(show(c, c.peers.get(p)) for p in peers),
                best[0] if best else MISSING,
                fmt_ratio(c.ratio()),
                fmt_pct(mine / copy_gbps if mine and copy_gbps else None),
            ]
        )
    return headers, rows


def decode_right(headers: list[str]) -> set[int]:
    return set(range(len(headers))) - {0, headers.index("best peer")}


def _mb(v: float | None) -> str:
    return MISSING if v is None or not math.isfinite(v) else f"{v:.1f}"


def memory_table(run: AttnRun) -> tuple[list[str], list[list[str]]]:
    """impl | causal | q+k+v+out MB | peak extra MB | pool growth MB | device MB | status.

    Reasons for n/a and ERROR are in the run notes."""
    headers = [
        "impl",
        "causal",
        "q+k+v+out MB",
        "peak extra MB",
        "pool growth MB",
        "free-memory drop MB",
        "status",
    ]
    rows = [
        [
            r["impl"],
            "yes" if r["causal"] else "no",
            _mb(r["io_mb"]),
            _mb(r["extra_mb"]),
            _mb(r["pool_growth_mb"]),
            _mb(r["device_mb"]),
            r["status"],
        ]
        for r in run.memory
    ]
    return headers, rows


# -- summary ----------------------------------------------------------------------------------
def _in_target(c: AttnCell) -> bool:
    s = c.shape
    return (
        s.dtype in TARGET_DTYPES
        and s.d in TARGET_DIMS
        and TARGET_L[0] <= s.lq <= TARGET_L[1]
        and s.lq == s.lk
    )


def short_cell(c: AttnCell) -> str:
    """``bf16 D64 L512 causal`` / ``bf16 B1 Lk16384``."""
    s = c.shape
    dt = SHORT_DTYPE.get(s.dtype, s.dtype)
    if c.kind == "decode":
        return f"{dt} B{s.batch} Lk{s.lk}"
    return f"{dt} D{s.d} L{s.lq}" + (" causal" if s.causal else "")


def _verdict(checked: int, failed: list[str]) -> str:
    return "n/a" if checked == 0 else ("PASS" if not failed else "FAIL")


def summarize(run: AttnRun, copy_gbps: float) -> dict[str, Any]:
    """The three targets, the cuDNN comparison and guard failures, as plain data."""
    targets = []
    scope = [c for c in run.forward if _in_target(c)]
    failed, checked = [], 0
    for c in scope:
        r = c.ratio("flash")
        if c.cunorm.status != "ok":
            failed.append(f"{short_cell(c)} {c.cunorm.status}")
        elif r is None:
            continue  # flash did not run this cell: nothing to compare with
        elif r < FORWARD_TARGET:
            failed.append(f"{short_cell(c)} {r:.3f}x")
        checked += 1
    targets.append(
        {
            "label": "forward: at least 1.0x torch SDPA flash (FA2), bf16/fp16, "
            "D 64/128, L 512-16384, causal and not",
            "checked": checked,
            "failed": failed,
            "verdict": _verdict(checked, failed),
        }
    )
    failed, checked = [], 0
    for c in run.decode:
        if c.shape.lk < DECODE_MIN_LK:
            continue
        mine = c.value(c.cunorm)
        checked += 1
        if mine is None:
            failed.append(f"{short_cell(c)} {c.cunorm.status}")
        elif mine < DECODE_TARGET * copy_gbps:
            failed.append(f"{short_cell(c)} {100 * mine / copy_gbps:.1f}%")
    targets.append(
        {
            "label": f"decoding: K/V read at >= {100 * DECODE_TARGET:.0f}% of copy "
            f"bandwidth for Lk >= {DECODE_MIN_LK}",
            "checked": checked,
            "failed": failed,
            "verdict": _verdict(checked, failed),
        }
    )
    failed, checked = [], 0
    for m in run.memory:
        if m["impl"] != "cunorm":
            continue
        checked += 1
        extra = [v for v in (m["extra_mb"], m["device_mb"]) if v is not None]
        causal = "causal" if m["causal"] else "non-causal"
        if m["status"] != "ok" or not extra:
            failed.append(f"{causal} {m['status']}")
        elif max(extra) > MEMORY_TARGET_MB:
            failed.append(f"{causal} {max(extra):.1f} MB")
    targets.append(
        {
            "label": f"memory: peak extra <= {MEMORY_TARGET_MB:g} MB beyond q, k, v "
            f"and out at L = 65536",
            "checked": checked,
            "failed": failed,
            "verdict": _verdict(checked, failed),
        }
    )
    cudnn = [r for c in scope if (r := c.ratio("cudnn")) is not None]
    guard = [
        {"cell": short_cell(c), "impl": name, "status": r.status, "note": r.note}
        for c in [*run.forward, *run.decode]
        for name, r in [("cunorm", c.cunorm), *c.peers.items()]
        if r.status in ("MISMATCH", "ERROR")
    ]
    return {
        "targets": targets,
        "vs_cudnn": {
            "cells": len(cudnn),
            "min": min(cudnn) if cudnn else None,
            "median": statistics.median(cudnn) if cudnn else None,
            "at_least_1": sum(r >= 1.0 for r in cudnn),
        },
        "guard_failures": guard,
    }


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """Human-readable verdict lines (screen and markdown)."""
    lines = []
    for t in summary["targets"]:
        detail = ""
        if t["failed"]:
            shown = ", ".join(t["failed"][:12])
            more = f", ... ({len(t['failed']) - 12} more)" if len(t["failed"]) > 12 else ""
            detail = f": {len(t['failed'])} of {t['checked']} miss it ({shown}{more})"
        elif t["checked"]:
            detail = f": all {t['checked']} cells"
        lines.append(f"{t['label']}: {t['verdict']}{detail}")
    cu = summary["vs_cudnn"]
    if cu["cells"]:
        lines.append(
            f"vs torch SDPA cuDNN (the next target): cunorm/cuDNN min {cu['min']:.2f}x, "
            f"median {cu['median']:.2f}x, >= 1.0x in {cu['at_least_1']} of "
            f"{cu['cells']} cells"
        )
    failures = summary["guard_failures"]
    mine = [g["cell"] for g in failures if g["impl"] == "cunorm" and g["status"] == "MISMATCH"]
    lines.append(
        f"correctness guard: cunorm MISMATCH in {len(mine)} cell(s): {', '.join(mine)}"
        if mine
        else "correctness guard: cunorm matches in every cell checked"
    )
    peers = [
        f"{g['impl']} {g['cell']}"
        for g in failures
        if g["impl"] != "cunorm" and g["status"] == "MISMATCH"
    ]
    if peers:
        lines.append("peer outputs failing the guard (never counted): " + ", ".join(peers))
    errors = [f"{g['impl']} {g['cell']}" for g in failures if g["status"] == "ERROR"]
    if errors:
        lines.append("errors (see notes): " + ", ".join(errors))
    return lines


# -- text -------------------------------------------------------------------------------------
def method_paragraph(meta: dict[str, Any]) -> str:
    """The "how we measured" paragraph of the attention report."""
    return (
        f"Forward: FlashAttention's convention, batch × seqlen = {TOKENS} tokens, hidden "
        f"{HIDDEN} (H = {HIDDEN} / D), TFLOP/s = 4·B·H·Lq·Lk·D / time, halved for causal. "
        f"Decoding: Lq = 1, {DECODE_HQ} query heads over {DECODE_HKV} KV heads (grouped-query), "
        "not causal (with the mask aligned bottom-right one query sees every key); GB/s = "
        "K/V bytes read (2·B·Hkv·Lk·D·itemsize) / time, and cunorm/copy its ratio to the "
        "device-to-device copy bandwidth of the same run. Inputs: q, k, v random normal, "
        "(B, H, L, D) contiguous, created once per cell with CuPy and shared with torch "
        "through DLPack; JAX gets (B, L, H, D) contiguous copies of the same values, its "
        f"native layout. GPU times: {meta['timer']}. cunorm is timed as a user calls it "
        f"({OPS['attention'].usage}), output allocation included. Peers: torch "
        "`F.scaled_dot_product_attention(q, k, v, is_causal=...)` inside "
        "`torch.nn.attention.sdpa_kernel([SDPBackend.X])` for flash (FLASH_ATTENTION, FA2), "
        "cudnn (CUDNN_ATTENTION) and efficient (EFFICIENT_ATTENTION), and without it for "
        "default (torch's own pick); GQA cells pass `enable_gqa=True` (see notes). jax / "
        "jax-cudnn: `jax.jit` of `jax.nn.dot_product_attention(..., implementation=None / "
        "'cudnn')` (None is JAX's default pick; in jax 0.10 that is XLA's composed attention, "
        "which materializes the L×L scores), "
        "wall clock around `block_until_ready()` after an L2 flush, so it includes dispatch "
        "(indicative only); forward sweep only. A backend refusing a shape shows as '—' with "
        "its reason in the notes. Correctness guard: before timing, every output is compared "
        "with torch SDPA's on the same inputs (the flash backend where it runs; relative "
        "max-norm per query row over D; bfloat16 1.6e-2, float16 2e-3, float32 2e-6); rows "
        "over tolerance are re-checked against a float64 reference, so torch's rounding is not "
        "blamed on others. A failure shows as MISMATCH and never counts. Peak extra memory "
        "(MB = 10^6 bytes), one call after a warm-up, CuPy's pool emptied first: peak extra = "
        "the peak of CuPy pool bytes in use during the call (a `cupy.cuda.MemoryHook` summing "
        "malloc and free) less the output; pool growth = `MemoryPool.total_bytes()` after less "
        "before, less the output; free-memory drop = `cudaMemGetInfo` free bytes before less "
        "after, less the output (counts allocations outside CuPy's pool too; 2 MB "
        "granularity). torch backends: `torch.cuda.max_memory_allocated()` over the call less "
        "the allocation before it and the output."
    )


def print_report(meta: dict[str, Any], run: AttnRun, summary: dict[str, Any]) -> None:
    """The tables and the summary on stdout."""
    copy = meta["copy_gbps"]
    if run.forward:
        h, r = forward_table(run)
        print(f"\n== attention forward (TFLOP/s), {meta['device']} ==")
        print(text_table(h, r, right=forward_right(h)))
    if run.decode:
        h, r = decode_table(run, copy)
        print(f"\n== attention decoding (GB/s of K/V read), copy {copy:.0f} GB/s ==")
        print(text_table(h, r, right=decode_right(h)))
    if run.memory:
        print(f"\n== attention: peak extra memory at L = 65536, {meta['device']} ==")
        print(text_table(*memory_table(run), right={2, 3, 4, 5}))
    print()
    for line in summary_lines(summary):
        print(f"  {line}")


def write_markdown(path: Path, meta: dict[str, Any], run: AttnRun, summary: dict[str, Any]) -> None:
    copy = meta["copy_gbps"]
    parts = header_lines(meta, "attention", method_paragraph(meta))
    if run.forward:
        h, r = forward_table(run)
        parts += [
            "",
            f"## Forward (TFLOP/s), {TOKENS // 1024}k tokens, hidden {HIDDEN}",
            "",
            md_table(h, r, right=forward_right(h)),
        ]
    if run.decode:
        h, r = decode_table(run, copy)
        parts += [
            "",
            f"## Decoding (GB/s of K/V read), Lq = 1, Hq = {DECODE_HQ}, "
            f"Hkv = {DECODE_HKV}, D = 128",
            "",
            md_table(h, r, right=decode_right(h)),
        ]
    if run.memory:
        parts += [
            "",
            "## Peak extra memory at L = 65536 (B = 1, H = 16, D = 128, bfloat16)",
            "",
            md_table(*memory_table(run), right={2, 3, 4, 5}),
        ]
    parts += ["", "## Summary", ""] + [f"- {line}" for line in summary_lines(summary)]
    if run.notes:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in run.notes]
    path.write_text("\n".join(parts) + "\n")


def write_json(path: Path, meta: dict[str, Any], run: AttnRun, summary: dict[str, Any]) -> None:
    data = {
        "meta": meta,
        "op": "attention",
        "peers": run.peers,
        "forward": [c.to_dict() for c in run.forward],
        "decode": [c.to_dict() for c in run.decode],
        "memory": run.memory,
        "summary": summary,
        "notes": run.notes,
    }
    path.write_text(to_json(data))


def plot_panels(run: AttnRun) -> list[tuple[str, int, bool]]:
    """(dtype, D, causal) of each forward subplot, in order."""
    return list(dict.fromkeys((c.shape.dtype, c.shape.d, c.shape.causal) for c in run.forward))


def write_plot(path: Path, meta: dict[str, Any], run: AttnRun) -> bool:
    """TFLOP/s against L (log2 axis), one subplot per (D, causal), one row per dtype.

    Returns False (and writes nothing) without matplotlib or forward cells.
    """
    plt = import_pyplot()
    panels = plot_panels(run)
    if plt is None or not panels:
        return False
    dtypes = list(dict.fromkeys(p[0] for p in panels))
    cols = list(dict.fromkeys((d, causal) for _, d, causal in panels))
    fig, axes = plt.subplots(
        len(dtypes),
        len(cols),
        figsize=(4.4 * len(cols), 3.8 * len(dtypes)),
        squeeze=False,
        sharey=True,
    )
    impls = ["cunorm", *run.peers]
    colors = {impl: f"C{i}" for i, impl in enumerate(impls)}
    for i, dtype in enumerate(dtypes):
        for j, (d, causal) in enumerate(cols):
            ax = axes[i][j]
            cells = sorted(
                (
                    c
                    for c in run.forward
                    if (c.shape.dtype, c.shape.d, c.shape.causal) == (dtype, d, causal)
                ),
                key=lambda c: c.shape.lq,
            )
            xs = [c.shape.lq for c in cells]
            for impl in impls:
                ys = [c.value(c.cunorm if impl == "cunorm" else c.peers.get(impl)) for c in cells]
                ys_f = [math.nan if y is None else y for y in ys]
                if not xs or all(math.isnan(y) for y in ys_f):
                    continue
                ax.plot(
                    xs,
                    ys_f,
                    marker="o",
                    markersize=3.5,
                    label=impl,
                    color=colors[impl],
                    linewidth=2.4 if impl == "cunorm" else 1.2,
                    zorder=3 if impl == "cunorm" else 2,
                )
            if xs:
                log2_axis(ax, xs)
            ax.set_title(f"{dtype}, D={d}, {'causal' if causal else 'non-causal'}", fontsize=10)
            ax.set_xlabel("L")
            ax.grid(True, which="major", alpha=0.3)
        axes[i][0].set_ylabel("TFLOP/s")
    axes[0][0].set_ylim(bottom=0)
    figure_legend(fig, [ax for row in axes for ax in row])
    save_figure(fig, path, f"cunorm attention forward, {meta['device']}, {meta['date']}", 0.06)
    return True


def write_attention_files(
    out_dir: Path, meta: dict[str, Any], run: AttnRun, summary: dict[str, Any], plot: bool = True
) -> list[Path]:
    """Write ``.md``, ``.json`` and (with matplotlib) ``.png``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / base_name(meta, "attention")
    paths = [base.with_suffix(".md"), base.with_suffix(".json")]
    write_markdown(paths[0], meta, run, summary)
    write_json(paths[1], meta, run, summary)
    if plot and write_plot(base.with_suffix(".png"), meta, run):
        paths.append(base.with_suffix(".png"))
    return paths
