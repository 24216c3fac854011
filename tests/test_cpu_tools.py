"""The profiling tools that edit kernel sources still find their places in them."""

from __future__ import annotations

import difflib
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


def _function_text(src: str, signature: str) -> str:
    """From ``signature`` to the first line that closes a function body (``}`` alone)."""
    start = src.index(signature)
    return src[start:src.index("\n}\n", start)]


def test_decode_timeline_stamps_the_current_sources(tmp_path: Path) -> None:
    """decode_timeline.instrument copies the package and kernel sources and adds its
    globaltimer stamps to attention.cu: 4 inside attn_tc_rows and 7 inside attn_combine,
    each kernel's record written once, and nothing else changed (every original line kept,
    stamps only added as new lines or at the end of a line). A kernel edit that moves a
    marker fails here, not on the GPU machine."""
    timeline = _tool("decode_timeline")
    timeline.instrument(tmp_path)
    original = (TOOLS.parent / "cuda_src" / "attention.cu").read_text()
    stamped = (tmp_path / "cuda_src" / "attention.cu").read_text()
    assert (tmp_path / "cunorm" / "_kernels.py").exists()
    assert "cn_t" not in original and "cn_c" not in original

    rows = _function_text(stamped, "__device__ __forceinline__ void attn_tc_rows(")
    merge = _function_text(stamped, "attn_combine(const typename AttnWork<T>::type* o_part,")
    assert rows.count('"=l"(cn_t)') == stamped.count('"=l"(cn_t)') == 4
    assert merge.count('"=l"(cn_c)') == stamped.count('"=l"(cn_c)') == 7
    assert rows.count("(unsigned long long*)mask + 5 *") == 1
    assert merge.count("(unsigned long long*)lse + 8 + 8 * blockIdx.x") == 1

    old, new = original.splitlines(), stamped.splitlines()
    changes = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in changes:
        if tag == "equal":
            continue
        assert tag in ("insert", "replace"), (tag, old[i1:i2])
        added = new[j1:j2]
        if tag == "replace":  # a stamp appended to each replaced line, the line kept whole
            assert len(added) == i2 - i1, (old[i1:i2], added)
            assert all(n.startswith(o) and "cn_" in n[len(o):]
                       for o, n in zip(old[i1:i2], added, strict=True))
        else:
            assert all("cn_" in line or line.strip() in ("", "__syncthreads();") for line in added)
