"""Kernel launches through the CUDA driver with a prepared argument buffer (:class:`KernelLaunch`),
ordinary or as a programmatic dependent of the kernel before them.

An ordinary launch through CuPy's ``RawKernel`` converts every argument into a C value on each
call: ~9 us of host time for a row kernel's six arguments on an H200 host, against ~5 for
``cuLaunchKernel`` on a buffer that already holds the by-value arguments, into which each call
only writes its pointers. A small array's softmax spends most of its host time there.

Programmatic dependent launch (sm_90+): a kernel launched with the driver's
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` may be scheduled while the kernel
before it in the stream still runs, once that kernel's blocks have all called
``griddep_launch_dependents()`` (``cuda_src/common.cuh``); its own ``griddep_wait()`` then holds
it until the first kernel has completed and its writes are visible. The launch overhead and
block scheduling of a short kernel that consumes a long one's results (the split-KV merge after
a decoding step) then overlap the long one instead of following it.

``cuLaunchKernel`` takes no launch attributes, so dependent launches call ``cuLaunchKernelEx`` of
the CUDA driver library directly (ctypes); ordinary ones go through CuPy's binding of
``cuLaunchKernel``.
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
#: ``CUresult`` CUDA_ERROR_INVALID_CONTEXT: a driver call on a thread with no current context.
INVALID_CONTEXT = 201


def ensure_context() -> None:
    """Make the current device's primary context current on this thread where none is.

    The driver API (occupancy queries, module loads, launches) works in the thread's current
    context, and a thread CUDA has not run on has none: torch runs a backward on an autograd
    thread of its own, which a custom operator's backward may be the first to use (it failed
    with CUDA_ERROR_INVALID_CONTEXT). ``cudaFree(0)`` initializes the runtime's primary
    context of the current device and makes it current, as a CuPy or torch kernel would."""
    import cupy

    if cupy.cuda.driver.ctxGetCurrent() == 0:
        cupy.cuda.runtime.free(0)


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
    # as old as cuLaunchKernelEx (CUDA 12.0 has both)
    lib.cuOccupancyMaxActiveClusters.argtypes = [
        ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(LaunchConfig)]
    lib.cuOccupancyMaxActiveClusters.restype = ctypes.c_int
    return lib


def available(arch: int) -> bool:
    """Whether dependent launches overlap on a device of compute capability ``arch`` (e.g. 90)
    and the driver library offers ``cuLaunchKernelEx``."""
    return arch >= MIN_ARCH and _driver() is not None


#: An entry of :class:`KernelLaunch`'s parameter layout: a pointer argument, given per call.
POINTER = "pointer"


class KernelLaunch:
    """A kernel's launch with grid, block, dynamic shared memory and parameter layout bound, and
    its argument buffer held: each call (:meth:`fire`) writes its pointers, and the by-value
    arguments only when they are not those of the last call, so one object serves every launch
    of a plan.

    Parameters
    ----------
    kernel : cupy.RawKernel
        The compiled kernel (:func:`cunorm._kernels.get_kernel`). A dependent launch's kernel
        calls ``griddep_wait()`` before reading what the previous kernel writes.
    device : int
        The device the kernel was loaded on: :meth:`fire` must run with it current.
    grid, block : int or tuple of int
        Blocks and threads per block (up to three dimensions).
    params : tuple
        The kernel's parameters in order, each :data:`POINTER` (a 64-bit device address given
        per call), an int (the size in bytes of an argument passed by value, given per call) or
        bytes (an argument passed by value, bound here).
    shared_mem : int
        Dynamic shared memory in bytes.
    dependent : bool
        Launch as a programmatic dependent of the kernel before it in the stream
        (:func:`available` must be true).

    Examples
    --------
    >>> ctypes.sizeof(LaunchAttribute), LaunchAttribute.value.offset, ctypes.sizeof(LaunchConfig)
    (72, 8, 56)
    """

    __slots__ = ("dependent", "_name", "_function", "_dims", "_config", "_attr",
                 "_pointers", "_values", "_bound", "_params", "_params_addr", "_launch", "_lock",
                 "_held")

    def __init__(self, kernel, device: int, grid, block, params: tuple, shared_mem: int = 0,
                 dependent: bool = False) -> None:
        self.dependent = dependent
        self._name = kernel.name
        self._function = _function(kernel, device)
        grid3, block3 = _dim3(grid), _dim3(block)
        self._dims = (*grid3, *block3, shared_mem)
        self._attr = self._config = self._launch = None
        if not dependent:
            self._launch = _cupy_driver().launchKernel
        else:
            self._attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
            self._attr.value.flag = 1
            self._config = LaunchConfig(grid=grid3, block=block3, shared_mem=shared_mem,
                                        attrs=ctypes.pointer(self._attr), num_attrs=1)
            self._function = ctypes.c_void_p(self._function)
        self._pointers = (ctypes.c_uint64 * params.count(POINTER))()
        self._values, self._bound, addresses = [], [], []
        base, n_pointers = ctypes.addressof(self._pointers), 0
        for entry in params:
            if entry == POINTER:
                addresses.append(base + 8 * n_pointers)
                n_pointers += 1
                continue
            if isinstance(entry, bytes):
                buf = ctypes.create_string_buffer(entry, len(entry))
                self._bound.append(buf)
            else:
                buf = ctypes.create_string_buffer(entry)
                self._values.append(buf)
            addresses.append(ctypes.addressof(buf))
        self._params = (ctypes.c_void_p * len(addresses))(*addresses)
        self._params_addr = ctypes.addressof(self._params)
        # The argument buffers (and a dependent launch's config) are shared by every call (the
        # driver copies them at launch): threads firing one launch take turns.
        self._lock = threading.Lock()
        self._held: tuple[bytes, ...] | None = None  # the values the buffers hold

    def fire(self, stream: int, pointers: tuple[int, ...], values: tuple[bytes, ...] = ()) -> None:
        """Launch on stream handle ``stream`` (0: the legacy default stream) with these
        pointer arguments and by-value arguments (their bytes, of the sizes of the layout's
        per-call entries, in order)."""
        with self._lock:
            self._pointers[:] = pointers
            if values is not self._held:  # a prepared launch passes the same tuple each call
                self._held = None  # until every buffer holds its new value
                for buf, value in zip(self._values, values, strict=True):
                    ctypes.memmove(buf, value, len(buf))
                self._held = values
            if self._launch is not None:
                try:
                    self._launch(self._function, *self._dims, stream, self._params_addr, 0)
                except _cupy_driver().CUDADriverError as err:
                    if err.status != INVALID_CONTEXT:
                        raise
                    ensure_context()  # a thread with no context yet (no cost until then)
                    self._launch(self._function, *self._dims, stream, self._params_addr, 0)
                return
            self._config.stream = stream
            lib = _driver()
            for attempt in range(2):
                rc = lib.cuLaunchKernelEx(ctypes.byref(self._config), self._function,
                                          self._params, None)
                if rc != INVALID_CONTEXT or attempt:
                    break
                ensure_context()
        _check(lib, rc, f"cuLaunchKernelEx of {self._name}")


def _check(lib, rc: int, what: str) -> None:
    """Raise RuntimeError naming ``what`` and the driver's name for ``rc`` unless it is 0."""
    if rc != 0:
        err = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(err))
        name = err.value.decode() if err.value else "unknown error"
        raise RuntimeError(f"{what} failed: {name} ({rc})")


def counts_clusters() -> bool:
    """Whether the driver library answers :func:`max_active_clusters` (CUDA 12.0+)."""
    return _driver() is not None


def max_active_clusters(kernel, device: int, cluster: int, block: int, shared_mem: int) -> int:
    """How many clusters of ``cluster`` blocks of ``kernel`` (compiled with those cluster
    dimensions) the device runs at once, with ``block`` threads and ``shared_mem`` bytes of
    dynamic shared memory a block: ``cuOccupancyMaxActiveClusters``, which counts the SMs a
    cluster may share (its GPC), unlike blocks an SM times SMs over ``cluster``. Needs
    :func:`counts_clusters`."""
    lib = _driver()
    config = LaunchConfig(grid=(cluster, 1, 1), block=(block, 1, 1), shared_mem=shared_mem)
    count = ctypes.c_int(0)
    ensure_context()
    rc = lib.cuOccupancyMaxActiveClusters(ctypes.byref(count),
                                          ctypes.c_void_p(_function(kernel, device)),
                                          ctypes.byref(config))
    _check(lib, rc, f"cuOccupancyMaxActiveClusters of {kernel.name}")
    return count.value


def _dim3(dims) -> tuple[int, int, int]:
    """A grid or block size (an int or up to three ints) as three ints."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return (*dims, *(1,) * (3 - len(dims)))


def _function(kernel, device: int) -> int:
    """``kernel``'s CUfunction handle on ``device``: CuPy's ``RawKernel.kernel`` answers for the
    current device, which need not be the one a plan is made for."""
    from cupy.cuda import Device

    with Device(device):
        return kernel.kernel.ptr


def _cupy_driver():
    """CuPy's binding of the CUDA driver API (``launchKernel``: ``cuLaunchKernel``)."""
    from cupy.cuda import driver

    return driver
