"""Programmatic dependent launch (sm_90+): a kernel launched with the driver's
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` may be scheduled while the kernel
before it in the stream still runs, once that kernel's blocks have all called
``griddep_launch_dependents()`` (``cuda_src/common.cuh``); its own ``griddep_wait()`` then holds
it until the first kernel has completed and its writes are visible. The launch overhead and
block scheduling of a short kernel that consumes a long one's results (the split-KV merge after
a decoding step) then overlap the long one instead of following it.

CuPy's ``RawKernel`` launches through ``cuLaunchKernel``, which takes no launch attributes, so
these launches call ``cuLaunchKernelEx`` of the CUDA driver library directly (ctypes).
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

#: ``CUlaunchAttributeID`` CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
PROGRAMMATIC_STREAM_SERIALIZATION = 6
#: Compute capability (as one number) from which the hardware overlaps dependent launches.
MIN_ARCH = 90


class _AttrValue(ctypes.Union):
    """``CUlaunchAttributeValue``: a 64-byte union, 8-byte aligned."""

    _fields_ = [("words", ctypes.c_uint64 * 8), ("flag", ctypes.c_int)]


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: the id at offset 0, the value at offset 8 (72 bytes)."""

    _fields_ = [("id", ctypes.c_int), ("value", _AttrValue)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (56 bytes on 64-bit hosts)."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


@functools.cache
def _driver():
    """The CUDA driver library with ``cuLaunchKernelEx`` (CUDA 12.0+), or None."""
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
        launch = lib.cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    launch.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    launch.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorName.restype = ctypes.c_int
    return lib


def available(arch: int) -> bool:
    """Whether dependent launches overlap on a device of compute capability ``arch`` (e.g. 90)
    and the driver library offers ``cuLaunchKernelEx``."""
    return arch >= MIN_ARCH and _driver() is not None


class DependentLaunch:
    """A kernel's launch as the programmatic dependent of the kernel before it in the stream:
    grid and block bound once, the arguments (leading pointers, then by-value structs) given
    per call (:meth:`fire`), so one object serves every launch of a plan.

    Parameters
    ----------
    kernel : cupy.RawKernel
        A kernel that calls ``griddep_wait()`` before reading what the previous kernel writes.
    device : int
        The device the kernel was loaded on: :meth:`fire` must run with it current.
    grid, block : int
        Blocks and threads per block (one dimension).
    n_pointers : int
        Number of leading pointer arguments (64-bit device addresses).
    struct_sizes : tuple of int
        Sizes in bytes of the arguments after them, each passed by value (a C struct).

    Examples
    --------
    >>> ctypes.sizeof(LaunchAttribute), LaunchAttribute.value.offset, ctypes.sizeof(LaunchConfig)
    (72, 8, 56)
    """

    __slots__ = ("device", "_name", "_function", "_config", "_attr", "_pointers", "_structs",
                 "_params", "_lock", "_held")

    def __init__(self, kernel, device: int, grid: int, block: int, n_pointers: int,
                 struct_sizes: tuple[int, ...]) -> None:
        self.device = device
        self._name = kernel.name
        self._function = ctypes.c_void_p(kernel.kernel.ptr)
        self._attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attr.value.flag = 1
        self._config = LaunchConfig(grid=(grid, 1, 1), block=(block, 1, 1), shared_mem=0,
                                    attrs=ctypes.pointer(self._attr), num_attrs=1)
        self._pointers = (ctypes.c_uint64 * n_pointers)()
        self._structs = [ctypes.create_string_buffer(size) for size in struct_sizes]
        base = ctypes.addressof(self._pointers)
        self._params = (ctypes.c_void_p * (n_pointers + len(struct_sizes)))(
            *(base + 8 * i for i in range(n_pointers)),
            *(ctypes.addressof(buf) for buf in self._structs))
        # The argument and config buffers are shared by every call (cuLaunchKernelEx copies
        # them at launch): threads firing one launch take turns filling and launching.
        self._lock = threading.Lock()
        self._held: tuple[bytes, ...] | None = None  # the structs the buffers hold

    def fire(self, stream: int, pointers: tuple[int, ...], structs: tuple[bytes, ...]) -> None:
        """Launch on stream handle ``stream`` (0: the legacy default stream) with these
        pointer arguments and by-value structs (their bytes, of the sizes given at
        construction)."""
        lib = _driver()
        with self._lock:
            for i, p in enumerate(pointers):
                self._pointers[i] = p
            if structs is not self._held:  # a prepared launch passes the same tuple each call
                for buf, value in zip(self._structs, structs, strict=True):
                    ctypes.memmove(buf, value, len(buf))
                self._held = structs
            self._config.stream = stream
            rc = lib.cuLaunchKernelEx(ctypes.byref(self._config), self._function,
                                      self._params, None)
        if rc != 0:
            err = ctypes.c_char_p()
            lib.cuGetErrorName(rc, ctypes.byref(err))
            name = err.value.decode() if err.value else "unknown error"
            raise RuntimeError(f"cuLaunchKernelEx of {self._name} failed: {name} ({rc})")
