"""GPU tests of the benchmark's default timer (:class:`cunorm.bench.timing.CupyEventTimer`
with a GPU spin before each start event): it measures a call's GPU work and not the host's
time to issue it."""

from __future__ import annotations

import time

import pytest
from _gpu import GPU_MARKS, cupy  # the shared GPU preamble

from cunorm.bench import timing

pytestmark = GPU_MARKS


def test_padded_timer_measures_gpu_time():
    """A kernel spinning 200 us on the GPU reads as ~0.2 ms."""
    spin = timing._spin_kernel()
    timer = timing.CupyEventTimer(warmup_ms=2, rep_ms=20, pad_us=timing.PAD_US)
    ms = timer(lambda: spin((1,), (1,), (cupy.uint64(200_000),)))
    assert 0.19 < ms < 0.25


def test_padded_timer_leaves_host_time_out():
    """A call whose host side takes 150 us before a tiny kernel: with 1 ms of spin ahead of
    each start event, the events see the kernel only."""
    x = cupy.zeros(1024, dtype=cupy.float32)

    def slow_host_call():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 150e-6:
            pass
        x.fill(1.0)

    ms = timing.CupyEventTimer(warmup_ms=2, rep_ms=20, pad_us=1000)(slow_host_call)
    assert ms < 0.05


def test_make_timer_choices():
    assert timing.make_timer("auto")._pad_ns == timing.PAD_US * 1000
    assert timing.make_timer("padded")._pad_ns == timing.PAD_US * 1000
    assert timing.make_timer("cupy")._pad_ns == 0
    with pytest.raises(ValueError, match="unknown timer 'bogus'"):
        timing.make_timer("bogus")
