"""GPU tests of calls from a thread CUDA has not run on yet. Such a thread has no current CUDA
context, and the driver calls behind a call (occupancy queries while planning, the prepared
launch of a memoized call) failed there with CUDA_ERROR_INVALID_CONTEXT: torch runs a
backward on an autograd thread of its own, where a cunorm operator's backward may be the
first CUDA work. Both a first call of a layout and a memoized one must work on such a thread
and give the results the main thread gets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from _gpu import GPU_MARKS, cupy

import cunorm
from cunorm import _kernels

pytestmark = GPU_MARKS


def _inputs(op: str, first: bool) -> tuple[Callable[[], object], Callable[[], object]]:
    """(call writing preallocated outputs, call allocating them) of ``op`` on inputs whose
    layout no other test uses (a first call plans there), or on a layout planned before."""
    rng = cupy.random.default_rng(3)
    cols = 1237 if first else 1238
    x = rng.standard_normal((37, cols), dtype=np.float32)
    w = rng.standard_normal(cols, dtype=np.float32)
    out = cupy.empty_like(x)
    if op == "softmax":
        return (lambda: cunorm.softmax(x, out=out)), (lambda: cunorm.softmax(x))
    if op == "rms_norm":
        return (lambda: cunorm.rms_norm(x, w, out=out)), (lambda: cunorm.rms_norm(x, w))
    if op == "softmax_backward":
        y = cunorm.softmax(x)
        return ((lambda: cunorm.softmax_backward(y, w * x, out=out)),
                (lambda: cunorm.softmax_backward(y, w * x)))
    if op == "layer_norm_backward":
        _, mean, rstd = cunorm.layer_norm(x, w, return_stats=True)
        dy = rng.standard_normal(x.shape, dtype=np.float32)
        def backward():
            return cunorm.layer_norm_backward(dy, x, mean, rstd, w)

        return backward, backward
    # attention: decoding over a cache long enough to split the keys (kernel and merge)
    q = rng.standard_normal((1, 8, 1, 64), dtype=np.float32).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, 8000 + (0 if first else 1), 64),
                                dtype=np.float32).astype(np.float16) for _ in range(2))
    o = cupy.empty_like(q)
    return (lambda: cunorm.attention(q, k, v, out=o)), (lambda: cunorm.attention(q, k, v))


def _in_new_thread(call: Callable[[], object]) -> object:
    """``call()`` on a new thread, which is checked to start with no current CUDA context."""
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["context"] = cupy.cuda.driver.ctxGetCurrent()
            box["result"] = call()
            cupy.cuda.get_current_stream().synchronize()
        except BaseException as err:  # noqa: BLE001 - raised again by the main thread
            box["error"] = err

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    assert box["context"] == 0, "the new thread had a CUDA context already: nothing tested"
    return box["result"]


def _host(result) -> list[np.ndarray]:
    results = result if isinstance(result, tuple) else (result,)
    return [cupy.asnumpy(a) for a in results]


@pytest.mark.parametrize("first", [True, False], ids=["first-call", "memoized"])
@pytest.mark.parametrize("op", ["softmax", "rms_norm", "softmax_backward",
                                "layer_norm_backward", "attention"])
def test_a_thread_without_a_cuda_context(op, first, monkeypatch):
    into_out, allocating = _inputs(op, first)
    if first:  # the thread asks the driver for occupancy itself
        monkeypatch.setattr(_kernels, "_OCCUPANCY", {})
    else:
        allocating()  # planned and memoized on this thread
    cupy.cuda.Device().synchronize()
    for call in (into_out, allocating):
        got = _host(_in_new_thread(call))
        want = _host(call())
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
