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
    max_cluster : int
        Largest thread-block cluster the row kernels may launch on sm_90 and later: 8 (the
        portable maximum) or 16 where the device allows non-portable cluster sizes.
    """

    name: str
    cc: tuple[int, int]
    sm_count: int
    max_threads_per_sm: int
    smem_per_block_optin: int
    smem_per_sm: int
    l2_bytes: int
    max_cluster: int = 8

    @property
    def arch(self) -> int:
        """Compute capability as one number, e.g. 90 for sm_90."""
        return self.cc[0] * 10 + self.cc[1]

    @property
    def has_clusters(self) -> bool:
        """Thread-block clusters and distributed shared memory (sm_90 and later)."""
        return self.cc[0] >= 9


# Non-portable clusters of 16 blocks: every full-size sm_90 part (H100 PCIe has 114 SMs, H100
# SXM and H200 132) schedules them; smaller sm_90 parts and MIG slices keep the portable 8.
NONPORTABLE_CLUSTER_MIN_SMS = 114


def max_cluster_size(cc: tuple[int, int], sm_count: int) -> int:
    """Largest cluster the row kernels use on a device: 16 on sm_90 with at least
    NONPORTABLE_CLUSTER_MIN_SMS multiprocessors, else 8 (ignored below sm_90).

    Examples
    --------
    >>> max_cluster_size((9, 0), 132), max_cluster_size((9, 0), 78), max_cluster_size((8, 0), 108)
    (16, 8, 8)
    """
    return 16 if cc == (9, 0) and sm_count >= NONPORTABLE_CLUSTER_MIN_SMS else 8


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
    cc, sm_count = (int(p["major"]), int(p["minor"])), int(p["multiProcessorCount"])
    return DeviceProps(
        name=name,
        cc=cc,
        sm_count=sm_count,
        max_threads_per_sm=int(p["maxThreadsPerMultiProcessor"]),
        smem_per_block_optin=int(p["sharedMemPerBlockOptin"]),
        smem_per_sm=int(p["sharedMemPerMultiprocessor"]),
        l2_bytes=int(p["l2CacheSize"]),
        max_cluster=max_cluster_size(cc, sm_count),
    )
