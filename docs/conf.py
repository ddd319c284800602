"""Sphinx configuration of the zarr_fused documentation.

Build (warnings are errors):

    .venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html

Pages are Markdown (MyST); the API reference comes from the numpydoc
docstrings through autodoc + napoleon; zarr_fused is imported from this
checkout, with its dependencies (zarr, numpy, numcodecs) from the
environment. Nothing is fetched from the network at build time (no
intersphinx), and the performance figure is a committed file drawn by
``docs/plot_performance.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# autodoc imports zarr_fused from this checkout (the compiled extensions are
# optional for that: without them the package imports and falls back)
sys.path.insert(0, str(ROOT))

# -- project ------------------------------------------------------------------

project = "zarr_fused"
author = "the zarr_fused developers"
copyright = "2026, the zarr_fused developers"
# the version is read from the source, not from an installed copy
release = re.search(
    r'__version__\s*=\s*"([^"]+)"', (ROOT / "zarr_fused" / "_version.py").read_text()
).group(1)
version = release

# -- general ------------------------------------------------------------------

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_data", "Thumbs.db", ".DS_Store"]
# numpydoc convention: `name` in a docstring is a cross-reference
default_role = "py:obj"

myst_enable_extensions = ["colon_fence", "deflist"]

# -- API reference --------------------------------------------------------------

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

# -- HTML ---------------------------------------------------------------------

html_theme = "furo"
html_title = f"zarr_fused {release}"
html_show_sourcelink = False
