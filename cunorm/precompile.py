"""Compile every kernel the dispatcher can pick for a GPU, ahead of time.

``python -m cunorm.precompile`` compiles each template instantiation that
:func:`cunorm._dispatch.all_kernel_names` lists for the local GPU's architecture, exactly as a
first call would (same source, options and name, so the same CuPy cache entry). CuPy keeps the
binaries in its on-disk kernel cache (``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``),
so later processes load them instead of compiling on their first call. Run it again after
upgrading cunorm, CuPy or the CUDA toolkit: the cache key includes the kernel source text, the
compile options and the NVRTC version.

Compilation runs in a thread pool: NVRTC releases the GIL while it compiles, so threads run
in parallel; if it did not, the pool would only run them one after another.

Command line::

    python -m cunorm.precompile [--device N] [--jobs N] [--no-progress]
    python -m cunorm.precompile --list [--arch 90]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager

from . import _config, _device, _dispatch, _kernels


class NoGPUError(RuntimeError):
    """No usable CUDA GPU (or no CuPy): there is nothing to compile for."""


def kernel_names(arch: int) -> list[str]:
    """Every kernel instantiation the dispatcher can pick on compute capability ``arch``.

    Parameters
    ----------
    arch : int
        Compute capability as one number, e.g. 90 for sm_90 (H100, H200).

    Returns
    -------
    list of str
        Sorted C++ template instantiations (NVRTC name expressions).

    Examples
    --------
    >>> from cunorm.precompile import kernel_names
    >>> names = kernel_names(90)
    >>> len(names) == len(set(names))
    True
    >>> sorted({n.split("<")[0] for n in names})[:5]  # doctest: +NORMALIZE_WHITESPACE
    ['cunorm::attn_combine', 'cunorm::attn_simt', 'cunorm::attn_tc',
     'cunorm::attn_tc_cluster', 'cunorm::attn_wg']
    """
    return _dispatch.all_kernel_names(arch)


def default_jobs() -> int:
    """Default thread count: the number of CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def target_device(device: int = 0) -> _device.DeviceProps:
    """Properties of CUDA device ``device``.

    Raises
    ------
    NoGPUError
        CuPy is missing or cannot load, or no CUDA device is visible.
    ValueError
        ``device`` is not one of the visible devices.
    """
    cupy, why = _config.import_cupy()
    if cupy is None:
        raise NoGPUError(f"CuPy is {why}")
    count, why = _config.device_count(cupy)
    if count == 0:
        raise NoGPUError(str(why))
    if not 0 <= device < count:
        raise ValueError(f"device {device} does not exist: this machine has {count} CUDA "
                         f"device{'s' if count != 1 else ''} (0..{count - 1})")
    return _device.device_props(device)


@contextmanager
def _progress(total: int, desc: str, enabled: bool) -> Iterator[Callable[[], None]]:
    """Yield ``step()``, called once per finished kernel: a tqdm bar if tqdm is installed,
    else a counter line on stderr (redrawn in place on a terminal, every 10% otherwise)."""
    if not enabled:
        yield lambda: None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        with tqdm(total=total, desc=desc, unit="kernel", file=sys.stderr) as bar:
            yield lambda: bar.update(1)
        return
    tty = sys.stderr.isatty()
    done = 0
    every = max(1, total // 10)

    def step() -> None:
        nonlocal done
        done += 1
        if tty:
            print(f"\r{desc}: {done}/{total}", end="", file=sys.stderr, flush=True)
        elif done % every == 0 or done == total:
            print(f"{desc}: {done}/{total}", file=sys.stderr, flush=True)

    try:
        yield step
    finally:
        if tty and done:
            print(file=sys.stderr)


def _cached_binaries() -> set[str]:
    """Names of the compiled binaries in CuPy's kernel cache folder."""
    folder, _ = _config.cache_dir()
    try:
        return {f for f in os.listdir(folder) if f.endswith(".cubin")}
    except OSError:
        return set()


def precompile(device: int = 0, jobs: int | None = None, progress: bool = True) -> int:
    """Compile (or load from CuPy's cache) every kernel the dispatcher can pick on a GPU.

    Parameters
    ----------
    device : int, default 0
        CUDA device ordinal; kernels are compiled for its compute capability.
    jobs : int, optional
        Threads compiling at once (default: the number of usable CPUs; 1 compiles in the
        calling thread).
    progress : bool, default True
        Show a progress bar (tqdm if installed, else a counter line) on stderr.

    Returns
    -------
    int
        Number of kernel instantiations now compiled and loaded.

    Raises
    ------
    NoGPUError
        No CuPy or no CUDA device.
    RuntimeError
        Some kernels failed to compile (all others are still compiled; the message names
        the failures).

    Examples
    --------
    >>> from cunorm.precompile import precompile
    >>> precompile(device=0, jobs=8)  # doctest: +SKIP
    1434
    """
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"precompile(): jobs must be at least 1, got {jobs}")
    props = target_device(device)
    names = kernel_names(props.arch)
    failures: list[tuple[str, BaseException]] = []
    lock = threading.Lock()

    def build(name: str) -> None:
        try:
            _kernels.get_kernel(device, props.arch, _dispatch.kernel_file(name), name,
                                smem_optin=props.smem_per_block_optin)
        except Exception as err:  # a compile error: keep going, report them all at the end
            with lock:
                failures.append((name, err))

    desc = f"compiling for sm_{props.arch}"
    with _progress(len(names), desc, progress) as step:
        if jobs == 1:
            for name in names:
                build(name)
                step()
        else:
            with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="cunorm-nvrtc") as ex:
                futures = [ex.submit(build, name) for name in names]
                try:
                    for fut in as_completed(futures):
                        fut.result()
                        step()
                except BaseException:  # Ctrl-C: drop what has not started, then re-raise
                    ex.shutdown(wait=False, cancel_futures=True)
                    raise
    if failures:
        shown = "\n".join(f"  {name}: {_config.first_line(err)}" for name, err in failures[:5])
        more = f"\n  ... and {len(failures) - 5} more" if len(failures) > 5 else ""
        raise RuntimeError(f"{len(failures)} of {len(names)} kernels failed to compile for "
                           f"sm_{props.arch}:\n{shown}{more}")
    return len(names)


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser of ``python -m cunorm.precompile``."""
    p = argparse.ArgumentParser(
        prog="python -m cunorm.precompile",
        description="Compile every kernel instantiation cunorm's dispatcher can pick for this\n"
        "GPU, so that no call pays the compile time. The binaries go to CuPy's kernel\n"
        "cache (CUPY_CACHE_DIR, default ~/.cupy/kernel_cache), which every later process\n"
        "reads.",
        epilog="examples:\n"
        "  python -m cunorm.precompile                  all kernels for GPU 0\n"
        "  python -m cunorm.precompile --device 1 -j 8  GPU 1, 8 compiler threads\n"
        "  python -m cunorm.precompile --list --arch 90 names for sm_90 (no GPU needed)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", type=int, default=0, metavar="N",
                   help="CUDA device ordinal to compile for (default: 0)")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="compiler threads (default: the number of usable CPUs)")
    p.add_argument("--list", action="store_true",
                   help="print the kernel names, one per line, and compile nothing")
    p.add_argument("--arch", type=int, default=None, metavar="CC",
                   help="with --list: compute capability as one number (80, 90, ...) instead "
                   "of the device's; no GPU needed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 no GPU or failures, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.arch is not None and not args.list:
        parser.error("--arch only applies with --list (kernels are compiled for the device's "
                     "own architecture)")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    try:
        if args.list:
            arch = args.arch if args.arch is not None else target_device(args.device).arch
            for name in kernel_names(arch):
                print(name)
            return 0
        props = target_device(args.device)
        jobs = default_jobs() if args.jobs is None else args.jobs
        before = _cached_binaries()
        start = time.perf_counter()
        count = precompile(args.device, jobs, progress=not args.no_progress)
        seconds = time.perf_counter() - start
    except NoGPUError as err:
        print(f"cunorm.precompile: no CUDA GPU available: {err}.\nKernels are compiled for a "
              "local GPU; `python -m cunorm.precompile --list --arch 90` lists them without "
              "one, and `python -m cunorm` shows what was found.", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as err:
        print(f"cunorm.precompile: {err}", file=sys.stderr)
        return 1
    folder, _ = _config.cache_dir()
    new = min(count, len(_cached_binaries() - before))
    print(f"{count} kernels ready for device {args.device} ({props.name}, sm_{props.arch}) in "
          f"{seconds:.1f} s with {jobs} thread{'s' if jobs != 1 else ''}: {new} compiled, "
          f"{count - new} already in CuPy's kernel cache ({folder})")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
