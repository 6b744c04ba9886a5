"""The public face, each check in a fresh interpreter (as a new kernel is): every name of
``nbr.__all__`` resolves, the documented paths work whatever was imported first, the old
names warn with their new ones, and ``show(..., record=True)`` keeps the response on every
import path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    done = _run(
        """
        import nbresponses as nbr
        missing = [n for n in nbr.__all__ if getattr(nbr, n, None) is None]
        assert not missing, missing
        assert sorted(dir(nbr)) == sorted(nbr.__all__)
        assert not [n for n in nbr.__all__ if n.endswith("_heatmap") or n == "compare"]
        print(len(nbr.__all__))
        """
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 30


@pytest.mark.parametrize(
    "path",
    [
        "nbr.frames.plot_lens",
        "nbr.frames.lens_frame",
        "nbr.frames.plot_logprobs",
        "nbr.frames.compare_scorings",
        "nbr.view.show",
        "nbr.plot_lens",
    ],
)
def test_documented_paths_work_in_a_fresh_interpreter(path: str) -> None:
    done = _run(f"import nbresponses as nbr\nassert callable({path})")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("nbr.compare", "compare_scorings"),
        ("nbr.logprobs_heatmap", "plot_logprobs"),
        ("nbr.frames.lens_heatmap", "plot_lens"),
    ],
)
def test_old_names_warn_with_their_new_ones(old: str, new: str) -> None:
    done = _run(
        f"""
        import nbresponses as nbr
        try:
            {old}([])
        except DeprecationWarning as warning:
            print(warning)
        """
    )
    assert done.returncode == 0, done.stderr
    assert new in done.stdout


SHOW_AND_RECORD = """
import sys, time, warnings
warnings.simplefilter("error")
from openai.types.responses import Response
{first_import}
response = Response.model_validate({{
    "id": "resp_fresh1", "object": "response", "created_at": time.time(), "model": "m",
    "status": "completed", "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
    "output": [{{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{{"type": "output_text", "text": "Hi.", "annotations": []}}]}}],
}})
show(response, record=True)
import nbresponses as nbr
print(list(nbr.history()["id"]))
"""


@pytest.mark.parametrize(
    "first_import",
    [
        "from nbresponses.view import show",
        "from nbresponses.view.widget import show",
        "import nbresponses as nbr; show = nbr.show",
    ],
)
def test_show_records_on_every_import_path(first_import: str, tmp_path: Path) -> None:
    store = tmp_path / "history.sqlite3"
    done = _run(SHOW_AND_RECORD.format(first_import=first_import), NBRESPONSES_STORE=str(store))
    assert done.returncode == 0, done.stderr  # no warning that the engine extra is missing
    assert "['resp_fresh1']" in done.stdout
