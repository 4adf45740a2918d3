"""Sphinx configuration for hexad's documentation (``make docs``; offline, warnings are errors)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
sys.path.insert(0, str(ROOT))
# The tutorials run on the CPU with a few simulated devices, like the test suite.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

project = "hexad"
author = "the hexad developers"
copyright = "the hexad developers"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

# No intersphinx: the inventories of jax, optax, ott-jax, orbax and flax cannot be fetched
# offline, and names from them are written as literals instead of cross-references.
autosummary_generate = True
templates_path = ["_templates"]
autosummary_imported_members = True
autosummary_ignore_module_all = False
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_custom_sections = [("Attributes", "params_style")]

# Notebooks are MyST markdown text files (readable diffs), executed at every build: no cache,
# so a tutorial that breaks fails the build.
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}
exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints", "README.md"]
suppress_warnings = ["mystnb.unknown_mime_type"]
nitpicky = False

html_theme = "furo"
html_title = "hexad"
