"""Cached device properties (one query per device per process).

The dispatcher only sees a :class:`DeviceProps`, never CuPy, so its branches can be tested on a
machine without a GPU by building a fake one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProps:
    """What the dispatcher needs to know about a GPU.

    Attributes
    ----------
    name : str
        Marketing name, e.g. ``"NVIDIA H200"``.
    cc : tuple of int
        Compute capability ``(major, minor)``.
    sm_count : int
        Number of streaming multiprocessors.
    max_threads_per_sm : int
        Resident threads per multiprocessor.
    smem_per_block_optin : int
        Largest dynamic + static shared memory one block may opt in to (bytes).
    smem_per_sm : int
        Shared memory per multiprocessor (bytes).
    l2_bytes : int
        L2 cache size (bytes).
    """

    name: str
    cc: tuple[int, int]
    sm_count: int
    max_threads_per_sm: int
    smem_per_block_optin: int
    smem_per_sm: int
    l2_bytes: int

    @property
    def arch(self) -> int:
        """Compute capability as one number, e.g. 90 for sm_90."""
        return self.cc[0] * 10 + self.cc[1]

    @property
    def has_clusters(self) -> bool:
        """Thread-block clusters and distributed shared memory (sm_90 and later)."""
        return self.cc[0] >= 9


@functools.cache
def device_props(device_id: int) -> DeviceProps:
    """Query and cache the properties of CUDA device ``device_id``.

    Examples
    --------
    >>> device_props(0).sm_count  # doctest: +SKIP
    132
    """
    import cupy

    p = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    return DeviceProps(
        name=name,
        cc=(int(p["major"]), int(p["minor"])),
        sm_count=int(p["multiProcessorCount"]),
        max_threads_per_sm=int(p["maxThreadsPerMultiProcessor"]),
        smem_per_block_optin=int(p["sharedMemPerBlockOptin"]),
        smem_per_sm=int(p["sharedMemPerMultiprocessor"]),
        l2_bytes=int(p["l2CacheSize"]),
    )
