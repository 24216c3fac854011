"""Turning results into a screen table, markdown, JSON and a PNG plot.

The same rows feed the screen and the markdown, so the two never disagree. Targets are the
Done-when ranges of the performance issue: at least 90% of copy bandwidth for cols 1024-32768,
at least 80% for cols 65536-262144, and at least the best peer for cols 32-32768.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ops import OPS
from .sweep import Cell, OpRun

MISSING = "—"


@dataclass(frozen=True)
class Target:
    """A Done-when criterion over a cols range."""

    label: str
    lo: int
    hi: int
    kind: str  # "copy": cunorm/copy >= threshold; "peer": cunorm >= best peer
    threshold: float = 1.0

    def covers(self, cell: Cell) -> bool:
        return self.lo <= cell.cols <= self.hi


TARGETS = (
    Target("at least 90% of copy bandwidth, cols 1024-32768", 1024, 32768, "copy", 0.90),
    Target("at least 80% of copy bandwidth, cols 65536-262144", 65536, 262144, "copy", 0.80),
    Target("at least as fast as the best peer, cols 32-32768", 32, 32768, "peer"),
)


# -- formatting -------------------------------------------------------------------------------
def fmt_gbps(v: float | None) -> str:
    """GB/s as an integer; two significant digits below 10 (the NumPy path, tiny cells)."""
    if v is None or not math.isfinite(v):
        return MISSING
    return f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def fmt_pct(v: float | None) -> str:
    return MISSING if v is None or not math.isfinite(v) else f"{100 * v:.0f}%"


def fmt_ratio(v: float | None) -> str:
    return MISSING if v is None or not math.isfinite(v) else f"{v:.2f}x"


def show(cell_result: Any) -> str:
    """What a table shows for one implementation: GB/s, or MISMATCH / ERROR / —."""
    if cell_result is None or cell_result.status == "n/a":
        return MISSING
    if cell_result.status != "ok":
        return cell_result.status
    return fmt_gbps(cell_result.gbps)


def ratio_best(cell: Cell) -> float | None:
    best = cell.best_peer()
    if best is None or not cell.cunorm.usable or not best[1]:
        return None
    return cell.cunorm.gbps / best[1]  # type: ignore[operator]


def ratio_copy(cell: Cell, copy_gbps: float) -> float | None:
    if not cell.cunorm.usable or not copy_gbps:
        return None
    return cell.cunorm.gbps / copy_gbps  # type: ignore[operator]


def text_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Aligned plain-text table; columns in ``right`` (default: all but the first) right-aligned."""
    right = set(range(1, len(headers))) if right is None else right
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(
            str(v).rjust(w) if i in right else str(v).ljust(w)
            for i, (v, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def md_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """GitHub markdown table; columns in ``right`` right-aligned."""
    right = set(range(1, len(headers))) if right is None else right
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


# -- tables -----------------------------------------------------------------------------------
def shown_peers(run: OpRun) -> list[str]:
    """Peers with at least one cell they cover (cupyx has no norms: no all-'—' column)."""
    return [
        p
        for p in run.peers
        if any(c.peers.get(p) is not None and c.peers[p].status != "n/a" for c in run.cells)
    ]


def sweep_right(run: OpRun) -> set[int]:
    """Right-aligned (numeric) columns of :func:`sweep_table`: all but dtype and best peer."""
    n = len(shown_peers(run))
    return set(range(1, 7 + n)) - {4 + n}


def sweep_table(run: OpRun, copy_gbps: float) -> tuple[list[str], list[list[str]]]:
    """dtype | cols | rows | cunorm GB/s | each peer | best peer | cunorm/best | cunorm/copy."""
    peers = shown_peers(run)
    headers = [
        "dtype",
        "cols",
        "rows",
        "cunorm GB/s",
        *peers,
        "best peer",
        "cunorm/best",
        "cunorm/copy",
    ]
    rows = []
    for c in run.cells:
        best = c.best_peer()
        rows.append(
            [
                c.dtype,
                str(c.cols),
                str(c.rows),
                show(c.cunorm),
                *(show(c.peers.get(p)) for p in peers),
                best[0] if best else MISSING,
                fmt_ratio(ratio_best(c)),
                fmt_pct(ratio_copy(c, copy_gbps)),
            ]
        )
    return headers, rows


def extras_table(run: OpRun, copy_gbps: float) -> tuple[list[str], list[list[str]]]:
    """Extra layouts: dtype | shape | axis | cunorm | peers | cunorm/best | cunorm/copy."""
    peers = [p for p in run.peers if any(p in c.peers for c in run.extras)]
    headers = ["dtype", "shape", "axis", "cunorm GB/s", *peers, "cunorm/best", "cunorm/copy"]
    rows = [
        [
            c.dtype,
            "(" + ", ".join(map(str, c.shape)) + ")",
            str(c.axis),
            show(c.cunorm),
            *(show(c.peers.get(p)) for p in peers),
            fmt_ratio(ratio_best(c)),
            fmt_pct(ratio_copy(c, copy_gbps)),
        ]
        for c in run.extras
    ]
    return headers, rows


# -- summary ----------------------------------------------------------------------------------
def _cell_id(c: Cell) -> dict[str, Any]:
    return {
        "dtype": c.dtype,
        "cols": c.cols,
        "rows": c.rows,
        "shape": list(c.shape),
        "axis": c.axis,
    }


def summarize(run: OpRun, copy_gbps: float) -> dict[str, Any]:
    """Cells below the best peer, cells below the copy targets, guard failures, verdicts."""
    cells = run.cells
    below_peer = []
    for c in cells:
        r, best = ratio_best(c), c.best_peer()
        if r is not None and best is not None and r < 1.0:
            below_peer.append(
                {
                    **_cell_id(c),
                    "cunorm_gbps": c.cunorm.gbps,
                    "best_peer": best[0],
                    "best_gbps": best[1],
                    "ratio": r,
                }
            )
    targets = []
    for t in TARGETS:
        scope = [c for c in cells if t.covers(c)]
        failed, unknown = [], 0
        for c in scope:
            if c.cunorm.status != "ok":
                failed.append({**_cell_id(c), "reason": c.cunorm.status})
                continue
            if t.kind == "copy":
                value = ratio_copy(c, copy_gbps)
            else:
                value = ratio_best(c)
                if value is None:  # no peer covered this cell: nothing to compare against
                    unknown += 1
                    continue
            if value is None or value < t.threshold:
                failed.append({**_cell_id(c), "value": value, "reason": "below"})
        checked = len(scope) - unknown
        verdict = "n/a" if checked == 0 else ("PASS" if not failed else "FAIL")
        targets.append(
            {
                "label": t.label,
                "kind": t.kind,
                "threshold": t.threshold,
                "lo": t.lo,
                "hi": t.hi,
                "checked": checked,
                "failed": failed,
                "verdict": verdict,
            }
        )
    guard = [
        {**_cell_id(c), "impl": name, "status": r.status, "note": r.note}
        for c in [*cells, *run.extras]
        for name, r in [("cunorm", c.cunorm), *c.peers.items()]
        if r.status in ("MISMATCH", "ERROR")
    ]
    return {"below_best_peer": below_peer, "targets": targets, "guard_failures": guard}


def _short_cell(f: dict[str, Any], kind: str) -> str:
    """``dtype/cols value`` for a failed cell, e.g. ``float16/4096 84%``."""
    if f.get("reason") not in (None, "below"):
        extra = f" {f['reason']}"
    elif f.get("value") is None:
        extra = ""
    else:
        # One more digit than the tables: 89.6% must not read as the 90% it misses.
        v = f["value"]
        extra = f" {100 * v:.1f}%" if kind == "copy" else f" {v:.3f}x"
    return f"{f['dtype']}/{f['cols']}{extra}"


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """Human-readable verdict lines (screen and markdown)."""
    lines = []
    for t in summary["targets"]:
        failed = t["failed"]
        detail = ""
        if failed:
            shown = ", ".join(_short_cell(f, t["kind"]) for f in failed[:12])
            more = f", ... ({len(failed) - 12} more)" if len(failed) > 12 else ""
            detail = f": {len(failed)} of {t['checked']} cells miss it ({shown}{more})"
        elif t["checked"]:
            detail = f": all {t['checked']} cells"
        lines.append(f"{t['label']}: {t['verdict']}{detail}")
    failures = summary["guard_failures"]
    mine = [g for g in failures if g["impl"] == "cunorm" and g["status"] == "MISMATCH"]
    if mine:
        cells = ", ".join(f"{g['dtype']}/{g['cols']}" for g in mine)
        lines.append(f"correctness guard: cunorm MISMATCH in {len(mine)} cell(s): {cells}")
    else:
        lines.append("correctness guard: cunorm matches in every cell checked")
    peers = [g for g in failures if g["impl"] != "cunorm" and g["status"] == "MISMATCH"]
    if peers:
        lines.append(
            "peer outputs failing the guard (never counted as best peer): "
            + ", ".join(f"{g['impl']} {g['dtype']}/{g['cols']}" for g in peers)
        )
    errors = [g for g in failures if g["status"] == "ERROR"]
    if errors:
        lines.append(
            "errors (see notes): "
            + ", ".join(f"{g['impl']} {g['dtype']}/{g['cols']}" for g in errors)
        )
    return lines


# -- files ------------------------------------------------------------------------------------
def base_name(meta: dict[str, Any], op: str) -> str:
    """``{device_slug}-{YYYY-MM-DD}-{op}``."""
    return f"{meta['slug']}-{meta['date']}-{op}"


def versions_line(meta: dict[str, Any]) -> str:
    v = meta.get("versions", {})
    keys = ("cunorm", "cupy", "torch", "jax", "triton", "cuda_runtime", "cuda_driver")
    return ", ".join(f"{k} {v.get(k) or 'not installed'}" for k in keys if k in v)


def method_paragraph(meta: dict[str, Any], op: str = "softmax") -> str:
    """The "how we measured" paragraph of a report."""
    spec = OPS.get(op)
    arrays = spec.arrays_moved if spec is not None else 2
    usage = spec.usage if spec is not None else f"`cunorm.{op}(x, ...)`"
    residual = spec is not None and spec.residual
    inputs = "random normal data"
    cupyx = "cupyx: `cupyx.scipy.special` (float16/float32)"
    if residual:
        moved = (
            f"{arrays}·rows·cols·itemsize / time (x and the residual r read, y and h = x + r "
            "written; norm weights, biases and statistics are O(cols) or O(rows) and not "
            "counted). Every implementation computes h = x + r rounded to x's dtype and "
            "y = norm(h) and returns both: torch eager as `h = t + r` then the norm (two "
            "kernels), torch.compile and JAX the same function compiled (Inductor fuses the "
            "add into the norm kernel)"
        )
        triton = "triton: not timed (the minimal norm kernel has no fused residual add)"
        guard = (
            " For this op y is checked so against the norm of h_ref = x + r rounded to x's "
            "dtype, and h must equal h_ref in every element."
        )
    elif spec is not None and spec.family == "softmax_grad":
        formula = "dx = dy − exp(y)·Σdy" if spec.log else "dx = y·(dy − Σ y·dy)"
        moved = (
            f"{arrays}·rows·cols·itemsize / time (y and dy read, dx written: three full-size "
            f"arrays). torch eager runs `torch.ops.aten.{spec.aten_grad}(dy, y, dim, y.dtype)` "
            "(what autograd runs), torch.compile the same function compiled (Inductor generates "
            f"one fused Triton kernel), JAX the formula {formula} in jnp (float32 for 16-bit "
            "inputs)"
        )
        forward = "log_softmax" if spec.log else "softmax"
        inputs = (
            f"y = {forward} of random normal data (computed in float64, rounded to the dtype) "
            "and a random normal dy,"
        )
        triton = (
            "triton: not timed (the minimal kernels are forward only; torch.compile's column "
            "is Inductor's Triton kernel)"
        )
        cupyx = "cupyx: not timed (cupyx.scipy.special has no softmax gradient)"
        guard = (
            f" For this op the float64 reference is {formula} (sums over the row) on the same "
            "rounded y and dy the implementations read."
        )
    elif spec is not None and spec.family == "norm_grad":
        moved, inputs, guard = _norm_grad_method(spec)
        triton = (
            "triton: not timed (the minimal kernels are forward only; torch.compile's column "
            "is Inductor's Triton code)"
        )
        cupyx = "cupyx: not timed (cupyx.scipy.special has no norms and no norm gradients)"
    else:
        moved = (
            f"{arrays}·rows·cols·itemsize / time (norm weights, biases and statistics are "
            "O(cols) or O(rows) and not counted)"
        )
        triton = (
            "triton: a minimal one-row-per-program kernel with the row in registers (cols ≤ 16384)"
        )
        guard = ""
    return (
        f"GB/s = (bytes read + bytes written) / time = {moved}. Every "
        f"implementation in a cell reads the same device buffers: {inputs} created "
        "once with CuPy and shared with PyTorch and JAX through DLPack. GPU times: "
        f"{meta['timer']}. cunorm is timed the way a user calls it ({usage}), "
        "output allocation included (from CuPy's memory pool), like torch eager, "
        "torch.compile and the Triton peer. torch.compile: `torch.compile(f, dynamic=False)`, "
        "recompiled per shape and warmed before timing. JAX: `jax.jit`, wall clock around "
        "`block_until_ready()` after an L2 flush, so it includes dispatch (indicative only). "
        f"{triton}. {cupyx}. Copy bandwidth: "
        "device-to-device `cudaMemcpyAsync` of a 1 GiB buffer in the same run, counted as "
        "2 × bytes. Correctness guard: before timing, every output is compared with torch "
        "eager's on the same input (max |diff| over a row divided by the row's max |ref|; "
        "float16 2e-3, bfloat16 1.6e-2, float32 2e-6); rows over tolerance are re-checked "
        f"against a float64 reference, so PyTorch's own rounding is not blamed on others.{guard} "
        "A failure shows as MISMATCH and never counts as best peer. '—': not covered (see notes)."
    )


def _norm_grad_method(spec: Any) -> tuple[str, str, str]:
    """(bytes and peers, inputs, guard) sentences of :func:`method_paragraph` for a norm
    gradient (layer_norm_backward, rms_norm_backward)."""
    if spec.rms:
        torch_call = (
            "`torch.ops.aten._fused_rms_norm_backward(dy, x, [cols], rstd, w, [True, True])` "
            "(what autograd runs) on the rstd of `aten._fused_rms_norm`, computed before "
            "timing (a torch without these ops on CUDA: the gradient formula in float32 torch "
            "ops instead, as the notes say)"
        )
        outputs, stats = "dx and dweight", "rstd"
        formula = "dx = rstd·(g − x̂·mean(g·x̂)), g = dy·w, x̂ = x·rstd"
    else:
        torch_call = (
            "`torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, "
            "[True, True, True])` (what autograd runs) on the mean and rstd of "
            "`aten.native_layer_norm`, computed before timing"
        )
        outputs, stats = "dx, dweight and dbias", "mean and rstd"
        formula = "dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·w, x̂ = (x − mean)·rstd"
    moved = (
        f"{spec.arrays_moved}·rows·cols·itemsize / time (x and dy read, dx written: three "
        f"full-size arrays; the weight, the statistics and the weight's gradients are O(cols) "
        f"or O(rows) and not counted). Every implementation returns {outputs}, on the "
        f"statistics of its own library's forward. torch eager runs {torch_call}; "
        "torch.compile the same function compiled (Inductor generates Triton code from the op's "
        "decomposition); JAX `jax.vjp` of the norm written "
        "in jnp (float32 for 16-bit inputs) with respect to x and the weight"
        + ("" if spec.rms else " and bias")
        + f", applied to dy, all under one `jax.jit` (it recomputes the {stats} from x)"
    )
    inputs = f"random normal x, weight{'' if spec.rms else ', bias'} and dy,"
    guard = (
        f" For this op dx is checked, against the float64 formula {formula} (means over the "
        f"row, {stats} computed in float64 from x); of dweight"
        + ("" if spec.rms else " and dbias")
        + " only the shape."
    )
    return moved, inputs, guard


def uuid_suffix(meta: dict[str, Any]) -> str:
    """`` (GPU-...)`` after the device name where the run recorded the GPU's UUID."""
    return f" ({meta['uuid']})" if meta.get("uuid") else ""


def header_lines(meta: dict[str, Any], what: str, method: str) -> list[str]:
    """The opening of a results file: title, device and copy bandwidth, versions, command,
    method (``what``: e.g. ``"softmax"``; the title reads "cunorm <what> benchmark")."""
    return [
        f"# cunorm {what} benchmark, {meta['device']}, {meta['date']}",
        "",
        f"Device: **{meta['device']}**{uuid_suffix(meta)}. Device-to-device copy (read+write): "
        f"**{meta['copy_gbps']:.0f} GB/s**.",
        "",
        f"Versions: {versions_line(meta)}.",
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
        "Method: " + method,
    ]


def write_markdown(path: Path, meta: dict[str, Any], run: OpRun, summary: dict[str, Any]) -> None:
    copy = meta["copy_gbps"]
    parts = [
        *header_lines(meta, run.op, method_paragraph(meta, run.op)),
        "",
        f"## {run.op} (GB/s), shape (rows, cols)",
        "",
        md_table(*sweep_table(run, copy), right=sweep_right(run)),
    ]
    if run.extras:
        h, r = extras_table(run, copy)
        parts += [
            "",
            f"## {run.op} over a non-last axis (GB/s)",
            "",
            md_table(h, r, right=set(range(3, len(h)))),
        ]
    parts += ["", "## Summary", ""]
    parts += [f"- {line}" for line in summary_lines(summary)]
    if summary["below_best_peer"]:
        rows = [
            [
                b["dtype"],
                str(b["cols"]),
                fmt_gbps(b["cunorm_gbps"]),
                b["best_peer"],
                fmt_gbps(b["best_gbps"]),
                f"{b['ratio']:.3f}x",
            ]
            for b in summary["below_best_peer"]
        ]
        parts += [
            "",
            "### Cells where cunorm is below the best peer",
            "",
            md_table(
                ["dtype", "cols", "cunorm GB/s", "best peer", "peer GB/s", "cunorm/best"],
                rows,
                right={1, 2, 4, 5},
            ),
        ]
    copy_fail = [(t, f) for t in summary["targets"] if t["kind"] == "copy" for f in t["failed"]]
    if copy_fail:
        rows = [
            [
                f["dtype"],
                str(f["cols"]),
                f"{100 * f['value']:.1f}%" if f.get("value") is not None else f["reason"],
                f"{100 * t['threshold']:.0f}%",
            ]
            for t, f in copy_fail
        ]
        parts += [
            "",
            "### Cells below the copy-bandwidth target",
            "",
            md_table(["dtype", "cols", "cunorm/copy", "target"], rows, right={1, 2, 3}),
        ]
    if run.notes:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in run.notes]
    path.write_text("\n".join(parts) + "\n")


def write_json(path: Path, meta: dict[str, Any], run: OpRun, summary: dict[str, Any]) -> None:
    data = {
        "meta": meta,
        "op": run.op,
        "peers": run.peers,
        "cells": [c.to_dict() for c in run.cells],
        "extras": [c.to_dict() for c in run.extras],
        "summary": summary,
        "notes": run.notes,
    }
    path.write_text(to_json(data))


def to_json(data: Any) -> str:
    """Strict JSON: non-finite floats (an infinite error, say) become null, which every JSON
    reader accepts, instead of Python's non-standard ``Infinity``/``NaN``."""
    return json.dumps(_finite(data), indent=1, allow_nan=False, default=str) + "\n"


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


def import_pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (GPU nodes have no display), or None when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def log2_axis(ax: Any, xs: list[int]) -> None:
    """A log2 x axis labelled at the powers of two among ``xs`` (every ``xs`` when fewer than
    three of them are powers of two)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    pow2 = [x for x in xs if x & (x - 1) == 0]
    ticks = pow2 if len(pow2) >= 3 else xs
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(t) for t in ticks], rotation=45, ha="right", fontsize=8)


def save_figure(fig: Any, path: Path, title: str, legend_band: float) -> None:
    """Title, lay out above a bottom band of height ``legend_band`` (figure fraction) kept for
    the legend, write ``path`` at 120 dpi and free the figure."""
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout(rect=(0, legend_band, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure_legend(fig: Any, axes: list[Any], ncol: int = 7) -> None:
    """One legend for the whole figure, below the plots so it never hides a curve; each label
    once, whichever subplots it appears in."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="lower center",
        ncol=min(len(handles), ncol),
        fontsize=9,
        frameon=False,
    )


def write_plot(path: Path, meta: dict[str, Any], run: OpRun) -> bool:
    """GB/s vs cols (log2 axis), one subplot per dtype, a dashed line at copy bandwidth.

    Returns False (and writes nothing) when matplotlib is not installed.
    """
    plt = import_pyplot()
    if plt is None:
        return False
    dtypes = list(dict.fromkeys(c.dtype for c in run.cells))
    if not dtypes:
        return False
    impls = ["cunorm", *run.peers]
    colors = {impl: f"C{i}" for i, impl in enumerate(impls)}  # stable across ops and dtypes
    fig, axes = plt.subplots(
        1, len(dtypes), figsize=(6.5 * len(dtypes), 4.8), squeeze=False, sharey=True
    )
    copy = meta["copy_gbps"]
    for ax, dtype in zip(axes[0], dtypes, strict=True):
        cells = sorted((c for c in run.cells if c.dtype == dtype), key=lambda c: c.cols)
        xs = [c.cols for c in cells]
        for impl in impls:
            res = [c.cunorm if impl == "cunorm" else c.peers.get(impl) for c in cells]
            ys = [r.gbps if r is not None and r.usable else math.nan for r in res]
            if all(math.isnan(y) for y in ys):
                continue
            # One colour per implementation across subplots, whichever peers a dtype lacks.
            ax.plot(
                xs,
                ys,
                marker="o",
                markersize=3.5,
                label=impl,
                color=colors[impl],
                linewidth=2.4 if impl == "cunorm" else 1.2,
                zorder=3 if impl == "cunorm" else 2,
            )
        ax.axhline(copy, linestyle="--", color="black", linewidth=1, label=f"copy ({copy:.0f})")
        log2_axis(ax, xs)
        ax.set_title(dtype)
        ax.set_xlabel("cols")
        ax.grid(True, which="major", alpha=0.3)
    # Shared y axis from 0 to just above the highest curve or the copy line, set once after
    # every subplot is drawn (a per-axis set_ylim would freeze the first subplot's range).
    ymax = max(
        [copy]
        + [
            y
            for ax in axes[0]
            for line in ax.get_lines()
            for y in line.get_ydata()
            if math.isfinite(y)
        ]
    )
    axes[0][0].set_ylim(0, 1.08 * ymax)
    axes[0][0].set_ylabel("GB/s (read + write)")
    figure_legend(fig, list(axes[0]))
    save_figure(fig, path, f"cunorm {run.op}, {meta['device']}, {meta['date']}", 0.08)
    return True


def write_op_files(
    out_dir: Path, meta: dict[str, Any], run: OpRun, summary: dict[str, Any], plot: bool = True
) -> list[Path]:
    """Write ``.md``, ``.json`` and (if matplotlib is there) ``.png``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / base_name(meta, run.op)
    paths = [base.with_suffix(".md"), base.with_suffix(".json")]
    write_markdown(paths[0], meta, run, summary)
    write_json(paths[1], meta, run, summary)
    if plot and write_plot(base.with_suffix(".png"), meta, run):
        paths.append(base.with_suffix(".png"))
    return paths


# -- overhead and NumPy fallback --------------------------------------------------------------
def overhead_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = ["implementation", "shape", "dtype", "calls", "µs/call (median)", "µs/call (min)"]
    body = [
        [
            r["impl"],
            "x".join(map(str, r["shape"])),
            r["dtype"],
            str(r["calls"]),
            MISSING if r["us_per_call"] is None else f"{r['us_per_call']:.2f}",
            MISSING if r["us_per_call_min"] is None else f"{r['us_per_call_min']:.2f}",
        ]
        for r in rows
    ]
    return headers, body


def write_overhead_files(
    out_dir: Path, meta: dict[str, Any], rows: list[dict[str, Any]], notes: list[str]
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / base_name(meta, "overhead")
    h, body = overhead_table(rows)
    text = [
        f"# cunorm per-call overhead, {meta['device']}, {meta['date']}",
        "",
        f"Versions: {versions_line(meta)}.",
        "",
        "Method: host wall clock (`time.perf_counter`) over back-to-back calls on a small "
        "float32 array, no synchronize inside the loop and one at the end; median (and min) of "
        "5 trials after 1000 warm-up calls. This is the cost of issuing one call from Python, "
        "which dominates for small inputs.",
        "",
        md_table(h, body, right={3, 4, 5}),
    ]
    if notes:
        text += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    md, js = base.with_suffix(".md"), base.with_suffix(".json")
    md.write_text("\n".join(text) + "\n")
    js.write_text(to_json({"meta": meta, "op": "overhead", "rows": rows, "notes": notes}))
    return [md, js]


def numpy_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = ["op", "dtype", "cols", "rows", "ms", "GB/s", "max err", "status"]
    body = [
        [
            r["op"],
            r["dtype"],
            str(r["cols"]),
            str(r["rows"]),
            MISSING if r["ms"] is None else f"{r['ms']:.3f}",
            fmt_gbps(r["gbps"]),
            MISSING if r["err"] is None else f"{r['err']:.1e}",
            r["status"] if not r["note"] else f"{r['status']} ({r['note']})",
        ]
        for r in rows
    ]
    return headers, body
