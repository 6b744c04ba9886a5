"""The bundled model's engine for the structured-output tests on the real model."""

from __future__ import annotations

import pytest

from nbresponses.engine import Engine
from nbresponses.runtime.generator import TokenGenerator


@pytest.fixture
async def engine(bundled_model):
    engine = Engine(TokenGenerator(bundled_model))
    yield engine
    await engine.aclose()
