"""Measure every forceable softmax path around the dispatcher's thresholds.

Re-derives OneFlow's limits for the local GPU: where the warp path stops winning over the
shared-memory path, and where a single block per row should give way to a cluster of blocks
or to the uncached path. Writes ``thresholds-{device}-{date}.md`` (GB/s per path per cell,
the winner marked) to ``--out``.

Usage: ``python benchmarks/thresholds.py [--out DIR] [--quick]``
"""

from __future__ import annotations

import argparse
import datetime
import functools
import pathlib

import cupy
import ml_dtypes
import numpy as np

import cunorm
from cunorm import _dispatch

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
WARP_COLS = [32, 128, 256, 512, 768, 1024, 1536, 2048]
BLOCK_COLS = [4096, 8192, 16384, 32768, 49152, 65536, 131072, 262144, 524288]
# variant -> (forced path, dispatcher constants overridden while it runs)
PATHS = {
    "warp": ("warp", {}),
    "block": ("block", {}),
    "smem": ("smem", {}),
    "cluster": ("cluster", {}),
    "cluster-64k": ("cluster", {"SMEM_SLICE_PREFERRED_BYTES": 64 * 1024}),
    "uncached": ("uncached", {}),
    "uncached-1blk": ("uncached", {"UNCACHED_SLICE_MAX_BYTES": 1 << 40}),
}


def bench_ms(fn) -> float:
    """Median kernel time in ms (triton's do_bench flushes L2 between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    slug = name.lower().replace(" ", "-")
    total = 49152 * 4096
    lines = [f"# softmax path thresholds, {name}, {datetime.date.today()}", "",
             "GB/s = 2 * rows * cols * itemsize / median time (triton do_bench, L2 flushed); "
             f"about {total} elements per cell. `*` marks the fastest path.", "",
             "| dtype | cols | rows | " + " | ".join(PATHS) + " | dispatcher picks |",
             "|---|---:|---:|" + "---:|" * len(PATHS) + "---|"]
    cols_list = WARP_COLS + BLOCK_COLS
    if args.quick:
        cols_list = [512, 1024, 1536, 8192, 32768, 131072]
    for dname, dt in DTYPES.items():
        for cols in cols_list:
            rows = max(1, min(49152, total // cols))
            x = cupy.random.standard_normal((rows, cols), dtype=np.float32).astype(dt)
            y = cupy.empty_like(x)
            gbs = {}
            for variant, (path, consts) in PATHS.items():
                if (path == "warp" and cols > 1536) or (path == "block" and cols > 16384):
                    gbs[variant] = None
                    continue
                try:
                    with _dispatch.override_constants(consts), _dispatch.force_path(path):
                        cunorm.softmax(x, out=y)
                        ms = bench_ms(functools.partial(cunorm.softmax, x, out=y))
                    gbs[variant] = 2 * x.nbytes / ms / 1e6
                except ValueError:
                    gbs[variant] = None
            cunorm.softmax(x, out=y)
            picked = [k for k in cunorm.softmax.__globals__["_PLANS"]
                      if k[4] == rows and k[5] == cols and k[2] == dname and k[-1] is None]
            pick = cunorm.softmax.__globals__["_PLANS"][picked[0]][0].path if picked else "?"
            best = max((v for v in gbs.values() if v), default=0)
            cells = [("—" if v is None else f"{v:.0f}{'*' if v == best else ''}")
                     for v in gbs.values()]
            line = f"| {dname} | {cols} | {rows} | " + " | ".join(cells) + f" | {pick} |"
            print(line, flush=True)
            lines.append(line)
            del x, y
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"thresholds-{slug}-{datetime.date.today()}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
