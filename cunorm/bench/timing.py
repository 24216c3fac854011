"""Timers and the copy-bandwidth ceiling.

Every GPU number in a report comes from one :class:`Timer` chosen once per run:

* :class:`CupyEventTimer` (the default) times as ``triton.testing.do_bench`` does (CUDA events,
  a 256 MB L2 flush before every repetition, median) and keeps the GPU busy for PAD_US after
  each flush, before the start event: the event pair then brackets the call's GPU work and
  never the host's time to issue it.
* :class:`TritonTimer` wraps ``do_bench`` itself (``--timer triton``): what the peer anchors in
  ``shared/anchors`` were taken with. Its start event follows the flush, about 80 us of GPU
  work on an H200; where issuing the call takes the host longer (a slow CPU state after an idle
  period: cunorm's layer_norm with a residual took 46 instead of 24 us), the events measure the
  host. H200, 49152 x 128 bfloat16 layer_norm with residual, after 15 s idle: do_bench 1738
  GB/s, padded events 2604, do_bench again 2146; hot, both 2604-2648
  (benchmarks/results/nvidia-h200-2026-11-22-timer-profile.txt).

Both record events on the *legacy default stream*: CuPy's and PyTorch's current stream unless a
caller changes it, so kernels launched by cunorm, CuPy, PyTorch and Triton all land between the
two events. JAX runs on its own streams and is timed with :func:`wall_clock_ms` instead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

# do_bench's defaults, also used by the CuPy fallback: 25 ms of warm-up, 100 ms of timed reps.
WARMUP_MS = 25
REP_MS = 100
# Larger than any L2 we target (H100/H200: 50 MB), so a write of it evicts the previous inputs.
L2_FLUSH_BYTES = 256 * 2**20
# Copy ceiling buffer: 1 GiB, far beyond L2, long enough that launch latency is noise.
COPY_BYTES = 2**30
# GPU time (us) the default timer spends spinning between each flush and the start event: with
# the flush, ~180 us in which the host issues the call. The benchmark's implementations take
# 10-50 us of host time a call, and their timings agree at 100, 300 and 1000 us; a call whose
# host side took 150 us still leaked ~9 us into the events at 100 (H200: 12 us against 3.5 at
# 1000, 104 with no spin; benchmarks/results/nvidia-h200-2026-11-22-timer-profile.txt).
PAD_US = 100


def _spin_kernel():
    """A one-thread CuPy kernel that spins on the GPU's nanosecond timer for ``ns``."""
    import cupy

    return cupy.RawKernel(
        r"""
extern "C" __global__ void cunorm_bench_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
""",
        "cunorm_bench_spin",
    )


def gbps(nbytes: int, ms: float) -> float:
    """Effective bandwidth in GB/s (1e9 bytes/s) for ``nbytes`` moved in ``ms`` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


class Timer(Protocol):
    """A GPU timer: ``timer(fn)`` returns the median time of one ``fn()`` call in ms."""

    method: str

    def __call__(self, fn: Callable[[], Any]) -> float: ...


class TritonTimer:
    """``triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")``.

    Parameters
    ----------
    warmup_ms, rep_ms : float
        do_bench's budgets: milliseconds of untimed, then timed, repetitions (the defaults are
        do_bench's own; the attention benchmark passes smaller ones for its long kernels).
    """

    def __init__(self, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS) -> None:
        from triton.testing import do_bench

        self._do_bench = do_bench
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.method = (
            f"`triton.testing.do_bench(fn, warmup={warmup_ms:g}, rep={rep_ms:g}, "
            "return_mode='median')`: CUDA events, a 256 MB L2 flush before every repetition, "
            "median"
        )

    def __call__(self, fn: Callable[[], Any]) -> float:
        return float(
            self._do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")
        )


class CupyEventTimer:
    """CUDA-event timer on CuPy's current stream with an L2 flush before every repetition.

    Mirrors ``do_bench``: estimate the time of one call, then run ``warmup_ms`` worth of
    untimed calls and ``rep_ms`` worth of timed ones (at least ``min_reps``), return the median.

    Parameters
    ----------
    warmup_ms, rep_ms : float
        Milliseconds of untimed, then timed, repetitions.
    min_reps, max_reps : int
        Bounds on the timed repetitions.
    pad_us : float
        GPU time spent spinning after each flush, before the start event (0: none, as
        ``do_bench``), so the host has issued the call before the events start counting.
    """

    def __init__(
        self,
        warmup_ms: float = WARMUP_MS,
        rep_ms: float = REP_MS,
        min_reps: int = 10,
        max_reps: int = 2000,
        pad_us: float = 0.0,
    ) -> None:
        import cupy

        pad = (f", then {pad_us:g} us of GPU spin so the events bracket the call's GPU work "
               "and not the host's time to issue it" if pad_us > 0 else "")
        self.method = (
            "CUDA events (CuPy) around each call, a 256 MB L2 flush before every repetition"
            f"{pad}, {warmup_ms:g} ms warm-up, median of >= {rep_ms:g} ms of repetitions"
        )
        self._cupy = cupy
        self._flush_buf = cupy.empty(L2_FLUSH_BYTES, dtype=cupy.int8)
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.min_reps, self.max_reps = min_reps, max_reps
        self._pad_ns = int(pad_us * 1000)
        self._spin = _spin_kernel() if self._pad_ns > 0 else None

    def _flush(self) -> None:
        self._flush_buf.fill(0)
        if self._spin is not None:
            self._spin((1,), (1,), (self._cupy.uint64(self._pad_ns),))

    def __call__(self, fn: Callable[[], Any]) -> float:
        cupy = self._cupy
        fn()
        cupy.cuda.get_current_stream().synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(5):
            self._flush()
            fn()
        end.record()
        end.synchronize()
        # The estimate includes the flushes, so it errs on the side of fewer repetitions.
        estimate = max(cupy.cuda.get_elapsed_time(start, end) / 5, 1e-3)
        for _ in range(max(1, int(self.warmup_ms / estimate))):
            fn()
        n = min(self.max_reps, max(self.min_reps, int(self.rep_ms / estimate)))
        events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(n)]
        for s, e in events:
            self._flush()
            s.record()
            fn()
            e.record()
        events[-1][1].synchronize()
        return statistics.median(cupy.cuda.get_elapsed_time(s, e) for s, e in events)


def make_timer(
    prefer: str = "auto",
    warmup_ms: float = WARMUP_MS,
    rep_ms: float = REP_MS,
) -> Timer:
    """Pick the timer for this run.

    Parameters
    ----------
    prefer : {"auto", "padded", "triton", "cupy"}
        ``"auto"`` and ``"padded"``: CuPy events with PAD_US of GPU spin before each start
        event (:class:`CupyEventTimer`); ``"triton"``: ``do_bench`` itself, as the peer anchors
        were timed (needs Triton and a CUDA-enabled torch); ``"cupy"``: CuPy events without
        the spin.
    warmup_ms, rep_ms : float
        Milliseconds of untimed and of timed repetitions per measurement, for either timer.
    """
    if prefer not in ("auto", "padded", "triton", "cupy"):
        raise ValueError(f"unknown timer {prefer!r}; expected auto, padded, triton or cupy")
    if prefer == "triton":
        import cupy
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("timer 'triton': torch has no CUDA device")
        timer = TritonTimer(warmup_ms, rep_ms)
        probe = cupy.zeros(1024, dtype=cupy.float32)
        timer(lambda: probe.fill(1.0))  # a broken do_bench should fail here, not mid-sweep
        return timer
    return CupyEventTimer(warmup_ms, rep_ms, pad_us=0.0 if prefer == "cupy" else PAD_US)


def wall_clock_ms(
    fn: Callable[[], Any],
    before_each: Callable[[], None] | None = None,
    warmup: int = 3,
    rep_ms: float = REP_MS,
    min_reps: int = 10,
    max_reps: int = 500,
) -> float:
    """Median wall-clock time of ``fn()``, which must block until its result exists.

    Used for JAX (``f(x).block_until_ready()``): JAX launches on its own streams, which CUDA
    events on the default stream would not bracket. The number includes host dispatch.

    Parameters
    ----------
    fn : callable
        The blocking call to time.
    before_each : callable, optional
        Run untimed before each repetition (an L2 flush that synchronizes).
    warmup, rep_ms, min_reps, max_reps
        Untimed calls first; then repetitions until ``rep_ms`` have been timed (within bounds).
    """
    for _ in range(warmup):
        fn()
    times: list[float] = []
    total = 0.0
    while len(times) < max_reps and (len(times) < min_reps or total < rep_ms):
        if before_each is not None:
            before_each()
        t0 = time.perf_counter()
        fn()
        dt = (time.perf_counter() - t0) * 1e3
        times.append(dt)
        total += dt
    return statistics.median(times)


def host_ms(fn: Callable[[], Any], min_reps: int = 5, budget_s: float = 0.3) -> float:
    """Median wall-clock ms of a synchronous CPU call (the NumPy reference path)."""
    fn()  # first call pays imports and page faults
    times: list[float] = []
    t_start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - t_start < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 1000:
            break
    return statistics.median(times)


def copy_bandwidth(timer: Timer, nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy bandwidth in GB/s, counting read + write (2 x nbytes per copy).

    ``cudaMemcpyAsync`` of a ``nbytes`` buffer: the ceiling for any op that reads its input
    once and writes its output once.
    """
    import cupy

    rt = cupy.cuda.runtime
    src = cupy.empty(nbytes, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    src.fill(1)  # touch the pages so the first timed copy pays no lazy allocation
    src_ptr, dst_ptr = src.data.ptr, dst.data.ptr

    def copy() -> None:
        stream = cupy.cuda.get_current_stream().ptr
        rt.memcpyAsync(dst_ptr, src_ptr, nbytes, rt.memcpyDeviceToDevice, stream)

    try:
        ms = timer(copy)
    finally:
        del src, dst
        cupy.get_default_memory_pool().free_all_blocks()
    return gbps(2 * nbytes, ms)
