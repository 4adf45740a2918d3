"""Sphinx configuration for hexad's documentation (``make docs``; offline, warnings are errors)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))
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
    "sphinx-mathjax-offline",  # MathJax from the build itself, not a CDN
    "sphinx.ext.viewcode",
    "hexad_api",  # docs/_ext: public names, fields once, coverage of every __all__
    "sphinxcontrib.bibtex",
]

# The API reference (docs/api): one page per subpackage with autosummary tables, and one page
# per public object generated from docs/_templates/autosummary. Types from the signature go
# into the documented arguments only; a class's fields are listed once, by its docstring's
# Attributes section (napoleon writes one attribute entry per field, docs/_ext adds its type).
autosummary_generate = True
templates_path = ["_templates"]
autosummary_imported_members = True
autosummary_ignore_module_all = False
autodoc_default_options: dict[str, object] = {}  # the templates ask for members
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = False
napoleon_attr_annotations = True

# Every reference must resolve. No intersphinx: the inventories of Python, NumPy, jax, optax,
# ott-jax, orbax and flax cannot be fetched offline, so names from those libraries (mostly
# from type annotations) are left unlinked, and only those: hexad's own names all resolve.
nitpicky = True
nitpick_ignore_regex = [
    # the standard library, outside builtins and typing (which Sphinx resolves itself)
    (r"py:.*", r"(collections\.abc|pathlib|os|subprocess|threading|enum|types)\..*"),
    # the array and ML libraries hexad builds on
    (r"py:.*", r"(numpy|jax|jaxlib|flax|optax|ott|orbax|chex)(\..*)?"),
]
nitpick_ignore = [
    # A private type in a public signature (StagingPool.stage returns one, write_rank_dir takes
    # one): it has no page until hexad.cachex exports it.
    ("py:class", "hexad.cachex._format.Snapshot"),
]

# Notebooks are MyST markdown text files (readable diffs), executed at every build: no cache,
# so a tutorial that breaks fails the build (`make docs`, CI). While writing one, set
# HEXAD_DOCS_EXECUTE=cache to re-run only the notebooks whose code changed.
nb_execution_mode = os.environ.get("HEXAD_DOCS_EXECUTE", "force")
if nb_execution_mode not in ("force", "cache"):
    raise ValueError(f"HEXAD_DOCS_EXECUTE: expected 'force' or 'cache', got {nb_execution_mode!r}")
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}
exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints", "README.md"]
suppress_warnings = ["mystnb.unknown_mime_type"]

html_theme = "furo"
html_title = "hexad"

# The bibliography: every paper the methods rest on, cited with {cite:p}`key` on the index, the
# tutorials and the reproduction pages, listed in full on references.md.
bibtex_bibfiles = ["references.bib"]
bibtex_default_style = "plain"
bibtex_reference_style = "author_year"

# Code cells wrap rather than hide the end of a long line behind a scroll bar.
html_static_path = ["_static"]
html_css_files = ["hexad.css"]


# Each tutorial page links to its notebook as .ipynb. myst-nb writes every notebook it reads
# (executed, with outputs, unless execution is off) to the build's jupyter_execute folder; the
# hook below copies it next to the page's HTML and puts a link under the page title. A missing
# notebook is a warning, so (with -W) a build never ships a dead link.
NOTEBOOK_DIRS = ("tutorials/",)


def _is_notebook_page(docname: str) -> bool:
    return docname.startswith(NOTEBOOK_DIRS) and not docname.endswith("/index")


def _add_download_link(app, doctree, docname):
    from docutils import nodes

    # the plain html builder only: its pages sit next to the copied notebooks
    if app.builder.name != "html" or not _is_notebook_page(docname):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    name = docname.rsplit("/", 1)[-1] + ".ipynb"
    link = nodes.reference("", "", nodes.literal(text=name), refuri=name)
    para = nodes.paragraph("", "", nodes.Text("Download this notebook: "), link)
    para["classes"].append("nb-download")
    title = next(iter(section.findall(nodes.title)), None)
    section.insert(section.index(title) + 1 if title is not None else 0, para)


def _copy_notebooks(app, exception):
    import shutil

    from sphinx.util import logging

    if exception is not None or app.builder.name != "html":
        return
    executed = Path(app.outdir).parent / "jupyter_execute"
    for docname in sorted(app.env.found_docs):
        if not _is_notebook_page(docname):
            continue
        src = executed / f"{docname}.ipynb"
        if not src.is_file():
            logging.getLogger(__name__).warning(
                "no notebook %s to link from %s", src.name, docname, type="hexad"
            )
            continue
        dest = Path(app.outdir) / f"{docname}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


# Reproduction pages are wide (tables and multi-panel plots): their stylesheet is added to
# those pages alone.
WIDE_DIRS = ("reproduction/",)


def _wide_pages(app, pagename, templatename, context, doctree):
    if pagename.startswith(WIDE_DIRS):
        app.add_css_file("report.css")


def setup(app):
    app.connect("html-page-context", _wide_pages)
    app.connect("doctree-resolved", _add_download_link)
    app.connect("build-finished", _copy_notebooks)
