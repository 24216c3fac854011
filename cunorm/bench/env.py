"""What machine and software a benchmark ran on.

Nothing here imports torch, JAX or Triton: versions come from package metadata so that asking
for them costs nothing and cannot change how those libraries initialise (JAX, for one, must see
its allocator settings before its first import; see :mod:`cunorm.bench.peers`).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import re
from typing import Any

# Distribution names to look up, by the name shown in reports. CuPy ships under several wheel
# names (cupy-cuda13x, cupy-cuda12x, cupy), so the module's own __version__ is used for it.
_DISTRIBUTIONS = {
    "torch": ("torch",),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "triton": ("triton", "pytorch-triton"),
    "numpy": ("numpy",),
    "ml_dtypes": ("ml_dtypes",),
}


NO_GPU_MESSAGE = (
    "no CUDA GPU found: running the NumPy reference path on a small sweep; "
    "GPU numbers need a CUDA device"
)


def probe_gpu() -> tuple[bool, str]:
    """Whether a usable CUDA GPU is present.

    Returns
    -------
    ok : bool
        True when CuPy imports and sees at least one device.
    reason : str
        Why not, when ``ok`` is False (empty otherwise).
    """
    try:
        import cupy
    except Exception as exc:  # a broken CUDA install raises more than ImportError
        return False, f"cupy does not import ({type(exc).__name__}: {exc})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # e.g. cudaErrorInsufficientDriver, no driver at all
        return False, f"{type(exc).__name__}: {exc}"
    if count == 0:
        return False, "CUDA reports 0 devices"
    return True, ""


def device_name(device_id: int = 0) -> str:
    """Marketing name of CUDA device ``device_id``, e.g. ``"NVIDIA H200"``."""
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_uuid(device_id: int = 0) -> str:
    """UUID of CUDA device ``device_id`` as nvidia-smi prints it (``GPU-xxxxxxxx-xxxx-...``),
    or ``""`` where the runtime reports none. Reports carry it because two GPUs of one model
    differ: the same layer_norm kernel measured 6% apart on two H200s with equal copy
    bandwidth (benchmarks/results/nvidia-h200-2026-11-22-rowops-profile.txt)."""
    import cupy

    raw = bytes(cupy.cuda.runtime.getDeviceProperties(device_id).get("uuid") or b"")
    if len(raw) == 16:
        h = raw.hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    # CuPy converts the runtime's char[16] as a C string: a UUID with a zero byte comes back
    # cut before it (GPU-c9235576-001f-...: 4 bytes, so the session-68 tables had none). The
    # one GPU nvidia-smi lists whose UUID continues those bytes with a zero byte is the one.
    prefix = raw.hex() + "00"
    found = [u for u in _smi_uuids() if u[4:].replace("-", "").lower().startswith(prefix)]
    return found[0] if len(found) == 1 else ""


def _smi_uuids() -> list[str]:
    """The UUIDs nvidia-smi lists (``GPU-...``), none where it is missing or fails."""
    import subprocess

    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if res.returncode != 0:
        return []
    return [u.strip() for u in res.stdout.splitlines() if u.strip().startswith("GPU-")]


def slugify(name: str) -> str:
    """File-name form of a device name: ``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``.

    Examples
    --------
    >>> slugify("NVIDIA H200")
    'nvidia-h200'
    >>> slugify("  Tesla V100-SXM2-16GB ")
    'tesla-v100-sxm2-16gb'
    """
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown-device"


def today() -> str:
    """Local date as ``YYYY-MM-DD`` (the date part of result file names)."""
    return datetime.date.today().isoformat()


def _dist_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, Any]:
    """Versions of cunorm, CuPy, CUDA and the peer libraries (None where not installed)."""
    out: dict[str, Any] = {}
    try:
        import cunorm

        out["cunorm"] = getattr(cunorm, "__version__", None) or _dist_version(("cunorm",))
    except Exception:  # the report still gets written without it
        out["cunorm"] = None
    try:
        import cupy

        out["cupy"] = cupy.__version__
        try:
            out["cuda_runtime"] = _cuda_version(cupy.cuda.runtime.runtimeGetVersion())
            out["cuda_driver"] = _cuda_version(cupy.cuda.runtime.driverGetVersion())
        except Exception:  # no driver on a CPU-only machine
            pass
    except Exception:
        out["cupy"] = None
    for shown, dists in _DISTRIBUTIONS.items():
        out[shown] = _dist_version(dists)
    return out


def _cuda_version(v: int) -> str:
    """CUDA's integer version (13000) as text ("13.0")."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def run_meta(command: str) -> dict[str, Any]:
    """What every GPU report starts from: device, its file-name slug, date, versions, command.

    The caller adds the copy bandwidth and the timer once they are measured.
    """
    device = device_name()
    return {
        "device": device,
        "uuid": device_uuid(),
        "slug": slugify(device),
        "date": today(),
        "versions": versions(),
        "command": command,
    }
