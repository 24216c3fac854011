"""Kernel sources and the compilation cache: the one module that touches ``cupy.RawModule``.

Kernels are C++ templates in ``cuda_src/*.cu``. A kernel is named by its template
instantiation (e.g. ``cunorm::softmax_warp<float, float, false, 4, 8, 32, 1, false>``),
compiled on first use for the device it runs on, and memoized per (device, name).
The headers (``common.cuh``, ``rows.cuh``) are pasted in front of every source instead of being
``#include``-d, because CuPy's on-disk cache keys on the source text only and would miss an
edited header.
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

from ._cache import BoundedCache
from ._driver_launch import ensure_context, max_active_clusters

# (device id, kernel name) -> cupy.RawKernel, filled lazily.
_KERNELS: dict[tuple[int, str], object] = {}
# CUfunction_attribute CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED (not named by CuPy)
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14


def source_dir() -> Path:
    """Folder holding ``common.cuh`` and the ``*.cu`` sources.

    Inside an installed wheel the sources live in ``cunorm/cuda_src``; in a source checkout
    they are the top-level ``cuda_src/`` folder next to the package.
    """
    installed = importlib.resources.files("cunorm").joinpath("cuda_src")
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(__file__).resolve().parent.parent / "cuda_src"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        "cunorm kernel sources not found: expected cunorm/cuda_src (installed) or "
        f"cuda_src/ next to the package (checkout); looked in {installed} and {checkout}"
    )


#: Headers pasted, in this order, in front of every op source.
HEADERS = ("common.cuh", "rows.cuh")


@functools.cache
def kernel_source(op_file: str) -> str:
    """Full compilable source of ``cuda_src/<op_file>``: the HEADERS inlined in front."""
    folder = source_dir()
    parts = [f"// ---- {name} ----\n{(folder / name).read_text()}" for name in (*HEADERS, op_file)]
    return "\n".join(parts) + "\n"


#: Sources with kernels that use arch-specific instructions (wgmma): on compute capability 9.0
#: they are built for sm_90a, whose machine code runs on 9.0 devices only (each build is for the
#: device it runs on); elsewhere those kernels compile to a trap and are never planned.
ARCH_SPECIFIC_SOURCES = frozenset({"attention.cu"})


def arch_specific(arch: int, op_file: str) -> bool:
    """Whether ``op_file`` is built for the arch-specific target (sm_90a) on ``arch``."""
    return arch == 90 and op_file in ARCH_SPECIFIC_SOURCES


def compile_options(arch: int, op_file: str = "") -> tuple[str, ...]:
    """NVRTC options for compute capability ``arch`` (e.g. 90) and source ``op_file``. Must be
    a tuple (CuPy)."""
    specific = arch_specific(arch, op_file)
    opts = ["--std=c++17", f"--gpu-architecture=sm_{arch}{'a' if specific else ''}"]
    if arch >= 90:
        opts.append("-DCUNORM_SM90")  # thread-block clusters exist from sm_90 on
    if specific:
        opts.append("-DCUNORM_SM90A")  # warpgroup MMA (wgmma)
    return tuple(opts)


def get_kernel(device_id: int, arch: int, op_file: str, name: str, smem_optin: int = 0):
    """Return the compiled kernel ``name`` from ``cuda_src/op_file`` for ``device_id``.

    Parameters
    ----------
    device_id : int
        CUDA device ordinal; kernels are cached per device.
    arch : int
        Compute capability as one number (``DeviceProps.arch``).
    op_file : str
        Source file under ``cuda_src/``, e.g. ``"softmax.cu"``.
    name : str
        Template instantiation to compile (an NVRTC name expression).
    smem_optin : int
        If non-zero, the kernel's dynamic shared-memory limit is raised to this many bytes
        (minus its static shared memory) so blocks may use more than the default 48 KB.
    """
    key = (device_id, name)
    kern = _KERNELS.get(key)
    if kern is None:
        import cupy

        with cupy.cuda.Device(device_id):
            ensure_context()  # the module loads into the thread's current context
            module = cupy.RawModule(
                code=kernel_source(op_file),
                options=compile_options(arch, op_file),
                name_expressions=(name,),
            )
            kern = module.get_function(name)
            if smem_optin:
                kern.max_dynamic_shared_size_bytes = smem_optin - kern.shared_size_bytes
            if "_cluster<" in name:  # clusters of more than 8 blocks need the opt-in
                cupy.cuda.driver.funcSetAttribute(
                    kern.kernel.ptr, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        _KERNELS[key] = kern
    return kern



def kernel_oracles(device_id: int, arch: int, op_file: str):
    """``(kernel_for(name), occ(name, block, smem))`` over ``op_file``'s kernels on device
    ``device_id``: the compiled kernel a plan names, and the occupancy oracle a planner
    takes (resident blocks an SM)."""

    def kernel_for(name: str):
        return get_kernel(device_id, arch, op_file, name)

    def occ(name: str, block: int, smem: int) -> int:
        return occupancy(kernel_for(name), block, smem)

    return kernel_for, occ


def cluster_oracle(device_id: int, kernel_for):
    """``clusters(name, cluster, block, smem)``: the clusters of that kernel (from
    ``kernel_for``, :func:`kernel_oracles`) device ``device_id`` runs at once, as
    :func:`cunorm._grad_dispatch.plan_grad` and ``plan_norm_grad`` take it. Answers are
    cached."""

    def clusters(name: str, cluster: int, block: int, smem: int) -> int:
        kernel = kernel_for(name)
        key = (kernel.kernel.ptr, cluster, block, smem)
        count = _CLUSTERS.get(key)
        if count is None:
            set_carveout(kernel, -1)  # as occupancy() asks
            count = _CLUSTERS[key] = max_active_clusters(kernel, device_id, cluster, block,
                                                         smem)
        return count

    return clusters


def drop_kernels() -> None:
    """Forget every compiled kernel and what was measured of them (occupancy), so that later
    calls compile again: for measurements that swap sources or options in one process."""
    _KERNELS.clear()
    _OCCUPANCY.clear()
    _CLUSTERS.clear()


# CUfunction handle -> the carveout hint last given to it. The hint is an attribute of the
# function, and CuPy shares one module (so one function) among equal sources and options, so
# the record follows the handle, not the RawKernel object.
_CARVEOUTS: dict[int, int] = {}


def set_carveout(kernel, percent: int) -> None:
    """Give ``kernel`` the shared-memory carveout hint ``percent`` (of the SM's shared-memory
    capacity; -1: the driver's choice) unless it already carries it. Plans of one kernel may
    want different hints (:attr:`cunorm._dispatch.LaunchPlan.carveout`), so a launch sets its
    own; an unchanged hint costs a dictionary lookup, not a driver call, and while no kernel
    carries one (every plan but a few), not even that."""
    if percent < 0 and not _CARVEOUTS:
        return
    handle = kernel.kernel.ptr
    if _CARVEOUTS.get(handle, -1) != percent:
        kernel.preferred_shared_memory_carveout = percent
        _CARVEOUTS[handle] = percent


# (CUfunction handle, block, dynamic smem) -> blocks per SM under the driver's carveout
_OCCUPANCY: dict[tuple[int, int, int], int] = BoundedCache()
# (CUfunction handle, cluster, block, dynamic smem) -> clusters the device runs at once
_CLUSTERS: dict[tuple[int, int, int, int], int] = BoundedCache()


def occupancy(kernel, block: int, dynamic_smem: int) -> int:
    """Active blocks per multiprocessor for ``kernel`` at this block size and shared memory,
    under the driver's split of L1 and shared memory: the driver's answer follows the
    kernel's carveout hint, which a launch of another plan may have set, and a plan must not
    depend on which shape ran before it. Answers are cached (every new shape plans, and a
    plan may ask twice)."""
    key = (kernel.kernel.ptr, block, dynamic_smem)
    blocks = _OCCUPANCY.get(key)
    if blocks is None:
        import cupy

        ensure_context()
        set_carveout(kernel, -1)
        blocks = _OCCUPANCY[key] = int(
            cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                kernel.kernel.ptr, block, dynamic_smem
            )
        )
    return blocks

