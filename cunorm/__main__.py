"""``python -m cunorm``: print what cunorm finds on this machine (:func:`cunorm.show_config`)."""

from __future__ import annotations

import argparse

from ._config import show_config


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser of ``python -m cunorm`` (only ``--help``)."""
    return argparse.ArgumentParser(
        prog="python -m cunorm",
        description="Print cunorm's configuration: versions of cunorm, NumPy, CuPy, CUDA and "
        "NVRTC, the GPUs, bfloat16 support, and the kernel cache and source folders.",
        epilog="See also: python -m cunorm.precompile (compile every kernel for this GPU "
        "ahead of time) and python -m cunorm.bench (benchmarks).",
    )


def main(argv: list[str] | None = None) -> int:
    """Print the configuration; returns the exit status."""
    build_parser().parse_args(argv)
    show_config()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
