"""Compile chosen kernel instantiations with nvcc and summarize their SASS memory instructions.

Usage: ``python tools/sass_summary.py ARCH NAME...`` (needs nvcc and cuobjdump on PATH).
Prints, per kernel, the counts of global/shared/local load and store opcodes, so one can see
whether accesses are 16 bytes wide (``.128``) and that nothing goes to local memory.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cunorm._kernels import compile_options, kernel_source


def main() -> None:
    arch, names = int(sys.argv[1]), sys.argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        body = "\n".join(f"  (void*)&{n}," for n in names)
        table = f"\nvoid* cunorm_instances[] = {{\n{body}\n}};\n"
        src.write_text(kernel_source("softmax.cu") + table)
        opts = [o.replace("--gpu-architecture=", "-arch=") for o in compile_options(arch)]
        cubin = Path(tmp) / "k.cubin"
        subprocess.run(["nvcc", *opts, "-cubin", str(src), "-o", str(cubin)], check=True)
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True,
                              capture_output=True, text=True).stdout
    fn = None
    counts: dict[str, collections.Counter] = {}
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn = m.group(1)
            counts[fn] = collections.Counter()
        m = re.search(r"\b((?:LDG|STG|LDS|STS|LDL|STL)[.\w]*)", line)
        if m and fn:
            counts[fn][m.group(1)] += 1
    for fn, c in counts.items():
        print(fn[:90], dict(c.most_common(8)))


if __name__ == "__main__":
    main()
