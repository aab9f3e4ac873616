"""Sphinx configuration for dasktune's documentation.

The API reference is generated at build time from ``docs/api_modules.txt`` (the one list of
public modules) by :mod:`apigen`: a page per module, one entry per public name, so a new
module needs one line in that file and nothing else. Guides are Markdown (MyST).
"""

from __future__ import annotations

import os
import pathlib
import sys

# Keras 3 needs a backend to import; CI installs torch, not TensorFlow (the keras
# integration's API page would otherwise be left out).
os.environ.setdefault("KERAS_BACKEND", "torch")

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))
sys.path.insert(0, str(DOCS.parent))  # the checkout's dasktune, not an installed one

import apigen  # noqa: E402

import dasktune  # noqa: E402

project = "dasktune"
author = "dasktune developers"
copyright = "2026, dasktune developers"
release = dasktune.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
    "sphinx_click",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_heading_anchors = 3
exclude_patterns = ["_build", "README.md"]
html_theme = "furo"
html_title = f"dasktune {release}"
html_static_path = ["_static"]

autodoc_default_options: dict[str, bool] = {}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Optional libraries a module imports lazily are not needed to document it.
autodoc_mock_imports: list[str] = []


def setup(app):  # noqa: D103 - Sphinx's hook
    app.connect("builder-inited", lambda app: apigen.write_api_pages(DOCS))
