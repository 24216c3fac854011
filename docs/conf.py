"""Sphinx configuration for the cunorm docs.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (``-b doctest`` runs the
examples). Needs ``pip install -e '.[docs]'``; reads only the repository (no network).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# The checkout's cunorm, even when it is not installed (CUNORM_DOCS_REPO: docs/ is a copy).
sys.path.insert(0, os.environ.get("CUNORM_DOCS_REPO", str(DOCS.parent)))
sys.path.insert(0, str(DOCS / "_ext"))

import cunorm  # noqa: E402  (after the path set-up; importing cunorm touches no GPU)

project = "cunorm"
author = "cunorm developers"
copyright = "cunorm developers"
version = release = cunorm.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "numpydoc",
    "myst_parser",
    "cunorm_docs",  # docs/_ext: benchmark tables, plots and --help pages, made at build time
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path = ["_templates"]

# API pages: one per public name, written by autosummary under _autosummary/ (git-ignored).
autosummary_generate = True
autosummary_imported_members = False
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
# cunorm.torch registers torch operators on import; its pages need only its docstrings, so the
# docs build (CI has no torch) imports it against a stand-in.
autodoc_mock_imports = ["torch"]
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()

# Examples run with `sphinx-build -b doctest`; NumPy inputs only, so no GPU is needed.
doctest_global_setup = "import numpy as np\nimport cunorm"

myst_heading_anchors = 3

html_theme = "pydata_sphinx_theme"
html_title = f"cunorm {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
