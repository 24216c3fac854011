"""The docs build with warnings as errors, their examples run, and so do the docstring examples.

The Sphinx builds need the ``docs`` extra (``pip install -e '.[docs]'``; CI installs it and
fails if these tests skip). They build a copy of ``docs/`` in a temporary folder, so nothing is
written into the checkout, and need no network. The docstring examples of every cunorm module
that imports without a GPU run with the standard library's doctest (NumPy inputs only).
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cunorm

REPO = Path(cunorm.__file__).resolve().parent.parent
DOCS = REPO / "docs"
DOCS_PACKAGES = ("sphinx", "pydata_sphinx_theme", "numpydoc", "myst_parser", "matplotlib")

pytestmark = pytest.mark.docs


def _needs_docs_extra() -> None:
    if not (DOCS / "conf.py").is_file():
        pytest.skip("not a source checkout: docs/conf.py is missing")
    missing = [m for m in DOCS_PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed (missing {', '.join(missing)}): "
                    "pip install -e '.[docs]'")


def _copy_docs(dst: Path) -> Path:
    shutil.copytree(DOCS, dst, ignore=shutil.ignore_patterns(
        "_build", "_generated", "_autosummary", "__pycache__"))
    return dst


def sphinx(builder: str, src: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    """``sphinx-build -W --keep-going -b builder`` of ``src`` documenting this checkout."""
    full = dict(os.environ, CUNORM_DOCS_REPO=str(REPO), PYTHONDONTWRITEBYTECODE="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
         "-d", str(out / ".doctrees"), str(src), str(out / builder)],
        capture_output=True, text=True, env=full, timeout=600,
    )


@pytest.fixture(scope="module")
def docs_copy(tmp_path_factory) -> Path:
    _needs_docs_extra()
    return _copy_docs(tmp_path_factory.mktemp("docs") / "docs")


@pytest.fixture(scope="module")
def html(docs_copy: Path) -> Path:
    out = docs_copy.parent / "out"
    res = sphinx("html", docs_copy, out)
    assert res.returncode == 0, f"sphinx-build -W -b html failed:\n{res.stdout}\n{res.stderr}"
    return out / "html"


def test_html_builds_without_warnings(html: Path) -> None:
    for page in ("index", "quickstart", "interop", "dispatch", "numerics", "benchmarks",
                 "troubleshooting", "api", "_generated/benchmark-results"):
        assert (html / f"{page}.html").is_file(), page


def test_api_reference_covers_public_names(html: Path) -> None:
    pages = {p.stem for p in (html / "_autosummary").glob("*.html")}
    for name in cunorm.__all__:
        if name != "__version__":
            assert f"cunorm.{name}" in pages, name
    assert {"cunorm.precompile", "cunorm.precompile.precompile"} <= pages
    softmax = (html / "_autosummary" / "cunorm.softmax.html").read_text()
    assert "Parameters" in softmax and "dtype" in softmax


def test_dispatch_page_has_measured_thresholds(html: Path) -> None:
    from cunorm import _dispatch

    page = (html / "dispatch.html").read_text()
    assert str(_dispatch.WARP_MAX_COLS[2]) in page and str(_dispatch.SMEM_MAX_COLS[4]) in page
    if list((REPO / "benchmarks" / "results").glob("thresholds-*.md")):
        assert (html / "_images" / "thresholds.png").is_file()
        assert "cunorm picks" in page


def test_command_line_help_is_documented(html: Path) -> None:
    page = (html / "api.html").read_text()
    assert "python -m cunorm.precompile" in page and "--list" in page


def test_doctest_builder(docs_copy: Path) -> None:
    res = sphinx("doctest", docs_copy, docs_copy.parent / "out-doctest")
    assert res.returncode == 0, f"sphinx-build -b doctest failed:\n{res.stdout}\n{res.stderr}"


def test_builds_without_benchmark_results(tmp_path: Path) -> None:
    _needs_docs_extra()
    src = _copy_docs(tmp_path / "docs")
    empty = tmp_path / "no-results"
    empty.mkdir()
    res = sphinx("html", src, tmp_path / "out", CUNORM_DOCS_RESULTS=str(empty))
    assert res.returncode == 0, f"build without results failed:\n{res.stdout}\n{res.stderr}"
    page = (tmp_path / "out" / "html" / "_generated" / "benchmark-results.html").read_text()
    assert "No benchmark reports" in page


# --- docstring examples -------------------------------------------------------------------
def _modules_with_examples() -> list[str]:
    """cunorm modules whose source holds a ``>>>`` example (found without importing them)."""
    names = []
    for info in pkgutil.walk_packages(cunorm.__path__, "cunorm."):
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and ">>>" in Path(spec.origin).read_text():
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("module", _modules_with_examples())
def test_docstring_examples(module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        if (err.name or "").split(".")[0] == "cunorm":
            raise
        pytest.skip(f"{module} needs {err.name}, which is not installed")
    tests = [t for t in doctest.DocTestFinder().find(mod, module) if t.examples]
    assert tests, f"{module} has '>>>' in its source but no docstring examples were found"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
