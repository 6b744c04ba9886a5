"""The committed front-end bundle is what the pinned source builds to, and it ships."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.paths import ROOT

from nbresponses.view import ResponseView

JS = ROOT / "js"
STATIC = ROOT / "nbresponses" / "view" / "static"


def test_bundle_is_rebuilt_identically_from_source(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not (JS / "node_modules" / "esbuild").is_dir():
        pytest.skip("front-end dependencies missing: run `npm ci` in js/")
    subprocess.run([node, "build.mjs", "--outdir", str(tmp_path)], cwd=JS, check=True)
    for name in ("widget.js", "widget.css"):
        fresh, committed = (tmp_path / name).read_bytes(), (STATIC / name).read_bytes()
        assert fresh == committed, f"{name} is stale: run `npm run build` in js/ and commit it"


def test_dependencies_are_pinned_exactly() -> None:
    package = json.loads((JS / "package.json").read_text())
    pins = {**package["dependencies"], **package["devDependencies"]}
    assert {"marked", "dompurify", "esbuild"} <= pins.keys()
    assert all(v[0].isdigit() for v in pins.values()), pins
    lock = json.loads((JS / "package-lock.json").read_text())
    for name, version in pins.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version


def test_widget_loads_the_shipped_bundle() -> None:
    view = ResponseView([])
    assert view._esm == (STATIC / "widget.js").read_text()
    assert "nbr-root" in view._css and "--jp-ui-font-color1" in view._css
    assert "export{" in view._esm.replace(" ", "")  # an ES module with a default export


def test_bundle_is_not_ignored_so_the_wheel_ships_it() -> None:
    """hatch leaves git-ignored files out of the wheel; the bundle must stay tracked."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in ("widget.js", "widget.css"):
        path = STATIC / name
        ignored = subprocess.run([git, "check-ignore", "-q", str(path)], cwd=ROOT).returncode == 0
        assert not ignored, f"{path} is git-ignored and would be left out of the wheel"
