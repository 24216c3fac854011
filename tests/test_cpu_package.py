"""Package hygiene: importing cunorm touches no GPU library, the NumPy path needs neither CuPy
nor ml_dtypes, and the kernel sources are found and compiled as one self-contained string.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cunorm
from cunorm import _kernels

PKG_PARENT = Path(cunorm.__file__).resolve().parent.parent
GPU_MODULES = ("cupy", "cupy_backends", "cupyx", "torch", "jax", "jaxlib", "triton")


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports the same cunorm as this process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PKG_PARENT),
                                                      env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=str(PKG_PARENT), timeout=120)


def test_import_loads_no_gpu_library() -> None:
    res = run_python(f"""
        import sys
        import numpy as np
        import cunorm
        assert cunorm.__file__.startswith({str(PKG_PARENT)!r}), cunorm.__file__
        y = cunorm.softmax(np.array([[1.0, 2.0, 3.0]]), axis=-1)
        y = cunorm.log_softmax(np.ones((2, 3), np.float32), axis=(0, 1))
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {GPU_MODULES!r})
        print("LOADED", loaded)
        assert not loaded, loaded
    """)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("blocked", [("cupy",), ("cupy", "ml_dtypes")], ids=str)
def test_numpy_path_without_cupy(blocked: tuple[str, ...]) -> None:
    """``sys.modules[name] = None`` makes ``import name`` raise ImportError."""
    res = run_python(f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        import numpy as np
        import cunorm
        x = np.array([[0.0, np.log(3.0)], [5.0, 5.0]], dtype=np.float32)
        y = cunorm.softmax(x)
        assert y.dtype == np.float32 and type(y) is np.ndarray
        np.testing.assert_allclose(y, [[0.25, 0.75], [0.5, 0.5]], rtol=1e-6)
        np.testing.assert_allclose(cunorm.log_softmax(x, axis=0, dtype=np.float64)[:, 1],
                                   np.log([1 / (1 + np.exp(5 - np.log(3.0))),
                                           1 / (1 + np.exp(np.log(3.0) - 5))]), rtol=1e-6)
        try:
            cunorm.softmax(np.zeros(3, np.int32))
        except TypeError as err:
            assert "int32" in str(err)
        else:
            raise AssertionError("int32 accepted")
        print("OK")
    """)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr


def test_public_namespace() -> None:
    assert {"softmax", "log_softmax", "__version__"} <= set(cunorm.__all__)
    for name in cunorm.__all__:
        assert hasattr(cunorm, name), name
    assert "Parameters" in (cunorm.softmax.__doc__ or "")
    assert cunorm.log_softmax.__doc__


def test_version_matches_pyproject() -> None:
    pyproject = PKG_PARENT / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("not a source checkout")
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads(pyproject.read_text())
    assert cunorm.__version__ == meta["project"]["version"]


# --- kernel sources -----------------------------------------------------------------------
def test_source_dir_finds_sources() -> None:
    folder = _kernels.source_dir()
    assert isinstance(folder, Path) and folder.is_dir()
    assert (folder / "common.cuh").is_file()
    assert (folder / "softmax.cu").is_file()
    for name in _kernels.HEADERS + ("norm.cu",):
        assert (folder / name).is_file(), name


def test_kernel_source_inlines_common_header() -> None:
    folder = _kernels.source_dir()
    common = (folder / "common.cuh").read_text()
    body = (folder / "softmax.cu").read_text()
    src = _kernels.kernel_source("softmax.cu")
    assert not re.search(r'^\s*#\s*include\s*["<][^">]*common\.cuh[">]', src, re.MULTILINE)
    assert not re.search(r'^\s*#\s*include\s*"', src, re.MULTILINE), "local #include left"
    assert common.strip() in src and body.strip() in src
    assert src.index(common.strip()) < src.index(body.strip())  # declarations first
    assert "namespace cunorm" in src and "softmax_warp" in src


def test_kernel_source_defines_every_kernel_template() -> None:
    from cunorm import _dispatch

    for name in _dispatch.all_kernel_names(90):
        base = name.split("<", 1)[0].split("::")[-1]
        src = _kernels.kernel_source(_dispatch.kernel_file(name))
        assert re.search(rf"__global__[^;{{]*\b{base}\s*\(", src), f"no kernel {base}"


def test_kernel_source_missing_file() -> None:
    with pytest.raises(FileNotFoundError):
        _kernels.kernel_source("no_such_op.cu")


@pytest.mark.parametrize("arch", [80, 86, 89, 90, 100])
def test_compile_options(arch: int) -> None:
    opts = _kernels.compile_options(arch)
    assert isinstance(opts, tuple) and all(isinstance(o, str) for o in opts)  # CuPy needs a tuple
    assert f"--gpu-architecture=sm_{arch}" in opts
    assert any("c++17" in o for o in opts)
    assert ("-DCUNORM_SM90" in opts) == (arch >= 90)
    assert "-DCUNORM_SM90A" not in opts


@pytest.mark.parametrize("arch", [80, 89, 90, 100])
def test_compile_options_arch_specific(arch: int) -> None:
    """attention.cu (wgmma) builds for sm_90a on 9.0 only; other sources never do."""
    opts = _kernels.compile_options(arch, "attention.cu")
    target = f"--gpu-architecture=sm_{arch}{'a' if arch == 90 else ''}"
    assert target in opts and ("-DCUNORM_SM90A" in opts) == (arch == 90)
    assert "--gpu-architecture=sm_90" in _kernels.compile_options(90, "softmax.cu")


def test_foreign_stream_wrapper() -> None:
    """A torch stream handle reaches CuPy through Stream.from_external (the CUDA stream
    protocol) where CuPy has it, else through ExternalStream(handle, device)."""
    from types import SimpleNamespace

    from cunorm import _array

    made: list[tuple] = []

    class Stream:
        @staticmethod
        def from_external(obj):
            made.append(("from_external", obj.__cuda_stream__()))
            return "wrapped"

    def external(ptr, dev):
        made.append(("ExternalStream", ptr, dev))
        return "external"

    new = SimpleNamespace(cuda=SimpleNamespace(Stream=Stream, ExternalStream=external))
    old = SimpleNamespace(cuda=SimpleNamespace(Stream=object, ExternalStream=external))
    assert _array._wrap_stream(new, 0x1234, 1) == "wrapped"
    assert _array._wrap_stream(old, 0x1234, 1) == "external"
    assert made == [("from_external", (0, 0x1234)), ("ExternalStream", 0x1234, 1)]


def test_jax_arrays_run_under_their_cuda_device(monkeypatch) -> None:
    """framework_stream makes a JAX array's CUDA device (DLPack's device type 2) current for
    the call, and leaves CPU arrays and arrays without the protocol alone."""
    from _fakes import CupyDevices

    from cunorm import _array

    devices = CupyDevices()
    monkeypatch.setattr(_array, "_cupy", lambda: devices.module)

    class Array:
        def __init__(self, where) -> None:
            self.where = where

        def __dlpack_device__(self):
            return self.where

    for x, inside, switches in ((Array((2, 1)), 1, [1]), (Array((1, 0)), 0, []),
                                (object(), 0, [])):
        devices.switches.clear()
        with _array.framework_stream(x, "jax", "softmax"):
            assert devices.current == inside
        assert devices.switches == switches and devices.current == 0


@pytest.mark.parametrize(("op", "module", "inner"), [
    ("softmax", "cunorm.softmax", "_softmax_cupy_checked"),
    ("rms_norm", "cunorm.norm", "_validate"),
    ("attention", "cunorm.attention", "_validate")])
def test_cupy_arrays_run_under_their_device(op, module, inner, monkeypatch) -> None:
    """A CuPy array on device 1 while device 0 is current reaches the op's checks with device
    1 current (a stand-in CuPy records the device), and device 0 is current again after; an
    array on the current device runs without a switch."""
    from types import SimpleNamespace

    from _fakes import CupyDevices

    devices = CupyDevices()
    monkeypatch.setitem(sys.modules, "cupy", devices.module)

    class Reached(Exception):
        pass

    def stop(*args, **kwargs):
        raise Reached(devices.current)

    monkeypatch.setattr(importlib.import_module(module), inner, stop)
    array_type = type("ndarray", (), {"__module__": "cupy"})
    for dev, want in ((1, [1]), (0, [])):
        x = array_type()
        x.data = SimpleNamespace(device_id=dev)
        devices.switches.clear()
        args = (x, x, x) if op == "attention" else (x,)
        kwargs = {"mask": 1} if op == "attention" else {"axis": (0,)}  # no memo on these
        with pytest.raises(Reached) as reached:
            getattr(cunorm, op)(*args, **kwargs)
        assert reached.value.args == (dev,) and devices.switches == want
        assert devices.current == 0


def test_torch_memo_switches_device_through_torch(monkeypatch) -> None:
    """A memoized call on tensors of another device runs with that device made current by
    torch (whose own record of the current device its allocations restore), leaves the
    previous device current, and gives up (None: the full path) where torch left the CUDA
    runtime elsewhere."""
    import contextlib
    from types import SimpleNamespace

    from _fakes import CupyDevices

    from cunorm import _array

    devices = CupyDevices()
    monkeypatch.setitem(sys.modules, "cupy", devices.module)
    deferred = []

    @contextlib.contextmanager
    def device(dev: int):
        prev = devices.current
        if not deferred:
            devices.current = dev
        yield
        devices.current = prev

    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(device=device)))
    assert _array.torch_launch_stream(1) is None  # device 0 is current
    assert _array.torch_on_device(1, lambda a: (a, devices.current), "x") == ("x", 1)
    assert devices.current == 0
    deferred.append(True)
    assert _array.torch_on_device(1, lambda: pytest.fail("ran on device 0")) is None
    assert devices.current == 0


# --- bounded per-geometry caches -------------------------------------------------------------
def test_bounded_cache_drops_the_oldest_entry():
    from cunorm._cache import BoundedCache

    cache = BoundedCache(3)
    for i in range(5):
        cache[i] = str(i)
    assert list(cache.items()) == [(2, "2"), (3, "3"), (4, "4")]
    cache[3] = "again"  # replacing a kept key drops nothing
    assert list(cache) == [2, 3, 4] and cache[3] == "again"
    assert cache.get(0) is None
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        BoundedCache(0)


def test_bounded_cache_under_threads():
    """Threads inserting past the limit at once (a decoding loop per thread, each meeting a
    new geometry a call) never raise and leave at most ``limit`` entries."""
    import threading

    from cunorm._cache import BoundedCache

    cache, errors = BoundedCache(8), []

    def insert(base: int) -> None:
        try:
            for i in range(20_000):
                cache[base + i] = i
                if i % 997 == 0:
                    cache.clear()
        except Exception as err:  # noqa: BLE001 - any exception is the failure
            errors.append(err)

    threads = [threading.Thread(target=insert, args=(n * 100_000,)) for n in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: an unlocked eviction fails at once
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(cache) <= 8


@pytest.mark.parametrize(("module", "name"), [
    ("cunorm.softmax", "_PLANS"), ("cunorm.softmax", "_RECIPES"), ("cunorm.norm", "_PLANS"),
    ("cunorm.norm", "_RECIPES"), ("cunorm._attn_launch", "_PLANS"),
    ("cunorm._attn_launch", "_MERGES"), ("cunorm.attention", "_MEMO"),
    ("cunorm._kernels", "_OCCUPANCY"), ("cunorm._array", "_EXTERNAL_STREAMS"),
    ("cunorm.softmax", "_TORCH_RECIPES"), ("cunorm.norm", "_TORCH_RECIPES"),
    ("cunorm.attention", "_TORCH_MEMO")])
def test_geometry_caches_are_bounded(module, name):
    """A program that meets a new geometry on every call (a KV cache growing by a key a step)
    must not grow the plan caches or the attention memo without end."""
    from cunorm._cache import CACHE_LIMIT, BoundedCache

    cache = getattr(importlib.import_module(module), name)
    assert isinstance(cache, BoundedCache)
    assert cache.limit == (64 if name == "_EXTERNAL_STREAMS" else CACHE_LIMIT)
