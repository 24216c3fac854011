"""GPU tests with two devices: a call computes on its arrays' device whatever device is
current, on the first call of a layout and on memoized ones (CuPy arrays and CUDA torch
tensors), leaves the current device as it found it, and refuses arguments on other devices.

Skipped (with the reason) on a machine with fewer than two CUDA GPUs.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu import BF16, GPU_MARKS, N_GPUS, TOL, cupy, row_errors  # shared GPU preamble

import cunorm
from cunorm import _array

pytestmark = [*GPU_MARKS, pytest.mark.skipif(
    N_GPUS < 2, reason="needs two CUDA GPUs: multi-device tests not run")]

HOME = 1  # the arrays' device; device 0 is current outside the `with` blocks


def _host_inputs(op: str, rng) -> dict[str, np.ndarray]:
    """Host arrays of one call of ``op`` (keyword name -> array)."""
    if op in ("softmax", "log_softmax"):
        return {"x": (rng.standard_normal((96, 300)) * 4).astype(np.float32)}
    if op == "layer_norm":
        x, r = (rng.standard_normal((64, 1024)).astype(BF16) for _ in range(2))
        w, b = (rng.standard_normal(1024).astype(BF16) for _ in range(2))
        return {"x": x, "weight": w, "bias": b, "residual": r}
    if op == "rms_norm":
        return {"x": rng.standard_normal((7, 4096)).astype(np.float16),
                "weight": rng.standard_normal(4096).astype(np.float16)}
    if op == "attention":  # prefill, grouped heads
        q = rng.standard_normal((2, 8, 130, 64)).astype(np.float16)
        k, v = (rng.standard_normal((2, 2, 200, 64)).astype(np.float16) for _ in range(2))
        return {"q": q, "k": k, "v": v}
    # decoding over a long cache: split-KV kernel and its merge
    q = rng.standard_normal((1, 32, 1, 128)).astype(np.float16)
    k, v = (rng.standard_normal((1, 8, 20000, 128)).astype(np.float16) for _ in range(2))
    return {"q": q, "k": k, "v": v}


def _call(op: str, arrays: dict):
    """Run ``op`` on ``arrays`` (CuPy), with statistics or lse where the op has them."""
    if op in ("softmax", "log_softmax"):
        return getattr(cunorm, op)(arrays["x"])
    if op == "layer_norm":
        return cunorm.layer_norm(arrays["x"], arrays["weight"], arrays["bias"],
                                 residual=arrays["residual"], return_stats=True)
    if op == "rms_norm":
        return cunorm.rms_norm(arrays["x"], arrays["weight"], return_stats=True)
    return cunorm.attention(arrays["q"], arrays["k"], arrays["v"], return_lse=True)


def _parts(res) -> tuple:
    return res if isinstance(res, tuple) else (res,)


def _reference(op: str, host: dict[str, np.ndarray]) -> np.ndarray:
    """float64 result of ``op`` on ``host`` arrays (keyword name -> the rounded input values),
    computed in NumPy, not through cunorm: softmax / log_softmax over the last axis, rms_norm
    over it (eps 1e-6, times weight), attention with the default scale (key/value heads
    repeated for grouped queries). layer_norm's, with its residual, is the test's own."""
    if op in ("softmax", "log_softmax"):
        x = host["x"].astype(np.float64)
        z = x - x.max(axis=-1, keepdims=True)
        ref = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        return np.exp(ref) if op == "softmax" else ref
    if op == "rms_norm":
        x = host["x"].astype(np.float64)
        w = host["weight"].astype(np.float64)
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w
    assert op.startswith("attention"), op
    q, k, v = (host[n].astype(np.float64) for n in ("q", "k", "v"))
    group = q.shape[1] // k.shape[1]
    k, v = (np.repeat(a, group, axis=1) for a in (k, v))
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm", "attention",
                                "attention decode"])
def test_cupy_arrays_compute_on_their_device(op):
    """Arrays on device 1 while device 0 is current: results on device 1, bit-identical to the
    call made with device 1 current, on the first call of the layout (planned while another
    device was current) and on the memoized ones, from either side; device 0 stays current."""
    rng = np.random.default_rng(len(op))
    host = _host_inputs(op, rng)
    with cupy.cuda.Device(HOME):
        arrays = {name: cupy.asarray(a) for name, a in host.items()}
    assert cupy.cuda.runtime.getDevice() == 0
    first = _parts(_call(op, arrays))  # plans, compiles and memoizes from device 0
    assert cupy.cuda.runtime.getDevice() == 0
    with cupy.cuda.Device(HOME):
        home = _parts(_call(op, arrays))  # the memo, device 1 current
        cupy.cuda.Device().synchronize()
    again = _parts(_call(op, arrays))  # the memo, device 0 current
    assert cupy.cuda.runtime.getDevice() == 0
    for got in (first, again):
        assert len(got) == len(home)
        for a, b in zip(got, home, strict=True):
            assert a.device.id == HOME and b.device.id == HOME
            with cupy.cuda.Device(HOME):
                assert bool(cupy.array_equal(a, b, equal_nan=True)), op
    # the results are the op's, not just the same bits twice
    with cupy.cuda.Device(HOME):
        y = cupy.asnumpy(home[0]).astype(np.float64)
    if op in ("softmax", "log_softmax"):
        np.testing.assert_allclose(y, _reference(op, host), rtol=1e-5, atol=1e-6)
    elif op == "layer_norm":  # of h = x + r, rounded to bfloat16 as the op's second result
        h = host["x"].astype(np.float64) + host["residual"].astype(np.float64)
        h = h.astype(BF16).astype(np.float64)
        with cupy.cuda.Device(HOME):
            np.testing.assert_array_equal(cupy.asnumpy(home[1]).astype(np.float64), h)
        mean = h.mean(axis=-1, keepdims=True)
        rstd = 1 / np.sqrt(((h - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
        w, b = (host[n].astype(np.float64) for n in ("weight", "bias"))
        ref = (h - mean) * rstd * w + b
        # DESIGN section 3's bound for bfloat16, relative to each row's largest value
        assert (np.abs(y - ref).max(axis=-1) / np.abs(ref).max(axis=-1)).max() <= 1.6e-2
    elif op == "rms_norm":
        np.testing.assert_allclose(y, _reference(op, host), rtol=4e-3, atol=4e-3)
    elif op.startswith("attention"):
        np.testing.assert_allclose(y, _reference(op, host), rtol=2e-2, atol=2e-3)


def test_cupy_out_on_another_device_is_refused():
    """``out`` on the current device for an ``x`` on another: a ValueError naming both
    devices, and ``out`` left as it was."""
    with cupy.cuda.Device(HOME):
        x = cupy.ones((8, 128), np.float32)
    out = cupy.full((8, 128), 7.0, np.float32)
    for call in (lambda: cunorm.softmax(x, out=out), lambda: cunorm.rms_norm(x, out=out)):
        with pytest.raises(ValueError, match="out is on device 0 but x is on device 1"):
            call()
    assert float(out.min()) == 7.0 == float(out.max())
    assert cupy.cuda.runtime.getDevice() == 0


@pytest.mark.parametrize("op", ["softmax", "rms_norm", "attention", "attention decode"])
def test_torch_tensors_compute_on_their_device(op, monkeypatch):
    """CUDA tensors on cuda:1 while cuda:0 is torch's current device: results on cuda:1, equal
    to those made with cuda:1 current and to the float64 reference within the dtype's bound;
    the repeat takes the tensor memo (no CuPy view) from either device."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device=f"cuda:{HOME}").manual_seed(3)
    dev = f"cuda:{HOME}"
    if op == "softmax":
        args = (torch.randn(96, 300, device=dev, generator=gen),)
        fn = cunorm.softmax
    elif op == "rms_norm":
        args = (torch.randn(7, 4096, device=dev, generator=gen, dtype=torch.bfloat16),
                torch.randn(4096, device=dev, generator=gen, dtype=torch.bfloat16))
        fn = cunorm.rms_norm
    elif op == "attention":
        args = tuple(torch.randn(1, 8, 77, 64, device=dev, generator=gen, dtype=torch.float16)
                     for _ in range(3))
        fn = cunorm.attention
    else:  # key splits and their merge
        args = (torch.randn(1, 32, 1, 128, device=dev, generator=gen, dtype=torch.bfloat16),
                *(torch.randn(1, 8, 20000, 128, device=dev, generator=gen,
                              dtype=torch.bfloat16) for _ in range(2)))
        fn = cunorm.attention
    # torch made the tensors with the CUDA runtime's device left at 1 while it reports 0 (its
    # lazy device switch): make 0 current for both, so the calls below find it current
    cupy.cuda.runtime.setDevice(0)
    assert torch.cuda.current_device() == 0
    away = [fn(*args)]  # the full path: views, checks, the plan; memoizes the layout
    real_to_cupy, views = _array.to_cupy, []

    def counting_to_cupy(*a, **kw):
        views.append(a)
        return real_to_cupy(*a, **kw)

    monkeypatch.setattr(_array, "to_cupy", counting_to_cupy)
    away.append(fn(*args))
    assert torch.cuda.current_device() == 0 and cupy.cuda.runtime.getDevice() == 0
    with torch.cuda.device(HOME):
        home = [fn(*args) for _ in range(2)]
        torch.cuda.synchronize()
    assert not views  # every repeat took the memo
    assert torch.cuda.current_device() == 0 and cupy.cuda.runtime.getDevice() == 0
    for y in away + home:
        assert y.device == torch.device(dev)
        torch.testing.assert_close(y, home[0], atol=0, rtol=0)
    # Equal bits show that the calls from either device agree, not that any of them is right
    # (the same wrong plan, or a launch that never ran, would agree with itself): each result
    # against the float64 reference of the same rounded inputs, within DESIGN section 3's
    # bound for the dtype, the measure and bound the one-device tests hold these kernels to
    # (_gpu.row_errors; test_gpu_softmax / test_gpu_norm rel_err).
    names = {"softmax": ("x",), "rms_norm": ("x", "weight")}.get(op, ("q", "k", "v"))
    host = {n: t.detach().double().cpu().numpy() for n, t in zip(names, args, strict=True)}
    ref = _reference(op, host)
    dtype = str(args[0].dtype).removeprefix("torch.")
    for i, y in enumerate(away + home):
        assert y.dtype == args[0].dtype and tuple(y.shape) == ref.shape, (i, y.dtype, y.shape)
        err = float(row_errors(y.double().cpu().numpy(), ref).max())
        assert err <= TOL[dtype], f"{op} result {i}: error {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_jax_arrays_compute_on_their_device(op, monkeypatch):
    """A JAX array on GPU 1 while device 0 is current: a JAX result on GPU 1, equal to the
    float64 reference within the dtype's bound; device 0 stays current."""
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPUs with CuPy
    jax = pytest.importorskip("jax", reason="jax is not installed")
    jnp = pytest.importorskip("jax.numpy")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    if len(gpus) < 2:
        pytest.skip("JAX sees one GPU: the multi-device JAX test not run")
    host = (np.random.default_rng(4).standard_normal((64, 1000)) * 3).astype(np.float32)
    x = jax.device_put(jnp.asarray(host), gpus[HOME])
    xd = host.astype(np.float64)
    if op == "softmax":
        e = np.exp(xd - xd.max(axis=-1, keepdims=True))
        ref = e / e.sum(axis=-1, keepdims=True)
    else:
        c = xd - xd.mean(axis=-1, keepdims=True)
        ref = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5)
    # JAX's first use of its GPUs in a process may leave the last one current: choose 0
    with cupy.cuda.Device(0):
        ys = []
        for _ in range(2):
            ys.append(getattr(cunorm, op)(x))
            assert cupy.cuda.runtime.getDevice() == 0
    for y in ys:
        assert isinstance(y, jax.Array) and y.devices() == {gpus[HOME]}
        np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)
