"""Compile every kernel instantiation the dispatcher can emit with nvcc, for sm_80 and sm_90.

Each instantiation named by :func:`cunorm._dispatch.all_kernel_names` is forced into existence
by taking its address in a host array, the sources are compiled in a few chunks in parallel
with ``-Xptxas -v``, and ptxas's report is checked: every instantiation compiled, none uses a
stack frame or spills registers to local memory, and no warpgroup MMA is serialized.
Arch-specific sources (``_kernels.ARCH_SPECIFIC_SOURCES``) build for sm_90a on sm_90.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cunorm import _dispatch, _kernels

NVCC = shutil.which("nvcc")

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (install the CUDA toolkit)"),
]

N_CHUNKS = 4
CHUNK_TIMEOUT_S = 1800

_ENTRY = re.compile(r"Compiling entry function '(\S+)' for 'sm_(\d+a?)'")
_PROPS = re.compile(
    r"Function properties for (\S+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
    r"(\d+) bytes spill loads"
)

# Static shared memory of a function (the "Used ..." line after its properties).
_STATIC_SMEM = re.compile(
    r"Function properties for (\S+)\s*\n[^\n]*\n[^\n]*?Used \d+ registers[^\n]*?(\d+) bytes smem"
)


def nvcc_options(arch: int, op_file: str = "") -> list[str]:
    """``_kernels.compile_options`` (NVRTC spelling) translated for nvcc. An arch-specific
    target takes the ``-gencode`` form: nvcc 13.0's ``-arch=sm_90a`` shorthand also runs a
    plain sm_90 pass, which rejects wgmma."""
    out = []
    for opt in _kernels.compile_options(arch, op_file):
        if opt.startswith("--gpu-architecture="):
            target = opt.split("=", 1)[1]
            if target.endswith("a"):
                out.append(f"-gencode=arch=compute_{target[3:]},code={target}")
            else:
                out.append("-arch=" + target)
        elif opt.startswith("--std="):
            out.append("-std=" + opt.split("=", 1)[1])
        else:
            out.append(opt)
    return out


def instantiation_source(op_file: str, names: list[str]) -> str:
    """``op_file`` (headers inlined) plus a host array taking the address of each name."""
    refs = ",\n".join(f"    (void*)&{name}" for name in names)
    return f"{_kernels.kernel_source(op_file)}\nvoid* cunorm_instances[] = {{\n{refs}\n}};\n"


def demangle(symbols: list[str]) -> dict[str, str]:
    """Mangled -> demangled names (identity where c++filt is unavailable)."""
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if tool is None or not symbols:
        return {s: s for s in symbols}
    res = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True)
    lines = res.stdout.splitlines()
    if res.returncode != 0 or len(lines) != len(symbols):
        return {s: s for s in symbols}
    return dict(zip(symbols, lines, strict=True))


def parse_ptxas(log: str) -> tuple[list[tuple[str, str]], dict[str, tuple[int, int, int]]]:
    """(entry functions with their sm, {function: (stack, spill stores, spill loads)})."""
    entries = _ENTRY.findall(log)
    props = {m[0]: (int(m[1]), int(m[2]), int(m[3])) for m in _PROPS.findall(log)}
    return entries, props


def static_smem(log: str) -> dict[str, int]:
    """{function: static shared memory bytes} from a ptxas -v log."""
    return {m[0]: int(m[1]) for m in _STATIC_SMEM.findall(log)}


def compile_chunk(path: Path, arch: int, op_file: str) -> subprocess.CompletedProcess:
    cmd = [NVCC, *nvcc_options(arch, op_file), "-c", "-Xptxas", "-v", "-o",
           str(path.with_suffix(".o")), str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CHUNK_TIMEOUT_S)


def test_nvcc_options_translation() -> None:
    assert nvcc_options(80) == ["-std=c++17", "-arch=sm_80"]
    assert nvcc_options(90) == ["-std=c++17", "-arch=sm_90", "-DCUNORM_SM90"]
    assert nvcc_options(90, "attention.cu") == [
        "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-DCUNORM_SM90", "-DCUNORM_SM90A"]
    assert nvcc_options(80, "attention.cu") == ["-std=c++17", "-arch=sm_80"]


def test_parse_ptxas_report() -> None:
    log = (
        "ptxas info    : Compiling entry function '_ZN6cunorm1aEv' for 'sm_90'\n"
        "ptxas info    : Function properties for _ZN6cunorm1aEv\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 29 registers, used 0 barriers\n"
        "ptxas info    : Compiling entry function '_ZN6cunorm1bEv' for 'sm_90'\n"
        "ptxas info    : Function properties for _ZN6cunorm1bEv\n"
        "    1600 bytes stack frame, 3776 bytes spill stores, 3376 bytes spill loads\n"
        "ptxas info    : Used 64 registers, used 1 barriers, 1008 bytes smem, 400 bytes cmem[0]\n"
    )
    entries, props = parse_ptxas(log)
    assert entries == [("_ZN6cunorm1aEv", "90"), ("_ZN6cunorm1bEv", "90")]
    assert props == {"_ZN6cunorm1aEv": (0, 0, 0), "_ZN6cunorm1bEv": (1600, 3776, 3376)}
    assert static_smem(log) == {"_ZN6cunorm1bEv": 1008}
    assert demangle(["_ZN6cunorm1aEv"])["_ZN6cunorm1aEv"] in ("cunorm::a()", "_ZN6cunorm1aEv")


@pytest.mark.parametrize("arch", [80, 90])
def test_every_instantiation_compiles_without_spills(arch: int, tmp_path: Path) -> None:
    names = _dispatch.all_kernel_names(arch)
    assert names, "all_kernel_names() is empty"
    assert len(set(names)) == len(names)
    by_file: dict[str, list[str]] = {}
    for name in names:
        by_file.setdefault(_dispatch.kernel_file(name), []).append(name)
    paths = []
    for op_file, file_names in sorted(by_file.items()):
        n_chunks = min(N_CHUNKS, len(file_names))
        for i in range(n_chunks):
            path = tmp_path / f"{op_file[:-3]}_sm{arch}_{i}.cu"
            path.write_text(instantiation_source(op_file, file_names[i::n_chunks]))
            paths.append((path, op_file))

    workers = max(1, min(len(paths), os.cpu_count() or 1, N_CHUNKS))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda p: compile_chunk(p[0], arch, p[1]), paths))

    logs = []
    for (path, _), res in zip(paths, results, strict=True):
        log = res.stdout + res.stderr
        assert res.returncode == 0, f"nvcc failed on {path.name} (sm_{arch}):\n{log[-6000:]}"
        logs.append(log)
    log = "\n".join(logs)

    entries, props = parse_ptxas(log)
    assert {a for _, a in entries} <= {str(arch), f"{arch}a"}
    serialized = [line for line in log.splitlines() if "instructions are serialized" in line]
    assert not serialized, f"sm_{arch}: ptxas serializes wgmma:\n" + "\n".join(serialized[:5])
    entry_names = [e for e, _ in entries]
    assert len(entry_names) == len(names), (
        f"sm_{arch}: ptxas compiled {len(entry_names)} entry functions, expected {len(names)}"
    )
    missing = [e for e in entry_names if e not in props]
    assert not missing, f"no ptxas properties reported for {missing[:5]}"
    assert len(props) == len(names), (
        f"sm_{arch}: {len(props)} functions reported, expected {len(names)} (a non-inlined "
        f"device function?): {sorted(set(props) - set(entry_names))[:5]}"
    )

    # Kernels whose dynamic shared memory is planned as the opt-in limit less
    # STATIC_SMEM_RESERVE must not use more static shared memory than that reserve.
    smem = static_smem(log)  # ptxas omits "bytes smem" where there is none
    pretty = demangle(sorted(smem))
    planned = {pretty[sym]: b for sym, b in smem.items()
               if "_smem" in pretty[sym] or "softmax_strided" in pretty[sym]}
    over = {name: b for name, b in planned.items() if b > _dispatch.STATIC_SMEM_RESERVE}
    assert not over, f"static shared memory above STATIC_SMEM_RESERVE: {over}"
    # Their dynamic shared memory starts on a 128-byte boundary (common.cuh
    # CUNORM_DYNAMIC_SMEM), so ptxas counts the static part up to it.
    misaligned = {name: b for name, b in planned.items() if b % 128}
    assert not misaligned, f"dynamic shared memory not 128-byte aligned: {misaligned}"

    bad = {sym: v for sym, v in props.items() if any(v)}
    if bad:
        pretty = demangle(sorted(bad))
        lines = [f"  {pretty[s]}: stack {v[0]} B, spill stores {v[1]} B, spill loads {v[2]} B"
                 for s, v in sorted(bad.items())]
        pytest.fail(f"sm_{arch}: {len(bad)} of {len(names)} instantiations use local memory:\n"
                    + "\n".join(lines))
