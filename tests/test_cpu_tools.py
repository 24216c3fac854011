"""The profiling tools that edit kernel sources still find their places in them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _tool(name: str):
    path = TOOLS / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path} not present (not a source checkout)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_timeline_stamps_the_current_sources(tmp_path: Path) -> None:
    """decode_timeline.instrument copies the package and kernel sources and adds its
    globaltimer stamps to attention.cu: 4 in attn_tc_rows and 7 in attn_combine, each
    kernel's record written once. A kernel edit that moves a marker fails here, not on the
    GPU machine."""
    timeline = _tool("decode_timeline")
    timeline.instrument(tmp_path)
    original = (TOOLS.parent / "cuda_src" / "attention.cu").read_text()
    stamped = (tmp_path / "cuda_src" / "attention.cu").read_text()
    assert (tmp_path / "cunorm" / "_kernels.py").exists()
    assert original.count("%%globaltimer") == 0
    assert stamped.count('"=l"(cn_t)') == 4 and stamped.count('"=l"(cn_c)') == 7
    assert stamped.count("(unsigned long long*)mask + 5 *") == 1
    assert stamped.count("(unsigned long long*)lse + 8 + 8 * blockIdx.x") == 1
    # the stamps only add lines and text: every original line is still there, in order
    lines = iter(stamped.splitlines())
    assert all(any(line in s for s in lines) for line in original.splitlines())
