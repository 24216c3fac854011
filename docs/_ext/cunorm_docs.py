"""Build-time pages for the cunorm docs: benchmark tables and plots, dispatcher constants.

Everything generated goes to ``docs/_generated/`` (git-ignored) when the builder starts, from
files in the repository only (no network):

``dispatch_constants.inc`` and ``dispatch_subst.inc``
    the dispatcher's thresholds as a table and as reST substitutions, read from
    :mod:`cunorm._dispatch` (so the page never drifts from the code);
``thresholds_table.inc`` and ``thresholds.png``
    from the newest ``benchmarks/results/thresholds-*.md``: GB/s per path, the fastest path,
    the path this version of the dispatcher picks on that GPU, and a plot;
``cli_*.txt``
    ``--help`` of the command-line tools;
``benchmark-results.md``
    the newest ``benchmarks/results/{device}-{date}-{softmax,log_softmax}.md`` with their
    PNG plots, and the thresholds table, as one MyST page.

Missing inputs give a page that says so, never a warning, so the build passes with ``-W``
on a fresh checkout. Run this file directly to generate without Sphinx.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
#: The checkout whose code and results are documented (``CUNORM_DOCS_REPO`` when the docs
#: folder is a copy, as in tests/test_cpu_docs.py).
REPO = Path(os.environ.get("CUNORM_DOCS_REPO", DOCS.parent))
#: Benchmark results read; ``CUNORM_DOCS_RESULTS`` points elsewhere (tests build with none).
RESULTS = Path(os.environ.get("CUNORM_DOCS_RESULTS", REPO / "benchmarks" / "results"))
GEN = DOCS / "_generated"

#: Paths plotted (the columns of a thresholds table that name a dispatcher path).
MAIN_PATHS = ("warp", "block", "smem", "cluster", "uncached")
PATH_COLORS = {"warp": "tab:blue", "block": "tab:orange", "smem": "tab:green",
               "cluster": "tab:red", "uncached": "tab:purple"}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
DATE = r"(?P<date>\d{4}-\d{2}-\d{2})"
RESULT_RE = re.compile(rf"^(?P<slug>.+)-{DATE}-(?P<op>softmax|log_softmax)\.md$")
THRESHOLDS_RE = re.compile(rf"^thresholds-(?P<slug>.+?)-{DATE}(?P<tag>.*)\.md$")


# --- markdown tables ------------------------------------------------------------------------
def parse_pipe_table(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first GitHub-style pipe table in ``text`` (empty if none)."""
    block: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            block.append(line.strip())
        elif block:
            break
    if len(block) < 2:
        return [], []

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip("|").split("|")]

    return cells(block[0]), [cells(line) for line in block[2:]]


def gbps(cell: str) -> float | None:
    """``"3736*"`` -> 3736.0; ``"—"`` or anything else that is not a number -> None."""
    try:
        return float(cell.rstrip("*"))
    except ValueError:
        return None


@dataclass
class Thresholds:
    """One ``thresholds-*.md`` file."""

    path: Path
    title: str
    note: str
    paths: list[str]  # measured variants, in table order
    rows: list[dict] = field(default_factory=list)  # dtype, cols, rows, gbps{variant}, recorded

    @property
    def dtypes(self) -> list[str]:
        return list(dict.fromkeys(r["dtype"] for r in self.rows))


def thresholds_files(folder: Path = RESULTS) -> list[Path]:
    """``thresholds-{device}-{date}[-tag].md`` files, newest first: by date, then the untagged
    (main) measurement before tagged experiments, then by name."""
    found = [((m["date"], not m["tag"], p.name), p) for p in folder.glob("thresholds-*.md")
             if (m := THRESHOLDS_RE.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def newest_thresholds(folder: Path = RESULTS) -> Path | None:
    """The file :func:`thresholds_files` lists first, or None."""
    files = thresholds_files(folder)
    return files[0] if files else None


def load_thresholds(path: Path) -> Thresholds:
    text = path.read_text()
    title = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), path.stem)
    note = next((ln.strip() for ln in text.splitlines()
                 if ln.strip() and not ln.startswith(("#", "|"))), "")
    headers, body = parse_pipe_table(text)
    fixed = {"dtype", "cols", "rows", "dispatcher picks"}
    variants = [h for h in headers if h not in fixed]
    data = Thresholds(path, title, note, variants)
    for cells in body:
        row = dict(zip(headers, cells, strict=False))
        data.rows.append({
            "dtype": row["dtype"], "cols": int(row["cols"]), "rows": int(row["rows"]),
            "gbps": {v: gbps(row.get(v, "")) for v in variants},
            "recorded": row.get("dispatcher picks", ""),
        })
    return data


# --- the dispatcher, on a described GPU -------------------------------------------------------
def device_from_title(title: str):
    """A :class:`cunorm._device.DeviceProps` for the GPU a thresholds file names (H200/H100:
    sm_90, 132 SMs, 227 KiB shared memory per block), or None if it is not one we describe."""
    from cunorm._device import DeviceProps

    if re.search(r"\bH(100|200)\b", title):
        name = "NVIDIA H200" if "H200" in title else "NVIDIA H100"
        return DeviceProps(name, (9, 0), 132, 2048, 232448, 233472, 50 << 20)
    return None


def current_pick(dtype: str, cols: int, rows: int, props) -> str:
    """Path this version of the dispatcher plans for a contiguous (rows, cols) softmax."""
    from cunorm import _dispatch

    def occ(kernel: str, block: int, smem: int) -> int:
        # Only the block size depends on it: 2048 threads and 228 KB of shared memory per SM.
        by_smem = props.smem_per_sm // (smem + _dispatch.STATIC_SMEM_RESERVE) if smem else 32
        return max(0, min(props.max_threads_per_sm // block, by_smem))

    pack = 16 // ITEMSIZE[dtype]
    return _dispatch.plan_rows("softmax", dtype, dtype, rows, cols, pack, props, occ).path


# --- generated fragments ----------------------------------------------------------------------
def list_table(headers: list[str], rows: list[list[str]], widths: str = "auto") -> str:
    out = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for r in [headers, *rows]:
        out.append(f"   * - {r[0]}")
        out += [f"     - {c}" for c in r[1:]]
    return "\n".join(out) + "\n"


def thresholds_table(data: Thresholds, props) -> str:
    """Per cell: fastest measured path, the path cunorm picks now, and its share of the best."""
    headers = ["dtype", "cols", "rows", "fastest path", "GB/s", "cunorm picks", "GB/s",
               "% of fastest"]
    rows = []
    for r in data.rows:
        measured = {k: v for k, v in r["gbps"].items() if v is not None}
        if not measured:
            continue
        best = max(measured, key=measured.__getitem__)
        pick = current_pick(r["dtype"], r["cols"], r["rows"], props) if props else r["recorded"]
        got = r["gbps"].get(pick)
        rows.append([r["dtype"], str(r["cols"]), str(r["rows"]), best, f"{measured[best]:.0f}",
                     pick, "—" if got is None else f"{got:.0f}",
                     "—" if got is None else f"{100 * got / measured[best]:.0f}%"])
    return list_table(headers, rows)


def thresholds_plot(data: Thresholds, props, png: Path) -> bool:
    """GB/s against cols per dtype, one line per path, the dispatcher's pick circled and its
    thresholds drawn. False (and no file) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from cunorm import _dispatch

    dtypes = data.dtypes
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.6 * len(dtypes), 4.0), sharey=True,
                             squeeze=False)
    for ax, dtype in zip(axes[0], dtypes, strict=True):
        rows = [r for r in data.rows if r["dtype"] == dtype]
        cols = [r["cols"] for r in rows]
        for path in MAIN_PATHS:
            if path not in data.paths:
                continue
            pts = [(r["cols"], r["gbps"][path]) for r in rows if r["gbps"][path] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=".", label=path, color=PATH_COLORS[path])
        picks = [(r["cols"], r["gbps"].get(current_pick(dtype, r["cols"], r["rows"], props)
                                          if props else r["recorded"])) for r in rows]
        picks = [(c, g) for c, g in picks if g is not None]
        if picks:
            ax.plot(*zip(*picks, strict=True), linestyle="none", marker="o", markersize=9,
                    markerfacecolor="none", markeredgecolor="black", label="cunorm picks")
        isz = ITEMSIZE[dtype]
        for limit, label in ((_dispatch.WARP_MAX_COLS.get(isz), "warp"),
                             (_dispatch.BLOCK_MAX_COLS.get(isz), "block"),
                             (_dispatch.SMEM_MAX_COLS.get(isz), "smem")):
            if limit and min(cols) <= limit <= max(cols):
                ax.axvline(limit, color="grey", linestyle=":", linewidth=1)
                ax.annotate(f"{label} ≤ {limit}", (limit, 0.03), xycoords=("data", "axes fraction"),
                            rotation=90, fontsize=7, color="dimgrey", ha="center", va="bottom",
                            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none",
                                  "alpha": 0.85})
        ax.set_xscale("log", base=2)
        ax.set_title(dtype)
        ax.set_xlabel("cols (row length)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("GB/s (read + write)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(data.title, fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def dispatch_constants() -> str:
    """The row-path limits of :mod:`cunorm._dispatch` by input dtype, as a table."""
    from cunorm import _dispatch as d

    def limit(table: dict, isz: int) -> str:
        v = table.get(isz)
        return str(v) if v else "—"

    names = {2: "float16, bfloat16", 4: "float32", 8: "float64"}
    rows = []
    for isz in (2, 4, 8):
        cluster = d.SMEM_SLICE_MAX_BYTES * max(d.CLUSTER_SIZES) // isz
        wide = d.SMEM_SLICE_MAX_BYTES * max(d.ROW_CLUSTER_SIZES) // isz
        rows.append([names[isz], limit(d.WARP_MAX_COLS, isz), limit(d.BLOCK_MAX_COLS, isz),
                     limit(d.SMEM_MAX_COLS, isz), f"{cluster} ({wide})",
                     f"> {cluster} (> {wide})"])
    return list_table(["input dtype", "warp", "block", "smem (one block)",
                       "cluster (sm_90)", "uncached (sm_90)"], rows) + (
        "\nColumns up to which each path is taken (``WARP_MAX_COLS``, ``BLOCK_MAX_COLS``, "
        "``SMEM_MAX_COLS``; the cluster limit is ``SMEM_SLICE_MAX_BYTES`` times the largest "
        f"cluster: {max(d.CLUSTER_SIZES)}, in parentheses {max(d.ROW_CLUSTER_SIZES)} where "
        "the device allows non-portable clusters). The warp and block paths also need the "
        "row to fit in registers.\n")


def dispatch_substitutions() -> str:
    """reST substitutions ``|d.NAME|`` for the dispatcher constants dispatch.rst quotes."""
    from cunorm import _dispatch as d
    from cunorm._device import NONPORTABLE_CLUSTER_MIN_SMS

    def kb(n: int) -> str:
        return f"{n // 1024} KB"

    def choices(values) -> str:
        v = [str(x) for x in values]
        return ", ".join(v[:-1]) + " or " + v[-1] if len(v) > 1 else v[0]

    values = {
        "warp_block": d.WARP_BLOCK,
        "warp_exact_early_sm_blocks": d.WARP_EXACT_EARLY_SM_BLOCKS,
        "warp_values": d.WARP_MAX_VALUES_PER_THREAD[4],
        "warp_values_f64": d.WARP_MAX_VALUES_PER_THREAD[8],
        "block_threads": choices(d.BLOCK_THREADS),
        "block_warp": f"{d.BLOCK_WARP_THREADS[0]} to {d.BLOCK_WARP_THREADS[-1]}",
        "block_values": d.BLOCK_MAX_VALUES[4],
        "block_target": d.BLOCK_TARGET_VALUES,
        "block_wide": choices(d.BLOCK_WIDE_THREADS),
        "block_unpadded_16": d.BLOCK_UNPADDED_MAX_COLS[2],
        "block_unpadded_32": d.BLOCK_UNPADDED_MAX_COLS[4],
        "smem_blocks": "/".join(str(b) for b in d.BLOCK_SIZES),
        "smem_reserve": kb(d.STATIC_SMEM_RESERVE),
        "clusters": choices(d.CLUSTER_SIZES),
        "max_cluster": max(d.CLUSTER_SIZES),
        "row_clusters": choices(d.ROW_CLUSTER_SIZES),
        "wide_cluster": max(d.ROW_CLUSTER_SIZES),
        "wide_cluster_sms": NONPORTABLE_CLUSTER_MIN_SMS,
        "smem_slice": kb(d.SMEM_SLICE_MAX_BYTES),
        "smem_slice_pref": kb(getattr(d, "SMEM_SLICE_PREFERRED_BYTES", d.SMEM_SLICE_MAX_BYTES)),
        "uncached_block": d.UNCACHED_BLOCK,
        "uncached_slice": kb(d.UNCACHED_SLICE_MAX_BYTES),
        "strided_block": d.STRIDED_BLOCK,
        "strided_tile": d.STRIDED_MIN_TILE_BYTES,
        "strided_rows": d.STRIDED_ROWS_PER_THREAD,
        "strided_slice": kb(d.STRIDED_SLICE_MAX_BYTES),
        "strided_slice_pref": kb(d.STRIDED_SLICE_PREFERRED_BYTES),
        "strided_narrow": d.STRIDED_NARROW_TILE_BYTES,
        "strided_held": d.STRIDED_HELD_ROWS,
    }
    return "".join(f".. |d.{k}| replace:: {v}\n" for k, v in values.items())


def cli_help(module: str) -> str:
    """``--help`` text of ``python -m <module>`` (its ``build_parser()``), 88 columns wide."""
    import importlib

    parser = importlib.import_module(module).build_parser()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"
    try:
        return parser.format_help()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


# --- the benchmark results page ---------------------------------------------------------------
def newest_results(folder: Path = RESULTS) -> list[Path]:
    """Newest ``{device}-{date}-{op}.md`` per (device, op), softmax before log_softmax."""
    best: dict[tuple[str, str], tuple[str, Path]] = {}
    for p in folder.glob("*.md"):
        m = RESULT_RE.match(p.name)
        if m and (key := (m["slug"], m["op"])) and (key not in best or m["date"] > best[key][0]):
            best[key] = (m["date"], p)
    order = {"softmax": 0, "log_softmax": 1}
    return [p for (slug, op), (_, p) in sorted(best.items(), key=lambda kv: (kv[0][0],
                                                                           order[kv[0][1]]))]


def demote(markdown: str, levels: int = 1) -> str:
    """Push every ATX heading down ``levels`` (outside fenced code), and keep a list item that
    starts with ``>`` (">= 90% of copy bandwidth: ...") from turning into a block quote."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced:
            if re.match(r"#{1,5} ", line):
                line = "#" * levels + line
            line = re.sub(r"^(\s*[-*+] )>", r"\1\\>", line)
        out.append(line)
    return "\n".join(out)


def results_page(results: list[Path], thresholds: list[Path]) -> str:
    rel = "benchmarks/results"
    parts = ["# Benchmark results", "",
             f"Generated when these docs were built, from the newest files in `{rel}/` of the "
             "repository. Each table is the benchmark's own markdown report.", ""]
    if not results:
        parts += ["No benchmark reports (`{device}-{date}-softmax.md`, "
                  "`...-log_softmax.md`) are in the repository yet. Run "
                  "`python -m cunorm.bench softmax` and `python -m cunorm.bench log_softmax` on "
                  f"a GPU machine; the reports land in `{rel}/` and appear here on the next "
                  "build.", ""]
    for md in results:
        parts += [demote(md.read_text().strip()), ""]
        png = md.with_suffix(".png")
        if png.is_file():
            _copy(png, GEN / png.name)
            parts += [f"![{md.stem}]({png.name})", ""]
    for i, path in enumerate(thresholds):
        text = path.read_text().strip()
        tag = THRESHOLDS_RE.match(path.name)["tag"].strip("-")
        if tag:  # tell experiments of the same day apart
            text = re.sub(r"^# (.*)$", rf"# \1 ({tag})", text, count=1, flags=re.MULTILINE)
        parts += [demote(text), ""]
        parts += [f"From `{rel}/{path.name}`. The last column is the pick of the dispatcher "
                  "version that was measured; {doc}`/dispatch` shows the current one.", ""]
        if i == 0 and "thresholds.png" in _WRITTEN:
            parts += ["![path thresholds](thresholds.png)", ""]
    return "\n".join(parts)


_WRITTEN: set[str] = set()


def _write(path: Path, text: str) -> None:
    """Write only if changed, so Sphinx does not rebuild pages needlessly."""
    _WRITTEN.add(path.name)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def _copy(src: Path, dst: Path) -> None:
    _WRITTEN.add(dst.name)
    if not dst.is_file() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)


def generate() -> None:
    """Write every generated fragment under ``docs/_generated``."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    GEN.mkdir(exist_ok=True)
    _WRITTEN.clear()
    thr_path = newest_thresholds()
    if thr_path is None:
        _write(GEN / "thresholds_table.inc",
               "No path-threshold measurements (``benchmarks/results/thresholds-*.md``) are in "
               "the repository; ``python benchmarks/thresholds.py`` on a GPU writes one.\n")
    else:
        data = load_thresholds(thr_path)
        props = device_from_title(data.title)
        rel = f"benchmarks/results/{thr_path.name}"
        text = [f"Measured in ``{rel}`` ({data.title}); "
                + (f"*cunorm picks* is the path this version's dispatcher plans on an "
                   f"{props.name} (sm_{props.arch}, {props.sm_count} SMs) for contiguous rows, "
                   "with that path's GB/s as measured (under the dispatcher constants of the "
                   "measured run)."
                   if props else "*cunorm picks* is the dispatcher of that run.")
                + " GB/s counts one read and one write of the array.", ""]
        if thresholds_plot(data, props, GEN / "thresholds.png"):
            _WRITTEN.add("thresholds.png")
            text += [".. figure:: /_generated/thresholds.png", "   :width: 100%", "",
                     "   GB/s per path against row length; circles: the path cunorm picks; "
                     "dotted lines: the dispatcher's column limits.", ""]
        text.append(thresholds_table(data, props))
        _write(GEN / "thresholds_table.inc", "\n".join(text))
    _write(GEN / "dispatch_constants.inc", dispatch_constants())
    _write(GEN / "dispatch_subst.inc", dispatch_substitutions())
    for name, module in (("precompile", "cunorm.precompile"), ("cunorm", "cunorm.__main__")):
        _write(GEN / f"cli_{name}.txt", cli_help(module))
    _write(GEN / "benchmark-results.md", results_page(newest_results(), thresholds_files()))
    for stale in GEN.iterdir():  # e.g. the plot of a report that is no longer the newest
        if stale.name not in _WRITTEN and stale.is_file():
            stale.unlink()


def _on_builder_inited(app) -> None:
    generate()


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    generate()
    print(f"generated {sorted(p.name for p in GEN.iterdir())}")
