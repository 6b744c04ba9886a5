"""The documentation site builds with Sphinx, warnings as errors.

The notebooks are not executed here (``NBRESPONSES_DOCS_EXECUTE=off``): tests/test_notebooks.py
runs them already, and this build checks the pages, the API reference (autodoc of the public
names) and every cross-reference in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT


@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("myst_nb")
    pytest.importorskip("furo")
    out = tmp_path / "html"
    env = {**os.environ, "NBRESPONSES_DOCS_EXECUTE": "off"}
    done = subprocess.run(
        [
            sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-b", "html",
            "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-5000:]
    assert "WARNING" not in log, log[-5000:]
    api = (out / "api.html").read_text()
    for name in (
        "nbresponses.Engine.load",
        "nbresponses.prepare_model",
        "nbresponses.list_models",
        "nbresponses.show",
        "nbresponses.logprobs_frame",
        "nbresponses.function_tool",
        "nbresponses.service.client.AsyncResponses.create",
    ):
        assert f'id="{name}"' in api, f"{name} missing from the API reference"
    pages = {p.stem for p in (out / "notebooks").glob("*.html")}
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert notebooks and notebooks <= pages, notebooks - pages
