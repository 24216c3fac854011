"""``cunorm.show_config()`` / ``python -m cunorm`` and ``python -m cunorm.precompile`` without a
GPU: real subprocesses with CuPy blocked or faked, and the compile loop with a fake compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import cunorm
from cunorm import _config, _device, _dispatch, _kernels
from cunorm import precompile as pc

PKG_PARENT = Path(cunorm.__file__).resolve().parent.parent
H200 = _device.DeviceProps("NVIDIA H200", (9, 0), 132, 2048, 232448, 233472, 60 << 20)

# A stand-in for CuPy that imports but sees no GPU (as on a machine without a driver).
FAKE_CUPY_NO_GPU = """
import sys, types
class CUDARuntimeError(RuntimeError):
    pass
def _no_device():
    raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
cupy = types.ModuleType("cupy")
cupy.__version__ = "14.2.0"
cupy.cuda = types.SimpleNamespace(
    runtime=types.SimpleNamespace(getDeviceCount=_no_device, runtimeGetVersion=lambda: 13000,
                                  driverGetVersion=lambda: 0),
    nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0)),
)
sys.modules["cupy"] = cupy
"""
BLOCK_CUPY = "import sys\nsys.modules['cupy'] = None\n"


def run_python(prelude: str, code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``prelude`` then ``code`` in a fresh interpreter importing this checkout's cunorm."""
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PKG_PARENT),
                                                       full.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, env=full, cwd=str(PKG_PARENT),
                          timeout=120)


def run_module(prelude: str, module: str, *args: str, env: dict | None = None):
    """``python -m module args`` after ``prelude`` (runpy keeps ``sys.modules`` edits)."""
    code = (f"import runpy\nsys.argv = [{module!r}, *{list(args)!r}]\n"
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
    return run_python("import sys\n" + prelude, code, env)


def labels(text: str) -> dict[str, str]:
    """show_config lines as {label: value} (labels are padded to a fixed width)."""
    out = {}
    for line in text.splitlines():
        label, value = line[:_config._LABEL_WIDTH].strip(), line[_config._LABEL_WIDTH:]
        out[label] = value
    return out


# --- show_config --------------------------------------------------------------------------
def test_show_config_without_cupy(tmp_path: Path) -> None:
    res = run_python(BLOCK_CUPY, """
        import cunorm
        cunorm.show_config()
        loaded = sorted(m for m, mod in sys.modules.items()
                        if mod is not None and m.split(".")[0] in ("cupy", "torch", "jax"))
        assert not loaded, loaded
    """, env={"CUPY_CACHE_DIR": str(tmp_path / "kc")})
    assert res.returncode == 0, res.stdout + res.stderr
    got = labels(res.stdout)
    assert got["cunorm"].startswith(cunorm.__version__)
    assert got["NumPy"].strip()
    assert got["CuPy"].startswith("not installed")
    assert "cuda13" in got["CuPy"] and "cuda12" in got["CuPy"]  # says what to install
    assert got["GPU"].startswith("none") and "NumPy" in got["GPU"]
    assert got["kernel cache"].startswith(str(tmp_path / "kc"))
    assert "CUPY_CACHE_DIR" in got["kernel cache"]
    assert got["kernel sources"] == str(_kernels.source_dir())
    assert got["bfloat16"].startswith(("available", "unavailable"))
    assert "CUDA runtime" not in got


def test_python_m_cunorm_without_cupy_or_ml_dtypes() -> None:
    res = run_module(BLOCK_CUPY + "sys.modules['ml_dtypes'] = None\n", "cunorm")
    assert res.returncode == 0, res.stdout + res.stderr
    got = labels(res.stdout)
    assert got["CuPy"].startswith("not installed")
    assert got["bfloat16"].startswith("unavailable") and "ml_dtypes" in got["bfloat16"]


def test_python_m_cunorm_help() -> None:
    res = run_module("", "cunorm", "--help")
    assert res.returncode == 0 and "usage: python -m cunorm" in res.stdout, res.stderr


def test_show_config_cupy_without_gpu() -> None:
    res = run_module(FAKE_CUPY_NO_GPU, "cunorm")
    assert res.returncode == 0, res.stdout + res.stderr
    got = labels(res.stdout)
    assert got["CuPy"].startswith("14.2.0")
    assert got["CUDA runtime"] == "13.0"
    assert got["CUDA driver"] == "no NVIDIA driver found"
    assert got["NVRTC"] == "13.0"
    assert got["GPU"].startswith("none (CUDARuntimeError: cudaErrorNoDevice")


def test_show_config_lists_devices(monkeypatch, capsys) -> None:
    fake = type(sys)("cupy")
    fake.__version__ = "14.2.0"
    fake.cuda = type("cuda", (), {})()
    fake.cuda.runtime = type("rt", (), {"getDeviceCount": staticmethod(lambda: 2),
                                        "runtimeGetVersion": staticmethod(lambda: 12080),
                                        "driverGetVersion": staticmethod(lambda: 13000)})()

    def no_nvrtc():
        raise OSError("Failure finding libnvrtc.so.12\nsecond line")

    fake.cuda.nvrtc = type("nvrtc", (), {"getVersion": staticmethod(no_nvrtc)})()
    monkeypatch.setattr(_config, "import_cupy", lambda: (fake, None))
    monkeypatch.setattr(_device, "device_props", lambda i: H200)
    monkeypatch.delenv("CUPY_CACHE_DIR", raising=False)
    cunorm.show_config()
    got = labels(capsys.readouterr().out)
    assert got["CUDA runtime"] == "12.8" and got["CUDA driver"] == "13.0"
    assert got["NVRTC"].startswith("unavailable (OSError: Failure finding libnvrtc.so.12)")
    assert "[ctk]" in got["NVRTC"]
    for i in (0, 1):
        line = got[f"GPU {i}"]
        assert line.startswith("NVIDIA H200, compute capability 9.0 (sm_90), 132 SMs"), line
        assert "227 KiB per block" in line and "L2 60 MiB" in line
    assert got["kernel cache"].startswith(str(Path("~/.cupy/kernel_cache").expanduser()))
    assert "default" in got["kernel cache"]


def test_show_config_writes_to_file(tmp_path: Path) -> None:
    path = tmp_path / "config.txt"
    with path.open("w") as f:
        cunorm.show_config(file=f)
    assert path.read_text().startswith("cunorm")


def test_cache_dir(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    assert _config.cache_dir() == (tmp_path, "from CUPY_CACHE_DIR")
    monkeypatch.delenv("CUPY_CACHE_DIR")
    folder, origin = _config.cache_dir()
    assert folder == Path.home() / ".cupy" / "kernel_cache" and "default" in origin


def test_cuda_version() -> None:
    assert _config.cuda_version(12040) == "12.4"
    assert _config.cuda_version(13000) == "13.0"


# --- python -m cunorm.precompile, no GPU ----------------------------------------------------
@pytest.mark.parametrize("arch", [90, 80])
def test_precompile_list_arch(arch: int) -> None:
    res = run_module(BLOCK_CUPY, "cunorm.precompile", "--list", "--arch", str(arch))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == _dispatch.all_kernel_names(arch)


@pytest.mark.parametrize("prelude", [BLOCK_CUPY, FAKE_CUPY_NO_GPU], ids=["no-cupy", "no-gpu"])
@pytest.mark.parametrize("args", [(), ("--list",), ("--device", "1", "--jobs", "4")], ids=str)
def test_precompile_without_gpu_exits_1(prelude: str, args: tuple[str, ...]) -> None:
    res = run_module(prelude, "cunorm.precompile", *args)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "no CUDA GPU available" in res.stderr, res.stderr
    assert "--list --arch 90" in res.stderr  # says how to get the names without a GPU
    assert "Traceback" not in res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize("args", [("--arch", "90"), ("--jobs", "0")], ids=str)
def test_precompile_usage_errors(args: tuple[str, ...]) -> None:
    res = run_module(BLOCK_CUPY, "cunorm.precompile", *args)
    assert res.returncode == 2 and "usage:" in res.stderr, res.stderr


# --- precompile() with a fake device and compiler -------------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    """One H200 and a get_kernel that records its calls (threads) instead of compiling."""
    calls: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def get_kernel(device_id, arch, op_file, name, smem_optin=0):
        # Pure-Python work: holds the GIL, as a compiler that did not release it would.
        deadline = time.perf_counter() + 0.0002
        while time.perf_counter() < deadline:
            pass
        expected = (0, 90, _dispatch.kernel_file(name), 232448)
        assert (device_id, arch, op_file, smem_optin) == expected
        with lock:
            calls.append((name, threading.current_thread().name, device_id))
        return object()

    monkeypatch.setattr(pc, "target_device", lambda device=0: H200)
    monkeypatch.setattr(_kernels, "get_kernel", get_kernel)
    return calls


@pytest.mark.parametrize("jobs", [1, 4])
def test_precompile_compiles_every_name_once(fake_gpu, jobs: int) -> None:
    names = _dispatch.all_kernel_names(90)
    assert pc.precompile(0, jobs=jobs, progress=False) == len(names)
    assert sorted(n for n, _, _ in fake_gpu) == names
    threads = {t for _, t, _ in fake_gpu}
    if jobs == 1:
        assert threads == {threading.current_thread().name}
    else:
        assert all(t.startswith("cunorm-nvrtc") for t in threads), threads


def test_precompile_reports_failures(fake_gpu, monkeypatch) -> None:
    good = _kernels.get_kernel
    names = _dispatch.all_kernel_names(90)
    bad = set(names[::200])

    def flaky(device_id, arch, op_file, name, smem_optin=0):
        if name in bad:
            raise RuntimeError(f"nvrtc: error in {name}\nmore detail")
        return good(device_id, arch, op_file, name, smem_optin)

    monkeypatch.setattr(_kernels, "get_kernel", flaky)
    with pytest.raises(RuntimeError, match=rf"{len(bad)} of {len(names)} kernels failed") as err:
        pc.precompile(0, jobs=3, progress=False)
    assert "nvrtc: error in" in str(err.value) and "more detail" not in str(err.value)
    assert len(fake_gpu) == len(names) - len(bad)  # the others were still compiled


def test_precompile_progress_counter_without_tqdm(fake_gpu, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    n = pc.precompile(0, jobs=2, progress=True)
    err = capsys.readouterr().err
    assert f"compiling for sm_90: {n}/{n}" in err


def test_precompile_rejects_bad_jobs(fake_gpu) -> None:
    with pytest.raises(ValueError, match="jobs"):
        pc.precompile(0, jobs=0)


def test_precompile_main_reports_count_and_time(fake_gpu, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    assert pc.main(["--jobs", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    n = len(_dispatch.all_kernel_names(90))
    assert out.startswith(f"{n} kernels ready for device 0 (NVIDIA H200, sm_90) in "), out
    assert " s with 2 threads" in out and str(tmp_path) in out


def test_target_device_out_of_range(monkeypatch) -> None:
    fake = type(sys)("cupy")
    fake.cuda = type("cuda", (), {})()
    fake.cuda.runtime = type("rt", (), {"getDeviceCount": staticmethod(lambda: 1)})()
    monkeypatch.setattr(_config, "import_cupy", lambda: (fake, None))
    with pytest.raises(ValueError, match=r"device 3 does not exist: this machine has 1 CUDA "
                                         r"device \(0..0\)"):
        pc.target_device(3)
