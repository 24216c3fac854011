"""``cunorm.show_config()`` and ``python -m cunorm``: what cunorm finds on this machine.

Everything here degrades to a message: no CuPy, a CuPy that cannot load its CUDA libraries,
no driver and no GPU all print a line saying so instead of raising. Only the standard library
is imported at module level, so ``import cunorm`` stays free of CuPy and of the GPU.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import TextIO

#: CuPy's on-disk kernel cache when ``CUPY_CACHE_DIR`` is not set.
DEFAULT_CACHE_DIR = "~/.cupy/kernel_cache"

#: Packages worth knowing about when something goes wrong (versions read from their
#: metadata, never imported).
OPTIONAL_PACKAGES = ("torch", "jax", "jaxlib", "triton", "tqdm", "matplotlib")

_LABEL_WIDTH = 16


def first_line(err: BaseException) -> str:
    """``TypeName: first line of the message`` (CuPy's library errors span many lines)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_version(v: int) -> str:
    """CUDA's integer version (``1000 * major + 10 * minor``) as ``"major.minor"``.

    Examples
    --------
    >>> cuda_version(12040)
    '12.4'
    """
    return f"{v // 1000}.{(v % 1000) // 10}"


def import_cupy():
    """``(cupy module, None)`` or ``(None, reason)``; never raises."""
    try:
        import cupy
    except Exception as err:  # ImportError, or a wheel that cannot load its libraries
        if isinstance(err, ImportError) and getattr(err, "name", None) == "cupy":
            return None, "not installed (pip install 'cunorm[cuda13]' or 'cunorm[cuda12]')"
        return None, f"cannot be imported ({first_line(err)})"
    return cupy, None


def device_count(cupy) -> tuple[int, str | None]:
    """Number of CUDA devices CuPy sees, and the reason when it is 0; never raises."""
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # no driver, driver too old, no device
        return 0, first_line(err)
    return n, None if n else "no CUDA device visible"


def cache_dir() -> tuple[Path, str]:
    """CuPy's kernel cache folder and where that setting comes from.

    CuPy reads ``CUPY_CACHE_DIR`` once, when ``cupy`` is first imported.
    """
    env = os.environ.get("CUPY_CACHE_DIR")
    if env:
        return Path(env).expanduser(), "from CUPY_CACHE_DIR"
    return Path(DEFAULT_CACHE_DIR).expanduser(), "default; set CUPY_CACHE_DIR to move it"


def _source_dir() -> str:
    from . import _kernels

    try:
        return str(_kernels.source_dir())
    except FileNotFoundError as err:
        return f"not found ({err})"


def _bfloat16() -> str:
    try:
        import ml_dtypes
    except Exception:
        return "unavailable (pip install ml_dtypes; bfloat16 arrays need it)"
    return f"available (ml_dtypes {getattr(ml_dtypes, '__version__', '?')})"


def config_lines() -> list[tuple[str, str]]:
    """The (label, value) pairs :func:`show_config` prints, in order."""
    import numpy as np

    from . import __version__

    pkg = Path(__file__).resolve().parent
    lines = [
        ("cunorm", f"{__version__} ({pkg})"),
        ("Python", f"{platform.python_version()} ({sys.platform}, {platform.machine()})"),
        ("NumPy", np.__version__),
    ]
    cupy, why = import_cupy()
    if cupy is None:
        lines += [("CuPy", why), ("GPU", "none: CuPy is needed for GPU arrays; NumPy arrays "
                                          "run the NumPy reference path")]
    else:
        lines.append(("CuPy", f"{cupy.__version__} ({_dist_name(cupy)})"))
        lines += _cuda_lines(cupy)
    folder, origin = cache_dir()
    lines += [
        ("bfloat16", _bfloat16()),
        ("kernel cache", f"{folder} ({origin})"),
        ("kernel sources", _source_dir()),
        ("optional", ", ".join(f"{name} {_dist_version(name) or 'not installed'}"
                               for name in OPTIONAL_PACKAGES)),
    ]
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "0") not in ("", "0"):
        lines.append(("note", "CUPY_CACHE_IN_MEMORY is set: compiled kernels are not saved "
                              "to disk and every process compiles again"))
    return lines


def _dist_name(cupy) -> str:
    """Which CuPy wheel is installed (``cupy-cuda12x``, ``cupy-cuda13x``, ...)."""
    for name in ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"):
        if _dist_version(name) is not None:
            return name
    return "source build"


def _ctk_wheel(cupy) -> str:
    name = _dist_name(cupy)
    return name if name.startswith("cupy-cuda") else "cupy-cuda13x"


def _cuda_lines(cupy) -> list[tuple[str, str]]:
    rt = cupy.cuda.runtime
    out: list[tuple[str, str]] = []
    try:
        out.append(("CUDA runtime", cuda_version(rt.runtimeGetVersion())))
    except Exception as err:
        out.append(("CUDA runtime", f"unavailable ({first_line(err)})"))
    try:
        drv = int(rt.driverGetVersion())
        out.append(("CUDA driver", cuda_version(drv) if drv else "no NVIDIA driver found"))
    except Exception as err:
        out.append(("CUDA driver", f"unavailable ({first_line(err)})"))
    try:
        major, minor = cupy.cuda.nvrtc.getVersion()
        out.append(("NVRTC", f"{major}.{minor}"))
    except Exception as err:  # e.g. libnvrtc not found: kernels cannot be compiled
        out.append(("NVRTC", f"unavailable ({first_line(err)}); cunorm cannot compile its "
                             "kernels: install the CUDA Toolkit or the NVRTC wheel "
                             f"(pip install '{_ctk_wheel(cupy)}[ctk]')"))
    n, why = device_count(cupy)
    if not n:
        out.append(("GPU", f"none ({why}); NumPy arrays run the NumPy reference path"))
        return out
    from ._device import device_props

    for i in range(n):
        try:
            p = device_props(i)
        except Exception as err:
            out.append((f"GPU {i}", f"unavailable ({first_line(err)})"))
            continue
        out.append((f"GPU {i}", f"{p.name}, compute capability {p.cc[0]}.{p.cc[1]} "
                                f"(sm_{p.arch}), {p.sm_count} SMs, shared memory opt-in "
                                f"{p.smem_per_block_optin // 1024} KiB per block, "
                                f"L2 {p.l2_bytes / 2**20:.0f} MiB"))
    return out


def show_config(file: TextIO | None = None) -> None:
    """Print the versions and hardware cunorm sees; useful in bug reports.

    Lists cunorm, Python, NumPy and CuPy versions; with CuPy, the CUDA runtime, driver and
    NVRTC versions and every GPU (name, compute capability, SM count, shared-memory opt-in
    limit per block, L2 size); whether bfloat16 is available (``ml_dtypes``); CuPy's kernel
    cache folder (``CUPY_CACHE_DIR`` or ``~/.cupy/kernel_cache``); the folder of cunorm's
    CUDA sources; and the versions of optional packages. Works without CuPy, without a
    driver and without a GPU (each is reported on its line). ``python -m cunorm`` prints the
    same.

    Parameters
    ----------
    file : file-like, optional
        Where to write (default: ``sys.stdout``).

    Examples
    --------
    >>> import cunorm
    >>> cunorm.show_config()  # doctest: +SKIP
    cunorm          0.1.0 (/.../site-packages/cunorm)
    Python          3.11.7 (linux, x86_64)
    NumPy           2.3.5
    CuPy            14.2.0 (cupy-cuda13x)
    CUDA runtime    13.0
    CUDA driver     13.0
    NVRTC           13.0
    GPU 0           NVIDIA H200, compute capability 9.0 (sm_90), 132 SMs, ...
    bfloat16        available (ml_dtypes 0.5.4)
    kernel cache    /home/me/.cupy/kernel_cache (default; set CUPY_CACHE_DIR to move it)
    kernel sources  /.../site-packages/cunorm/cuda_src
    optional        torch 2.9.1, jax not installed, ...
    """
    out = sys.stdout if file is None else file
    for label, value in config_lines():
        print(f"{label:<{_LABEL_WIDTH}}{value}", file=out)
