"""Where a decoding call's time goes, from globaltimer stamps (run on the GPU machine).

``python tools/gpu_profile.py decode-timeline`` copies this checkout's package and kernel
sources into a temporary folder, adds stamps to that copy's ``attention.cu``, and runs the
timeline there in a second Python process, which imports the copy as ``cunorm``:

* ``attn_tc_rows`` stamps each block's start, its first tile's arrival, the end of its key
  loop and its end. It records them with the block's SM id through the mask pointer, which
  the timeline passes in place of a mask that decoding does not have.
* ``attn_combine`` stamps its start, the release of its dependency wait, the statistics' max,
  the denominator, the weighted rows, the final barrier and its end, through its lse pointer.

Each call runs as the benchmark's timer runs it: after that timer's own flush (a written
256 MB L2 flush, then PAD_US of GPU spin), between two events. Printed: the events' time;
the attention blocks' first tiles, key loops, epilogues and ends; when the merge is released
and done after the last attention block, and its phases. bf16, Lq = 1, 32 / 8 heads,
D = 128; the planner's split count (``timeline(splits=...)`` forces others; since session
65's 128-key tiles the planner itself takes 16 splits at 16384 keys, the count session 64
forced for comparison). Session 64 ran the same steps as scratch scripts
(`benchmarks/results/nvidia-h100-2026-11-28-decode-timeline-profile.txt`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_STAMP = 'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"({}));'
_SMID = 'unsigned sm; asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));'


def _insert_after(src: str, marker: str, code: str, start: int) -> str:
    """``code`` right after the first ``marker`` from ``start`` (ValueError if absent: the
    sources moved on and the stamps need new places)."""
    at = src.index(marker, start) + len(marker)
    return src[:at] + code + src[at:]


def _stamp_attention_rows(src: str) -> str:
    """attn_tc_rows with four stamps and the SM id, 5 u64 a block through ``mask``."""
    fn = src.index("__device__ __forceinline__ void attn_tc_rows(")
    t = _STAMP.format("cn_t")
    declare = f"\n  unsigned long long cn_t, cn_t0, cn_t1 = 0, cn_t2; {t} cn_t0 = cn_t;\n"
    src = _insert_after(src, "CUNORM_ATTN_UNPACK;", declare, fn)
    loop = src.index("copy_async_wait<ST - 2>();\n    // Publishes this tile", fn)
    src = _insert_after(src, "__syncthreads();", f"\n    if (tile == tb) {{ {t} cn_t1 = cn_t; }}",
                        loop)
    after_loop = src.index("  copy_async_wait<0>();\n\n  if constexpr (KS > 1) {", fn)
    src = _insert_after(src, "  copy_async_wait<0>();", f"\n  {t} cn_t2 = cn_t;", after_loop)
    end = ("t.r0 + warp * WM + mi * 16 + lane / 4 + h * 8, row_ok[mi][h], t, group, lq);\n"
           "  }\n")
    record = (f"  if (threadIdx.x == 0 && mask != nullptr) {{ {t} {_SMID}"
              " unsigned long long* st = (unsigned long long*)mask + 5 * (blockIdx.x + gridDim.x"
              " * (blockIdx.y + gridDim.y * blockIdx.z));"
              " st[0] = cn_t0; st[1] = cn_t1; st[2] = cn_t2; st[3] = cn_t; st[4] = sm; }\n")
    return _insert_after(src, end, record, fn)


def _stamp_combine(src: str) -> str:
    """attn_combine with seven stamps and the SM id, 8 u64 a block from u64 8 of ``lse``
    (lse's own value, with the prepared launch's zero strides, lands in its first 4 bytes)."""
    fn = src.index("attn_combine(const typename AttnWork<T>::type* o_part,")
    c = _STAMP.format("cn_c")
    wait = "  griddep_wait();\n"
    at = src.index(wait, fn)
    src = (src[:at] + f"  unsigned long long cn_c, cn_cs[6]; {c} cn_cs[0] = cn_c;\n" + wait
           + f"  {c} cn_cs[1] = cn_c;\n" + src[at + len(wait):])
    src = _insert_after(src, "max_scratch);", f" {c} cn_cs[2] = cn_c;", fn)
    src = _insert_after(src, "const P denom = total.a + total.b;", f" {c} cn_cs[3] = cn_c;", fn)
    src = _insert_after(src, "part[warp][lane + 32 * j] = {y[j], y_err[j]};",
                        f" {c} cn_cs[4] = cn_c;", fn)
    dst = src.index("T* const dst = o + b * args.o_sb", fn)
    src = src[:dst] + f"{c} cn_cs[5] = cn_c;\n  " + src[dst:]
    record = (f"  __syncthreads();\n  if (threadIdx.x == 0 && lse != nullptr) {{ {c} {_SMID}"
              " unsigned long long* st = (unsigned long long*)lse + 8 + 8 * blockIdx.x;"
              " for (int i = 0; i < 6; ++i) st[i] = cn_cs[i]; st[6] = cn_c; st[7] = sm; }\n")
    return _insert_after(
        src, "static_cast<float>(denom == P(0) ? -Math<P>::inf() : mx + Math<P>::log(denom));\n",
        record, fn)


def instrument(dest: Path) -> None:
    """Copy the package and kernel sources to ``dest`` and stamp its attention.cu."""
    shutil.copytree(_ROOT / "cunorm", dest / "cunorm")
    shutil.copytree(_ROOT / "cuda_src", dest / "cuda_src")
    path = dest / "cuda_src" / "attention.cu"
    path.write_text(_stamp_combine(_stamp_attention_rows(path.read_text())))


def _spread(values, scale: float = 1e3) -> str:
    import numpy as np

    return "/".join(f"{np.percentile(values, p) / scale:.1f}" for p in (0, 50, 100))


def timeline(lk: int = 16384, splits=(None,), reps: int = 3) -> None:
    """The stamped calls (in the process that imports the stamped copy)."""
    import cupy
    import numpy as np

    import cunorm
    from cunorm import _attn_dispatch, _attn_launch
    from cunorm.bench.timing import PAD_US, CupyEventTimer

    if "cunorm-timeline" not in cunorm.__file__:
        raise RuntimeError(f"cunorm comes from {cunorm.__file__}, not the stamped copy")
    q = cupy.random.standard_normal((1, 32, 1, 128), dtype=np.float32).astype("bfloat16")
    k, v = (cupy.random.standard_normal((1, 8, lk, 128), dtype=np.float32).astype("bfloat16")
            for _ in range(2))
    out = cupy.empty_like(q)
    # the benchmark's own flush and spin, so each stamped call starts as a timed one does
    bench_timer = CupyEventTimer(pad_us=PAD_US)
    stream = cupy.cuda.get_current_stream().ptr
    for forced in splits:
        with _attn_dispatch.force_split(forced):
            launch = _attn_launch.prepare(q, k, v, out, causal=False, scale=0.1)
        if launch.merge is None:  # a cluster launch or a single split: nothing to stamp there
            raise RuntimeError(f"Lk={lk}, splits={forced}: planned {launch.plan.kernel} "
                               "without attn_combine")
        rows = launch.plan.splits * launch.part_rows
        work = cupy.empty(rows * (launch.dv + 2), np.float32)
        o_part, stat_part = work.data.ptr, work.data.ptr + rows * launch.dv * 4
        attn_stamps = cupy.zeros((int(np.prod(launch.plan.grid)), 5), np.uint64)
        merge_stamps = cupy.zeros(8 + 8 * launch.part_rows, np.uint64)
        pointers = (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, 0, o_part, stat_part,
                    attn_stamps.data.ptr)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        for rep in range(reps):
            attn_stamps.fill(0)
            merge_stamps.fill(0)
            bench_timer._flush()
            start.record()
            launch.kernel.fire(stream, pointers, launch.values[int(launch.strides_aligned)])
            launch.merge.fire(stream, (o_part, stat_part, out.data.ptr, merge_stamps.data.ptr),
                              launch.combine_bytes)
            end.record()
            end.synchronize()
            a = cupy.asnumpy(attn_stamps).astype(np.int64)
            # (start, released, end, SM, max, denominator, rows, barrier)
            m = cupy.asnumpy(merge_stamps)[8:].reshape(-1, 8).astype(np.int64)
            m = m[:, [0, 1, 6, 7, 2, 3, 4, 5]]
            base = a[:, 0].min()
            last = a[:, 3].max()
            phases = np.median(np.diff(m[:, [1, 4, 5, 6, 7, 2]], axis=1), axis=0) / 1e3
            print(f"Lk={lk} splits={launch.plan.splits} rep {rep}: events "
                  f"{cupy.cuda.get_elapsed_time(start, end) * 1e3:.1f} us; attention blocks "
                  f"(us, min/median/max): first tile after the start {_spread(a[:, 1] - a[:, 0])},"
                  f" key loop {_spread(a[:, 2] - a[:, 1])}, epilogue {_spread(a[:, 3] - a[:, 2])},"
                  f" end after the first start {_spread(a[:, 3] - base)}; merge released "
                  f"+{(m[:, 1].min() - last) / 1e3:.2f} us and done "
                  f"+{(m[:, 2].max() - last) / 1e3:.2f} us after the last attention block, its "
                  "phases (median us: max, denominator, rows, barrier, output) "
                  + " ".join(f"{x:.2f}" for x in phases), flush=True)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cunorm-timeline-") as folder:
        instrument(Path(folder))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, str(_ROOT / "tools")])}
        subprocess.run([sys.executable, "-c", "import decode_timeline; decode_timeline.timeline()"],
                       env=env, check=True, cwd=folder)


if __name__ == "__main__":
    main()
