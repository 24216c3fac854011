"""The built wheel ships the kernel sources and the installed package finds them.

Builds the wheel from a clean copy of the source tree (so a stale ``build/`` folder in the
checkout can neither leak into the wheel nor be written by the test), checks its file list, and
imports the installed copy from outside the repository. No GPU needed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

KERNEL_FILES = ("cunorm/cuda_src/common.cuh", "cunorm/cuda_src/rows.cuh",
                "cunorm/cuda_src/softmax.cu", "cunorm/cuda_src/norm.cu")

# Never copied into the build tree: VCS data, caches, earlier build outputs.
_SKIP_NAMES = {
    ".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis",
    "build", "dist", ".eggs", ".whl", ".gl", "_build",
}


def _ignore(folder: str, names: list[str]) -> set[str]:
    skipped = set()
    for name in names:
        path = Path(folder, name)
        if (name in _SKIP_NAMES or name.endswith(".egg-info")
                or (path.is_dir() and (path / "pyvenv.cfg").exists())):  # any virtualenv
            skipped.add(name)
    return skipped


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed (pip install -e '.[test]')")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_ignore)
    dist = tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    log = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"wheel build failed:\n{log}"
    wheels = list(dist.glob("cunorm-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {dist}, found {wheels}"
    return wheels[0]


def test_wheel_contains_kernel_sources(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("cunorm/__init__.py", "cunorm/_kernels.py", *KERNEL_FILES):
        assert required in names, f"{required} missing from {wheel.name}: {sorted(names)}"
    assert not any(n.startswith("tests/") for n in names), "tests/ must not ship in the wheel"
    assert not any(n.startswith("cuda_src/") for n in names), "cuda_src/ ships as cunorm/cuda_src"


def test_installed_wheel_finds_its_sources(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"

    # numpy comes from this interpreter's site-packages; cunorm must come from `target`.
    script = (
        "import cunorm, cunorm._kernels as k, numpy as np\n"
        "d = k.source_dir()\n"
        "print(cunorm.__file__)\n"
        "print(d)\n"
        "assert (d / 'common.cuh').is_file() and (d / 'softmax.cu').is_file(), d\n"
        "assert 'softmax_' in k.kernel_source('softmax.cu')\n"
        "assert 'norm_warp' in k.kernel_source('norm.cu')\n"
        "y = cunorm.softmax(np.array([[1.0, 2.0, 3.0]]))\n"
        "assert isinstance(y, np.ndarray) and abs(y.sum() - 1) < 1e-12, y\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"import from the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    module_file, src_dir = (Path(line) for line in proc.stdout.splitlines()[-2:])
    assert module_file.resolve().is_relative_to(target.resolve()), module_file
    assert src_dir.resolve().is_relative_to(target.resolve()), src_dir
    assert src_dir.resolve() == (target / "cunorm" / "cuda_src").resolve(), src_dir
