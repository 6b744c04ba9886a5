"""The notebooks: committed without outputs, and each one runs top to bottom.

Execution uses a kernel running this very interpreter (the venv's), against the persistent test
model cache, offline. The docs build does not execute them again (see tests/test_docs.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import ROOT, TEST_CACHE

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT = {"05-performance.ipynb": 240}  # per cell, seconds; the rest use the default
DEFAULT_TIMEOUT = 180
# what a notebook's text says its cells print (its printed outputs must contain it)
PRINTS = {"08-structured-outputs.ipynb": "'uniqueItems' cannot be enforced"}


def test_there_are_notebooks() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert len(names) >= 6, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path: Path) -> None:
    notebook = json.loads(path.read_text())
    dirty = [
        i
        for i, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; strip them"
    assert "widgets" not in notebook.get("metadata", {}), f"{path.name}: saved widget state"


@pytest.fixture(scope="session")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A kernel spec for this interpreter, in a private folder put on JUPYTER_PATH."""
    from ipykernel.kernelspec import install

    prefix = tmp_path_factory.mktemp("kernel")
    install(kernel_name="nbresponses-test", prefix=str(prefix))
    spec = prefix / "share" / "jupyter" / "kernels" / "nbresponses-test" / "kernel.json"
    data = json.loads(spec.read_text())
    data["argv"][0] = sys.executable
    spec.write_text(json.dumps(data))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")]
    )
    return "nbresponses-test"


@pytest.mark.notebooks
@pytest.mark.integration
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, kernel_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NBRESPONSES_CACHE_DIR", str(TEST_CACHE))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=kernel_name,
        timeout=TIMEOUT.get(path.name, DEFAULT_TIMEOUT),
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    elapsed = time.perf_counter() - start
    print(f"{path.name}: {elapsed:.1f} s")
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert not errors
    # Every code cell ran, and every notebook drew or displayed something.
    assert all(c.execution_count for c in notebook.cells if c.cell_type == "code")
    displayed = {
        mime
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        for mime in output.get("data", {})
    }
    assert displayed & {"image/png", "application/vnd.jupyter.widget-view+json", "text/html"}
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream"
    )
    assert PRINTS.get(path.name, "") in printed
