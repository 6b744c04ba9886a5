"""Sphinx configuration: Markdown pages (MyST), notebooks (myst-nb), API from docstrings."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

project = "nbresponses"
author = "The nbresponses team"
copyright = "2026, the nbresponses team"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
myst_enable_extensions = ["colon_fence", "deflist"]
html_theme = "furo"
html_title = "nbresponses"
html_static_path = ["_static"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports: list[str] = []

# Notebooks live in ../notebooks (outputs stripped in git). They are copied in at build time and
# executed by myst-nb unless NBRESPONSES_DOCS_EXECUTE=off (the notebook tests execute them too).
nb_execution_mode = os.environ.get("NBRESPONSES_DOCS_EXECUTE", "auto")
nb_execution_timeout = 600
nb_execution_raise_on_error = True
# Widgets need a live kernel (or saved widget state) to render; every view also carries a static
# HTML rendering of its final state, so pages show that instead of an empty widget.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
NOTEBOOKS_SRC = ROOT / "notebooks"
NOTEBOOKS_DST = DOCS / "notebooks"


def _copy_notebooks(app: object) -> None:
    if NOTEBOOKS_DST.exists():
        shutil.rmtree(NOTEBOOKS_DST)
    NOTEBOOKS_DST.mkdir()
    for notebook in sorted(NOTEBOOKS_SRC.glob("*.ipynb")):
        shutil.copy2(notebook, NOTEBOOKS_DST / notebook.name)


def setup(app: object) -> None:
    app.connect("builder-inited", _copy_notebooks)  # type: ignore[attr-defined]
