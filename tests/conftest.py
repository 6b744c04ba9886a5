"""Shared fixtures: a persistent test cache, the bundled tokenizer, tiny and real models; and
markers that tell the truth.

The cache survives test runs on one machine (preparing the real model takes about a minute);
CI on a fresh machine prepares everything once per run.

Markers: a test that asks for the real bundled model (any fixture in ``BUNDLED_FIXTURES``, even
through another fixture) is marked ``integration`` here, so a new test cannot forget it. A test
whose own run takes over ``SLOW_SECONDS`` without the ``slow`` marker is named at the end of the
run (timings on a loaded machine stretch: a list to read, not a failure).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import TEST_CACHE

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Engines keep responses in a SQLite file; the tests' go to one of their own, never the user's.
_STORE_DIR = tempfile.mkdtemp(prefix="nbr-test-store-")
atexit.register(shutil.rmtree, _STORE_DIR, ignore_errors=True)
os.environ.setdefault("NBRESPONSES_STORE", os.path.join(_STORE_DIR, "responses.sqlite3"))


BUNDLED_FIXTURES = frozenset({"bundled_model", "bundled_fp32", "bundled_analysis"})
SLOW_SECONDS = 5.0
_unmarked_slow: list[tuple[str, float]] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if BUNDLED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > SLOW_SECONDS and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _unmarked_slow:
        terminalreporter.section(f"over {SLOW_SECONDS:g} s without the slow marker")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda entry: -entry[1]):
            terminalreporter.write_line(f"{seconds:7.1f}s  {nodeid}")


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    TEST_CACHE.mkdir(parents=True, exist_ok=True)
    return TEST_CACHE


@pytest.fixture(scope="session")
def tokenizer_dir(cache_dir: Path) -> Path:
    """The bundled SmolLM2 tokenizer (repaired), cached: loads in well under a second."""
    from nbresponses.models.prepare import tokenizer_folder

    return tokenizer_folder(cache_dir=cache_dir)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_source(cache_dir: Path, tokenizer_dir: Path) -> Path:
    """A Hugging Face folder with a tiny random-weight Llama (seeded: always the same weights)."""
    from helpers.tiny_model import build_tiny_llama

    folder = cache_dir / "tiny-llama-src"
    if not (folder / "config.json").is_file():
        build_tiny_llama(folder, tokenizer_dir)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tiny_source: Path, cache_dir: Path):
    """The tiny model prepared with the fp32 recipe (exported by Optimum, ~1 s)."""
    from nbresponses.models.prepare import prepare_model

    return prepare_model(tiny_source, "fp32", cache_dir=cache_dir, progress=False)


@pytest.fixture(scope="session")
def tiny_fused(tiny_source: Path, cache_dir: Path):
    """The tiny model in the fused graph, fp32 (``fused-fp32``): batched rows on end-padded KV,
    exact multi-token steps (speculation), the lens."""
    from nbresponses.models.prepare import prepare_model

    return prepare_model(tiny_source, "fused-fp32", cache_dir=cache_dir, progress=False)


@pytest.fixture
async def fused_engine(tiny_fused, tokenizer):
    """An ``Engine`` on ``tiny_fused``, its store in memory: the scoring and server tests'."""
    from nbresponses.engine import Engine
    from nbresponses.runtime.generator import TokenGenerator

    engine = Engine(TokenGenerator(tiny_fused, tokenizer=tokenizer), store_path="memory")
    yield engine
    await engine.aclose()


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    """``helpers.engine.PROMPTS`` as chat prompts of the bundled tokenizer's template."""
    from helpers.engine import PROMPTS, chat_ids

    return [chat_ids(tokenizer, text) for text in PROMPTS]


@pytest.fixture(scope="session")
def bundled_model(cache_dir: Path):
    """The real bundled SmolLM2-135M-Instruct, prepared with the default recipe (cached)."""
    from nbresponses.models.prepare import prepare_model

    return prepare_model(None, cache_dir=cache_dir, progress=False)


@pytest.fixture(scope="session")
def bundled_fp32(cache_dir: Path):
    from nbresponses.models.prepare import prepare_model

    return prepare_model(None, "fp32", cache_dir=cache_dir, progress=False)


@pytest.fixture(scope="session")
def bundled_analysis(cache_dir: Path):
    """The bundled model with the analysis recipe (fp32 weights in the fused graph)."""
    from nbresponses.models.prepare import prepare_model

    return prepare_model(None, "analysis", cache_dir=cache_dir, progress=False)


@pytest.fixture(scope="session")
def grammar_tokenizer(tokenizer):
    """The bundled tokenizer as the grammar engine sees it (built once: ~1.5 s)."""
    from nbresponses.families.chat.family import ChatFamily

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return ChatFamily(tokenizer, eos_token_ids=[eos]).grammar_tokenizer()
